import { LabIcon } from '@jupyterlab/ui-components';

/**
 * A memory module: a board with chips and contacts.
 */
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M2 6h20v10H2zm2 2v6h16V8z"/>
    <path d="M5 9h3v4H5zm5.5 0h3v4h-3zM16 9h3v4h-3z"/>
    <path d="M4 17h2v2H4zm3.5 0h2v2h-2zm3.5 0h2v2h-2zm3.5 0h2v2h-2zm3.5 0h2v2h-2z"/>
  </g>
</svg>`;

export const gpuMemIcon = new LabIcon({ name: 'jupyter-gpumem:icon', svgstr });

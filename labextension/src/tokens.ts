/**
 * What the extension's plugins share: the main plugin's id (its settings),
 * the command ids and the model's token. Its own module, so that the status
 * bar's plugin can require the model without importing index.ts.
 */
import { Token } from '@lumino/coreutils';

import type { GpuMemModel } from './model';

/** The panel's plugin; its settings are schema/plugin.json. */
export const PLUGIN_ID = 'jupyter-gpumem:plugin';

/**
 * Command ids.
 */
export namespace CommandIDs {
  export const open = 'jupyter-gpumem:open';
  export const emptyCache = 'jupyter-gpumem:empty-cache';
  export const toggleCaching = 'jupyter-gpumem:toggle-caching';
  export const resetPeak = 'jupyter-gpumem:reset-peak';
}

/**
 * The model of the panel, for other extensions (the status bar item, say).
 */
export const IGpuMemModel = new Token<GpuMemModel>(
  'jupyter-gpumem:IGpuMemModel',
  "The model of the GPU memory panel: the allocator state of the active notebook's kernel."
);

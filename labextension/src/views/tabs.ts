/**
 * The sections of the panel, as tabs. To add one: write its view in a folder
 * of its own under views/ (a component of `IViewProps`; its CSS in
 * style/<folder>.css) and add an entry to `TABS`. Each folder holds one tab's
 * files: overview/, history/, segments/, who/, onThisGpu/; frame/ is what
 * surrounds the tabs, common/ the pieces several tabs use, statusBar/ the
 * status bar's item. The tab strip
 * shows only once there is more than one. Only the selected tab's view is
 * mounted.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { History } from './history/historyTable';
import { OnThisGpu } from './onThisGpu/onThisGpu';
import { Overview } from './overview/overview';
import { IViewProps } from './props';
import { Segments } from './segments/segmentMap';
import { WhoHoldsIt } from './who/whoHoldsIt';

export interface ITab {
  /** Stable id, used in DOM ids and `data-tab`. */
  id: string;
  /** The tab's name, translated. */
  label: (trans: TranslationBundle) => string;
  /** What the tab shows between the kernel's message and the status line. */
  view: React.ComponentType<IViewProps>;
}

export const TABS: readonly ITab[] = [
  {
    id: 'overview',
    label: trans => trans.__('Overview'),
    view: Overview
  },
  {
    id: 'history',
    label: trans => trans.__('History'),
    view: History
  },
  {
    id: 'segments',
    label: trans => trans.__('Segments'),
    view: Segments
  },
  {
    id: 'who',
    label: trans => trans.__('Who holds it'),
    view: WhoHoldsIt
  },
  {
    id: 'gpu',
    label: trans => trans.__('On this GPU'),
    view: OnThisGpu
  }
];

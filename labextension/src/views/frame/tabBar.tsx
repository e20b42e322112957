/**
 * The strip of tabs at the top of the panel; none while there is one tab.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import type { ITab } from '../tabs';

/** DOM id of a tab's button. */
export function tabId(tab: ITab): string {
  return `jp-GpuMem-tab-${tab.id}`;
}

/** DOM id of a tab's panel. */
export function tabPanelId(tab: ITab): string {
  return `jp-GpuMem-tabPanel-${tab.id}`;
}

export function TabBar(props: {
  tabs: readonly ITab[];
  active: string;
  onSelect: (id: string) => void;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { tabs, active, onSelect, trans } = props;
  if (tabs.length < 2) {
    return null;
  }
  return (
    <div
      className="jp-GpuMem-tabs"
      role="tablist"
      aria-label={trans.__('GPU memory views')}
    >
      {tabs.map(tab => (
        <button
          key={tab.id}
          id={tabId(tab)}
          type="button"
          role="tab"
          className={
            tab.id === active ? 'jp-GpuMem-tab jp-mod-active' : 'jp-GpuMem-tab'
          }
          aria-selected={tab.id === active}
          aria-controls={tabPanelId(tab)}
          data-tab={tab.id}
          onClick={() => onSelect(tab.id)}
        >
          {tab.label(trans)}
        </button>
      ))}
    </div>
  );
}

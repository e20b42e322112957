/**
 * The sidebar panel: the widget, and the view that lays out its sections
 * (views/) for one state.
 */
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { gpuMemIcon } from '../views/frame/icon';
import { TRANSLATION_DOMAIN } from '../present/trans';
import { GpuMemModel } from '../model';
import { Header } from '../views/frame/header';
import { StatusMessage } from '../views/common/message';
import { IViewProps } from '../views/props';
import { StatusLine } from '../views/frame/statusLine';
import { TabBar, tabId, tabPanelId } from '../views/frame/tabBar';
import { ITab, TABS } from '../views/tabs';

export { TRANSLATION_DOMAIN };

/**
 * The whole panel for one state: the header, the kernel's message, the tab
 * strip, the selected tab (Overview, Who holds it) and the status line.
 */
export function GpuMemView(
  props: IViewProps & { tabs?: readonly ITab[] }
): JSX.Element {
  const { tabs = TABS, ...viewProps } = props;
  const { state, trans } = viewProps;
  const [selected, setSelected] = React.useState(tabs[0].id);
  const tab = tabs.find(t => t.id === selected) ?? tabs[0];
  const content = <tab.view {...viewProps} />;
  return (
    <div className="jp-GpuMem-body" data-state={state.status.kind}>
      <Header {...viewProps} />
      <StatusMessage {...viewProps} />
      <TabBar
        tabs={tabs}
        active={tab.id}
        onSelect={setSelected}
        trans={trans}
      />
      {tabs.length < 2 ? (
        content
      ) : (
        <div
          id={tabPanelId(tab)}
          className="jp-GpuMem-tabPanel"
          role="tabpanel"
          aria-labelledby={tabId(tab)}
          data-tab={tab.id}
        >
          {content}
        </div>
      )}
      <StatusLine {...viewProps} />
    </div>
  );
}

/**
 * The sidebar widget. The model streams only while this is visible.
 */
export class GpuMemPanel extends ReactWidget {
  constructor(options: GpuMemPanel.IOptions) {
    super();
    this._model = options.model;
    this._trans = (options.translator ?? nullTranslator).load(
      TRANSLATION_DOMAIN
    );
    this.id = 'jp-GpuMem-panel';
    this.addClass('jp-GpuMem-panel');
    this.title.icon = gpuMemIcon;
    // Title case, as JupyterLab's sidebar captions; Notebook 7 also lists
    // "Show <caption>" in its palette, which then reads as our command does.
    this.title.caption = this._trans.__('GPU Memory');
  }

  get model(): GpuMemModel {
    return this._model;
  }

  protected render(): JSX.Element {
    return (
      <UseSignal
        signal={this._model.stateChanged}
        initialArgs={this._model.state}
      >
        {(_, state) => (
          <GpuMemView
            model={this._model}
            state={state ?? this._model.state}
            trans={this._trans}
          />
        )}
      </UseSignal>
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.setVisible(true);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.setVisible(false);
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._model.setVisible(this.isVisible);
  }

  protected onBeforeDetach(msg: Message): void {
    this._model.setVisible(false);
    super.onBeforeDetach(msg);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.setVisible(false);
    super.dispose();
  }

  private _model: GpuMemModel;
  private _trans: TranslationBundle;
}

export namespace GpuMemPanel {
  export interface IOptions {
    model: GpuMemModel;
    translator?: ITranslator;
  }
}

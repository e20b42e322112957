/**
 * The status bar item: the figures of the followed kernel's busiest GPU at a
 * glance, from the panel's model (views/statusBar/statusItem.tsx draws them). The
 * `statusBar` setting of the panel hides it. Notebook 7 has no status bar:
 * then this plugin does nothing.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';
import { ReactWidget } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';
import * as React from 'react';

import { GpuMemModel } from '../model';
import { IStatusSummary, statusSummary } from '../present/statusSummary';
import { IGpuMemState } from '../state';
import { CommandIDs, IGpuMemModel, PLUGIN_ID } from '../tokens';
import { StatusItem } from '../views/statusBar/statusItem';
import { DEFAULT_SETTINGS, readSettings } from '../settings';
import { TRANSLATION_DOMAIN } from '../present/trans';

/**
 * How often the item reads a sample while the panel is hidden, ms. With the
 * panel shown its stream feeds the item; kernel/glance.ts says what a
 * reading costs the kernel.
 */
export const STATUS_GLANCE_MS = 5000;

/**
 * The item's widget: draws the summary of each new state, and says when it
 * has something to show (`activeChanged`).
 */
export class GpuMemStatusItem extends ReactWidget {
  constructor(options: GpuMemStatusItem.IOptions) {
    super();
    this._model = options.model;
    this._trans = options.trans;
    this._open = options.open;
    this.addClass('jp-GpuMem-status');
    this.addClass('jp-mod-highlighted');
    this._summary = statusSummary(this._model.state, this._trans);
    this._model.stateChanged.connect(this._onState, this);
  }

  /** What the item shows; null: nothing. */
  get summary(): IStatusSummary | null {
    return this._summary;
  }

  /** Emitted when the item starts or stops having something to show. */
  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    Signal.clearData(this);
    super.dispose();
  }

  protected render(): JSX.Element | null {
    const summary = this._summary;
    return summary ? (
      <StatusItem summary={summary} onOpen={this._open} />
    ) : null;
  }

  private _onState(_: GpuMemModel, state: IGpuMemState): void {
    const before = this._summary;
    const next = statusSummary(state, this._trans);
    if (
      before !== null &&
      next !== null &&
      before.text === next.text &&
      before.tooltip === next.tooltip &&
      before.near === next.near
    ) {
      // Samples come every few hundred ms: redraw only what changed.
      return;
    }
    this._summary = next;
    this.update();
    if ((before === null) !== (next === null)) {
      this._activeChanged.emit();
    }
  }

  private _model: GpuMemModel;
  private _trans: TranslationBundle;
  private _open: () => void;
  private _summary: IStatusSummary | null;
  private _activeChanged = new Signal<this, void>(this);
}

export namespace GpuMemStatusItem {
  export interface IOptions {
    model: GpuMemModel;
    trans: TranslationBundle;
    /** Open (or reveal) the panel. */
    open: () => void;
  }
}

/**
 * The status bar item of the GPU memory panel.
 */
export const statusBarPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpumem:status-bar',
  description:
    "Shows allocated / reserved of the active kernel's busiest GPU in the status bar.",
  autoStart: true,
  requires: [IGpuMemModel],
  optional: [IStatusBar, ISettingRegistry, ITranslator],
  activate: (
    app: JupyterFrontEnd,
    model: GpuMemModel,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null
  ): void => {
    if (!statusBar) {
      return;
    }
    const trans = (translator ?? nullTranslator).load(TRANSLATION_DOMAIN);
    const item = new GpuMemStatusItem({
      model,
      trans,
      open: () => void app.commands.execute(CommandIDs.open)
    });
    let enabled = DEFAULT_SETTINGS.statusBar;
    const changed = new Signal<GpuMemStatusItem, void>(item);
    item.activeChanged.connect(() => changed.emit());
    statusBar.registerStatusItem('jupyter-gpumem:status', {
      item,
      align: 'left',
      rank: 3,
      isActive: () => enabled && item.summary !== null,
      activeStateChanged: changed
    });
    const enable = (on: boolean) => {
      enabled = on;
      model.setGlance(on ? STATUS_GLANCE_MS : null);
      changed.emit();
    };
    if (!settingRegistry) {
      enable(enabled);
      return;
    }
    // Nothing is read before the settings say whether to show the item.
    Promise.all([settingRegistry.load(PLUGIN_ID), app.restored])
      .then(([settings]) => {
        enable(readSettings(settings).statusBar);
        settings.changed.connect(() =>
          enable(readSettings(settings).statusBar)
        );
      })
      .catch(reason => {
        console.error('jupyter-gpumem: cannot load the settings', reason);
        enable(enabled);
      });
  }
};

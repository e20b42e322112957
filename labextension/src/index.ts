/**
 * jupyter-gpumem: a JupyterLab panel showing what PyTorch's GPU caching
 * allocator does in the kernel of the active notebook or console.
 */
import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { notebookCellScroller } from './lab/cellScroller';
import { ActiveKernelFollower, ITrackerLike } from './kernel/follower';
import { availability } from './present/messages';
import { GpuMemModel } from './model';
import { GpuMemPanel, TRANSLATION_DOMAIN } from './lab/panel';
import { IConfirmation, serverApi } from './server/serverApi';
import { readSettings } from './settings';
import { statusBarPlugin } from './lab/statusBar';
import { CommandIDs, IGpuMemModel, PLUGIN_ID } from './tokens';

export { formatBytes } from './present/format';
export { parseCap } from './present/cap';
export { GpuMemModel } from './model';
export type { IGpuMemState } from './state';

export { CommandIDs, IGpuMemModel } from './tokens';

/**
 * Notebook 7's command that shows a sidebar panel: its palette lists every
 * sidebar panel with it ("Show <caption>").
 */
const NOTEBOOK_SHOW_PANEL = 'application:toggle-panel';

/**
 * The GPU memory sidebar panel, its model and its commands.
 */
const plugin: JupyterFrontEndPlugin<GpuMemModel> = {
  id: PLUGIN_ID,
  description:
    "Shows PyTorch's GPU caching allocator of the active kernel in the right sidebar.",
  autoStart: true,
  provides: IGpuMemModel,
  optional: [
    ILabShell,
    INotebookTracker,
    IConsoleTracker,
    ISettingRegistry,
    ITranslator,
    ICommandPalette,
    ILayoutRestorer
  ],
  activate: (
    app: JupyterFrontEnd,
    labShell: ILabShell | null,
    notebookTracker: INotebookTracker | null,
    consoleTracker: IConsoleTracker | null,
    settingRegistry: ISettingRegistry | null,
    translator: ITranslator | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ): GpuMemModel => {
    const trans = (translator ?? nullTranslator).load(TRANSLATION_DOMAIN);
    const model = new GpuMemModel({
      server: serverApi(app.serviceManager, confirm)
    });
    if (notebookTracker) {
      model.setCellScroller(
        notebookCellScroller(notebookTracker, () => model.state.kernelId)
      );
    }
    const panel = new GpuMemPanel({
      model,
      translator: translator ?? undefined
    });
    app.shell.add(panel, 'right', { rank: 600 });
    if (restorer) {
      restorer.add(panel, 'jupyter-gpumem');
    }

    const follower = new ActiveKernelFollower({
      model,
      shell: labShell,
      trackers: [
        notebookTracker as unknown as ITrackerLike | null,
        consoleTracker as unknown as ITrackerLike | null
      ]
    });
    panel.disposed.connect(() => {
      follower.dispose();
      model.dispose();
    });

    if (settingRegistry) {
      Promise.all([settingRegistry.load(PLUGIN_ID), app.restored])
        .then(([settings]) => {
          model.configure(readSettings(settings));
          settings.changed.connect(() =>
            model.configure(readSettings(settings))
          );
        })
        .catch(reason => {
          console.error('jupyter-gpumem: cannot load the settings', reason);
        });
    }

    const { commands } = app;
    const category = trans.__('GPU memory');
    // Samples arrive every few hundred ms: refresh commands only when their
    // availability can have changed.
    let commandKey = '';
    model.stateChanged.connect((_, state) => {
      const key = JSON.stringify([
        state.status.kind,
        state.process.pending,
        state.actions,
        state.process.sample?.caching,
        state.process.sample?.devices.map(d => d.initialized)
      ]);
      if (key !== commandKey) {
        commandKey = key;
        commands.notifyCommandChanged();
      }
    });

    commands.addCommand(CommandIDs.open, {
      label: trans.__('Show GPU Memory'),
      caption: trans.__(
        "Show the GPU memory panel of the active notebook's kernel"
      ),
      icon: args => (args.isPalette ? undefined : panel.title.icon),
      execute: () => {
        app.shell.activateById(panel.id);
      }
    });
    commands.addCommand(CommandIDs.emptyCache, {
      label: trans.__('Empty GPU Cache'),
      caption: trans.__(
        'Release cached free blocks of the kernel to the driver'
      ),
      isEnabled: () => availability(model.state, 'empty_cache', trans).enabled,
      execute: () => model.emptyCache()
    });
    commands.addCommand(CommandIDs.toggleCaching, {
      label: trans.__('GPU Caching Allocator'),
      caption: trans.__(
        "Switch PyTorch's caching allocator on or off in the kernel"
      ),
      isEnabled: () => availability(model.state, 'set_caching', trans).enabled,
      isToggled: () => model.state.process.sample?.caching === true,
      execute: () =>
        model.setCaching(model.state.process.sample?.caching === false)
    });
    commands.addCommand(CommandIDs.resetPeak, {
      label: trans.__('Reset GPU Memory Peak'),
      caption: trans.__(
        'Set the peak counters of the kernel to the current figures'
      ),
      isEnabled: () => availability(model.state, 'reset_peak', trans).enabled,
      execute: () => model.resetPeak()
    });

    if (palette) {
      for (const command of [
        CommandIDs.emptyCache,
        CommandIDs.toggleCaching,
        CommandIDs.resetPeak
      ]) {
        palette.addItem({ command, category });
      }
      // Once every plugin is active: in Notebook 7 its own entry for the
      // sidebar panel ("Show GPU Memory") would show beside ours.
      void app.restored.then(() => {
        if (!commands.hasCommand(NOTEBOOK_SHOW_PANEL)) {
          palette.addItem({ command: CommandIDs.open, category });
        }
      });
    }
    return model;
  }
};

/** A yes/no question in JupyterLab's own dialog. */
async function confirm(question: IConfirmation): Promise<boolean> {
  const result = await showDialog({
    title: question.title,
    body: question.body,
    buttons: [
      Dialog.cancelButton(),
      Dialog.okButton({ label: question.accept })
    ]
  });
  return result.button.accept;
}

export default [plugin, statusBarPlugin];

/**
 * Which notebook or console the panel shows: the active one, as the lab shell
 * and the notebook and console trackers tell.
 */
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IKernelSource, ISessionLike } from './types';

/**
 * A notebook or console panel, as far as following its kernel goes.
 */
export interface IKernelWidget {
  readonly title: {
    readonly label: string;
    readonly changed: ISignal<any, any>;
  };
  readonly sessionContext: ISessionLike;
  readonly isDisposed: boolean;
  readonly disposed: ISignal<any, any>;
}

/**
 * The part of a widget tracker the follower uses.
 */
export interface ITrackerLike {
  readonly currentWidget: IKernelWidget | null;
  readonly currentChanged: ISignal<any, any>;
  has(widget: any): boolean;
}

/**
 * The part of the lab shell the follower uses.
 */
export interface IShellLike {
  readonly currentWidget: unknown;
  readonly currentChanged: ISignal<any, any>;
}

/**
 * The part of the model the follower uses.
 */
export interface IModelLike {
  setSource(source: IKernelSource | null): void;
}

/**
 * Points the model at the active notebook or console. A focused widget without
 * a kernel (an editor, the launcher) keeps the last one followed, so that the
 * panel stays useful next to a file; closing it falls back to the trackers.
 */
export class ActiveKernelFollower implements IDisposable {
  constructor(options: ActiveKernelFollower.IOptions) {
    this._model = options.model;
    this._shell = options.shell ?? null;
    this._trackers = options.trackers.filter(
      (tracker): tracker is ITrackerLike => !!tracker
    );
    if (this._shell) {
      this._shell.currentChanged.connect(this._onChanged, this);
    }
    for (const tracker of this._trackers) {
      tracker.currentChanged.connect(this._onChanged, this);
    }
    this._onChanged();
  }

  get widget(): IKernelWidget | null {
    return this._widget;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._follow(null);
    Signal.disconnectReceiver(this);
  }

  private _tracked(widget: unknown): IKernelWidget | null {
    for (const tracker of this._trackers) {
      if (widget && tracker.has(widget)) {
        return widget as IKernelWidget;
      }
    }
    return null;
  }

  private _fallback(): IKernelWidget | null {
    for (const tracker of this._trackers) {
      const widget = tracker.currentWidget;
      if (widget && !widget.isDisposed) {
        return widget;
      }
    }
    return null;
  }

  private _onChanged(): void {
    if (this._isDisposed) {
      return;
    }
    const active = this._shell
      ? this._tracked(this._shell.currentWidget)
      : null;
    if (active) {
      this._follow(active);
      return;
    }
    if (this._widget && !this._widget.isDisposed) {
      return;
    }
    this._follow(this._fallback());
  }

  private _follow(widget: IKernelWidget | null): void {
    if (widget === this._widget) {
      return;
    }
    if (this._widget) {
      this._widget.disposed.disconnect(this._onDisposed, this);
      this._widget.title.changed.disconnect(this._onTitle, this);
    }
    this._widget = widget;
    if (widget) {
      widget.disposed.connect(this._onDisposed, this);
      widget.title.changed.connect(this._onTitle, this);
      this._model.setSource({
        label: widget.title.label,
        sessionContext: widget.sessionContext
      });
    } else {
      this._model.setSource(null);
    }
  }

  private _onDisposed(): void {
    this._follow(null);
    this._onChanged();
  }

  private _onTitle(): void {
    if (this._widget) {
      this._model.setSource({
        label: this._widget.title.label,
        sessionContext: this._widget.sessionContext
      });
    }
  }

  private _model: IModelLike;
  private _shell: IShellLike | null;
  private _trackers: ITrackerLike[];
  private _widget: IKernelWidget | null = null;
  private _isDisposed = false;
}

export namespace ActiveKernelFollower {
  export interface IOptions {
    model: IModelLike;
    shell?: IShellLike | null;
    trackers: (ITrackerLike | null | undefined)[];
  }
}

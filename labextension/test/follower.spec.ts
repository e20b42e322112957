import { Signal } from '@lumino/signaling';
import { describe, expect, it } from 'vitest';

import { ActiveKernelFollower, ITrackerLike } from '../src/kernel/follower';
import { IKernelSource } from '../src/kernel/types';
import { FakeKernel, FakeSession } from './fakes';

class FakeWidget {
  constructor(label: string) {
    this.title = { label, changed: new Signal<any, any>(this) };
  }
  title: { label: string; changed: Signal<any, any> };
  sessionContext = new FakeSession(new FakeKernel()) as any;
  isDisposed = false;
  disposed = new Signal<any, any>(this);

  rename(label: string): void {
    this.title.label = label;
    this.title.changed.emit(undefined);
  }

  dispose(): void {
    this.isDisposed = true;
    this.disposed.emit(undefined);
  }
}

/** As JupyterLab's trackers: forgets a widget once it is disposed. */
class FakeTracker implements ITrackerLike {
  constructor(readonly widgets: FakeWidget[] = []) {
    for (const widget of widgets) {
      widget.disposed.connect(() => {
        this.widgets.splice(this.widgets.indexOf(widget), 1);
        if (this.currentWidget === widget) {
          this.currentWidget = null;
        }
      });
    }
  }
  currentWidget: FakeWidget | null = null;
  currentChanged = new Signal<any, any>(this);
  has(widget: any): boolean {
    return this.widgets.includes(widget);
  }
  focus(widget: FakeWidget | null): void {
    this.currentWidget = widget;
    this.currentChanged.emit(widget);
  }
}

class FakeShell {
  currentWidget: unknown = null;
  currentChanged = new Signal<any, any>(this);
  activate(widget: unknown): void {
    this.currentWidget = widget;
    this.currentChanged.emit(undefined);
  }
}

/** Records what the follower points the model at. */
function recorder() {
  const sources: (IKernelSource | null)[] = [];
  return {
    sources,
    model: {
      setSource: (source: IKernelSource | null) => sources.push(source)
    },
    get last() {
      return sources[sources.length - 1];
    }
  };
}

describe('ActiveKernelFollower', () => {
  it('follows the active notebook, with its name', () => {
    const a = new FakeWidget('a.ipynb');
    const b = new FakeWidget('b.ipynb');
    const notebooks = new FakeTracker([a, b]);
    const shell = new FakeShell();
    const rec = recorder();
    const follower = new ActiveKernelFollower({
      model: rec.model,
      shell,
      trackers: [notebooks, null]
    });
    expect(rec.sources).toEqual([]);
    expect(follower.widget).toBeNull();
    shell.activate(a);
    expect(follower.widget).toBe(a);
    expect(rec.last).toEqual({
      label: 'a.ipynb',
      sessionContext: a.sessionContext
    });
    shell.activate(b);
    expect(rec.last?.label).toBe('b.ipynb');
    b.rename('c.ipynb');
    expect(rec.last).toEqual({
      label: 'c.ipynb',
      sessionContext: b.sessionContext
    });
  });

  it('keeps the last notebook while a widget without kernel has the focus', () => {
    const a = new FakeWidget('a.ipynb');
    const shell = new FakeShell();
    const rec = recorder();
    const follower = new ActiveKernelFollower({
      model: rec.model,
      shell,
      trackers: [new FakeTracker([a])]
    });
    shell.activate(a);
    const count = rec.sources.length;
    shell.activate({ editor: true });
    expect(follower.widget).toBe(a);
    expect(rec.sources).toHaveLength(count);
  });

  it('falls back to the trackers when the followed one closes', () => {
    const a = new FakeWidget('a.ipynb');
    const console = new FakeWidget('Console 1');
    const notebooks = new FakeTracker([a]);
    const consoles = new FakeTracker([console]);
    consoles.currentWidget = console;
    const shell = new FakeShell();
    const rec = recorder();
    const follower = new ActiveKernelFollower({
      model: rec.model,
      shell,
      trackers: [notebooks, consoles]
    });
    // Nothing active in the shell: the trackers' current widget.
    expect(follower.widget).toBe(console);
    shell.activate(a);
    expect(follower.widget).toBe(a);
    a.dispose();
    expect(follower.widget).toBe(console);
    expect(rec.last?.label).toBe('Console 1');
    console.dispose();
    expect(follower.widget).toBeNull();
    expect(rec.last).toBeNull();
  });

  it('works without a shell, from the trackers alone', () => {
    const a = new FakeWidget('a.ipynb');
    const notebooks = new FakeTracker([a]);
    const rec = recorder();
    const follower = new ActiveKernelFollower({
      model: rec.model,
      trackers: [notebooks]
    });
    expect(follower.widget).toBeNull();
    notebooks.focus(a);
    expect(follower.widget).toBe(a);
    expect(rec.last?.label).toBe('a.ipynb');
  });

  it('lets go of everything when disposed', () => {
    const a = new FakeWidget('a.ipynb');
    const shell = new FakeShell();
    const rec = recorder();
    const follower = new ActiveKernelFollower({
      model: rec.model,
      shell,
      trackers: [new FakeTracker([a])]
    });
    shell.activate(a);
    follower.dispose();
    expect(follower.isDisposed).toBe(true);
    expect(rec.last).toBeNull();
    const count = rec.sources.length;
    a.rename('b.ipynb');
    shell.activate(a);
    expect(rec.sources).toHaveLength(count);
  });
});

/**
 * Scrolls the followed notebook to the cell of an execution count: what a
 * trend marker or a History row does when clicked.
 */
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import type { CellScroller } from '../model';

/** The part of a notebook's cell the scroller reads. */
export interface ICellLike {
  model: { type: string; executionCount?: number | null };
}

/**
 * Index of the cell that ran with `executionCount`: the last one when several
 * (a copied cell keeps its number), -1 when none.
 */
export function findCell(
  cells: readonly ICellLike[],
  executionCount: number
): number {
  for (let i = cells.length - 1; i >= 0; i--) {
    const model = cells[i].model;
    if (model.type === 'code' && model.executionCount === executionCount) {
      return i;
    }
  }
  return -1;
}

/**
 * A scroller over the notebooks of `tracker`: it looks in the notebook whose
 * kernel the panel follows (`kernelId()`), the current one first.
 */
export function notebookCellScroller(
  tracker: INotebookTracker,
  kernelId: () => string | null
): CellScroller {
  return async (executionCount: number) => {
    const id = kernelId();
    if (id === null) {
      return false;
    }
    const matches = (panel: NotebookPanel) =>
      panel.sessionContext.session?.kernel?.id === id;
    const current = tracker.currentWidget;
    const panel = current && matches(current) ? current : tracker.find(matches);
    if (!panel) {
      return false;
    }
    const notebook = panel.content;
    const index = findCell(
      notebook.widgets as unknown as ICellLike[],
      executionCount
    );
    if (index < 0) {
      return false;
    }
    // Selects the cell and scrolls it into view (also in a windowed notebook).
    await notebook.scrollToCell(notebook.widgets[index], 'center');
    notebook.activeCellIndex = index;
    return true;
  };
}

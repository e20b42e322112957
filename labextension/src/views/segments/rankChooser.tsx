/**
 * The Segments tab's process chooser: this kernel's own segment map, or that
 * of a live worker process of the latest sample (forked or spawned ranks,
 * docs/workers.md). The kernel asks the worker for its own snapshot; the
 * worker has 2 s to answer.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { IWorker } from '../../protocol';
import { IGpuMemState, ISegmentsSource } from '../../state';
import { IViewProps } from '../props';

/** The protocol revision whose `segments` takes `rank` and `pid`. */
export const RANK_REVISION = 12;

/** One entry of the chooser. */
export interface ISegmentsChoice {
  /** The option's value: `kernel`, or the worker's pid. */
  key: string;
  label: string;
  /** What is read when chosen; null: the kernel's own map. */
  source: ISegmentsSource | null;
}

/** The worker in the user's words: `rank 1 (pid 4242)`. */
export function workerWords(
  rank: number | null,
  pid: number,
  trans: TranslationBundle,
  host = ''
): string {
  const who = rank === null ? trans.__('worker') : trans.__('rank %1', rank);
  return host
    ? trans.__('%1 (pid %2 on %3)', who, pid, host)
    : trans.__('%1 (pid %2)', who, pid);
}

function live(state: IGpuMemState): IWorker[] {
  return (state.process.sample?.workers ?? [])
    .filter(w => w.status === 'running')
    .sort(
      (a, b) =>
        (a.rank ?? Number.MAX_SAFE_INTEGER) -
          (b.rank ?? Number.MAX_SAFE_INTEGER) || a.pid - b.pid
    );
}

/**
 * This kernel, each live worker of the latest sample (their host named when
 * they run on more than one), and the chosen worker when it is no longer live.
 */
export function segmentsChoices(
  state: IGpuMemState,
  trans: TranslationBundle
): ISegmentsChoice[] {
  const workers = live(state);
  const hosts = new Set(workers.map(w => w.host));
  const choices: ISegmentsChoice[] = [
    { key: 'kernel', label: trans.__('This kernel'), source: null }
  ];
  for (const w of workers) {
    choices.push({
      key: String(w.pid),
      label: workerWords(w.rank, w.pid, trans, hosts.size > 1 ? w.host : ''),
      source: { pid: w.pid, rank: w.rank }
    });
  }
  const chosen = state.process.segmentsSource;
  if (chosen !== null && !workers.some(w => w.pid === chosen.pid)) {
    choices.push({
      key: String(chosen.pid),
      label: trans.__(
        '%1, not running',
        workerWords(chosen.rank, chosen.pid, trans)
      ),
      source: chosen
    });
  }
  return choices;
}

/**
 * The chooser; nothing when there is nothing to choose (no live worker) or
 * the kernel's jupyter_gpumem cannot ask its workers.
 */
export function RankChooser(props: IViewProps): JSX.Element | null {
  const { model, state, trans } = props;
  if (state.revision === null || state.revision < RANK_REVISION) {
    return null;
  }
  const choices = segmentsChoices(state, trans);
  if (choices.length < 2) {
    return null;
  }
  const chosen = state.process.segmentsSource;
  return (
    <label className="jp-GpuMem-rankChooser">
      <span>{trans.__('Process')}</span>
      <select
        className="jp-mod-styled"
        value={chosen === null ? 'kernel' : String(chosen.pid)}
        aria-label={trans.__('Whose segment map to show')}
        title={trans.__(
          "This kernel's allocator, or a worker process's own (asked for its snapshot: it has 2 s to answer)"
        )}
        onChange={event => {
          const choice = choices.find(c => c.key === event.target.value);
          void model.setSegmentsSource(choice ? choice.source : null);
        }}
      >
        {choices.map(c => (
          <option key={c.key} value={c.key}>
            {c.label}
          </option>
        ))}
      </select>
    </label>
  );
}

/**
 * The Overview's worker processes: each worker of the notebook (forked or
 * spawned by a measured cell, or a rank of the kernel's torch.distributed
 * group) with its own allocator's figures per device, as it last reported
 * them (docs/workers.md).
 */
import * as React from 'react';

import { formatBytes } from '../../present/format';
import { ISample, IWorker } from '../../protocol';
import { IViewProps } from '../props';

/** `rank 1 (pid 4242)`, or `worker (pid 4242)` without a rank. */
export function workerLabel(w: IWorker, trans: IViewProps['trans']): string {
  return w.rank === null
    ? trans.__('worker (pid %1)', w.pid)
    : trans.__('rank %1 (pid %2)', w.rank, w.pid);
}

export function workerStatus(w: IWorker, trans: IViewProps['trans']): string {
  switch (w.status) {
    case 'exited':
      return trans.__('exited');
    case 'running':
      return w.age >= 5
        ? trans.__('running; last report %1 s ago', Math.round(w.age))
        : trans.__('running');
    case 'silent':
      return trans.__('stopped reporting (killed or hung)');
  }
}

/** Workers first by rank, then by pid (the kernel's order, kept). */
export function WorkersSection(
  props: IViewProps & { sample: ISample }
): JSX.Element | null {
  const { trans, sample } = props;
  const workers = Array.isArray(sample.workers) ? sample.workers : [];
  if (workers.length === 0) {
    return null;
  }
  // A list, not a table: the sidebar is narrow. One entry per worker device.
  return (
    <section
      className="jp-GpuMem-workers"
      aria-label={trans.__('Worker processes')}
    >
      <h3
        className="jp-GpuMem-deviceTitle"
        title={trans.__(
          "Processes this notebook started, each with its own allocator's figures as it last reported them"
        )}
      >
        {trans.__('Worker processes')}
      </h3>
      <ul className="jp-GpuMem-workerList">
        {workers.flatMap(w =>
          (w.devices.length ? w.devices : [null]).map(d => (
            <li
              key={`${w.host}:${w.pid}:${d?.index ?? '-'}`}
              data-status={w.status}
              data-pid={w.pid}
              title={w.host}
            >
              <div className="jp-GpuMem-workerName">
                {workerLabel(w, trans)}
                {d ? ` · cuda:${d.index}` : ''}
              </div>
              <div className="jp-GpuMem-workerFigures">
                {d
                  ? [
                      trans.__('allocated %1', formatBytes(d.allocated)),
                      w.started_in_cell
                        ? trans.__('peak %1', formatBytes(d.peak_allocated))
                        : trans.__(
                            'peak %1 (since it started)',
                            formatBytes(d.peak_allocated)
                          ),
                      trans.__('reserved %1', formatBytes(d.reserved))
                    ].map((figure, i) => (
                      // A figure never wraps inside: "1.00" above "GiB".
                      <React.Fragment key={i}>
                        {i > 0 && ' · '}
                        <span className="jp-GpuMem-workerFigure">{figure}</span>
                      </React.Fragment>
                    ))
                  : trans.__('no GPU memory')}
              </div>
              <div className="jp-GpuMem-workerStatus">
                {workerStatus(w, trans)}
                {d && d.ooms > 0
                  ? ` · ${trans._n('%1 OOM', '%1 OOMs', d.ooms)}`
                  : ''}
              </div>
            </li>
          ))
        )}
      </ul>
    </section>
  );
}

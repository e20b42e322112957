/**
 * One `who` report of a device as a compact table: a row per owner or line
 * with its share of the allocated bytes as a small bar, then how much the
 * names explain and the kernel's notes. By variable, with a kernel that
 * frees, each owner gets a *Free* button and its preview opens under its row.
 * Every string the kernel sends is rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatPercent, formatSize } from '../../present/format';
import { IWhoReport, IWhoRow } from '../../protocol';
import { FreeOrigin } from '../../state';
import { IViewProps } from '../props';
import { canFree, freeAt, FreeButton, FreePanel } from './freePreview';

/** Prefix of the owners a kept traceback holds (`traceback: frame: name`). */
export const TRACEBACK_PREFIX = 'traceback:';

/**
 * The rows a Free can start from: the first row of each owner (one name can
 * have several: parameters, then gradients) that is a name the kernel can
 * free (a kept traceback's locals are released with *Release traceback*).
 */
function freeable(rows: readonly IWhoRow[]): Set<number> {
  const seen = new Set<string>();
  const out = new Set<number>();
  rows.forEach((row, i) => {
    if (
      row.kind === 'owner' &&
      !row.key.startsWith(TRACEBACK_PREFIX) &&
      !seen.has(row.key)
    ) {
      seen.add(row.key);
      out.add(i);
    }
  });
  return out;
}

export function WhoTable(props: {
  report: IWhoReport;
  trans: TranslationBundle;
  /** Given: owners get *Free* (by variable, when the kernel offers it). */
  free?: IViewProps;
}): JSX.Element {
  const { report, trans } = props;
  const byLine = report.by === 'line';
  const free =
    !byLine && props.free && canFree(props.free.state) ? props.free : null;
  const title = byLine ? trans.__('Lines') : trans.__('Owners');
  const allocated = report.allocated;
  const share = (bytes: number) =>
    allocated > 0 ? Math.min(1, Math.max(0, bytes / allocated)) : 0;
  const starts = free ? freeable(report.rows) : new Set<number>();
  const origin = (row: IWhoRow): FreeOrigin => ({
    kind: 'owner',
    device: report.device,
    key: row.key
  });
  // A Free whose row went (what it freed left the table): shown above it.
  const open = free?.state.process.free ?? null;
  const openKey =
    open !== null &&
    open.origin.kind === 'owner' &&
    open.origin.device === report.device
      ? open.origin.key
      : null;
  const orphan =
    openKey !== null &&
    !report.rows.some((r, i) => starts.has(i) && r.key === openKey);
  return (
    <div className="jp-GpuMem-whoReport" data-by={report.by}>
      {free && open && orphan && <FreePanel {...free} free={open} />}
      <table className="jp-GpuMem-whoTable" data-by={report.by}>
        <caption className="jp-GpuMem-whoCaption">{title}</caption>
        <thead>
          <tr>
            <th scope="col">{byLine ? trans.__('Line') : trans.__('Name')}</th>
            <th scope="col" className="jp-GpuMem-whoBytes">
              {trans.__('Size')}
            </th>
          </tr>
        </thead>
        <tbody>
          {report.rows.map((row, i) => {
            const here =
              free && starts.has(i) ? freeAt(free.state, origin(row)) : null;
            return (
              <React.Fragment key={`${i}-${row.key}`}>
                <tr
                  className={`jp-GpuMem-whoRow jp-GpuMem-whoRow-${row.kind}`}
                  data-key={row.key}
                  data-kind={row.kind}
                  data-bytes={row.bytes}
                >
                  <td className="jp-GpuMem-whoName">
                    {free && starts.has(i) && (
                      <FreeButton
                        {...free}
                        names={[row.key]}
                        origin={origin(row)}
                      />
                    )}
                    <span className="jp-GpuMem-whoKey">{row.key}</span>
                    {row.detail !== '' && (
                      <span className="jp-GpuMem-whoDetail">{row.detail}</span>
                    )}
                    {!byLine && row.site && (
                      <span className="jp-GpuMem-whoSite">
                        {trans.__('allocated at %1', row.site)}
                      </span>
                    )}
                    {row.example !== '' && row.example !== row.key && (
                      <span className="jp-GpuMem-whoExample">
                        {byLine
                          ? row.example
                          : trans.__('e.g. %1', row.example)}
                      </span>
                    )}
                    <span className="jp-GpuMem-share" aria-hidden="true">
                      <span
                        className="jp-GpuMem-shareFill"
                        style={{
                          width: `${(share(row.bytes) * 100).toFixed(2)}%`
                        }}
                      />
                    </span>
                  </td>
                  <td
                    className="jp-GpuMem-whoBytes"
                    title={trans._n(
                      '%2 of allocated, %1 block',
                      '%2 of allocated, %1 blocks',
                      row.blocks,
                      formatPercent(share(row.bytes))
                    )}
                  >
                    {formatSize(row.bytes)}
                  </td>
                </tr>
                {free && here && (
                  <tr className="jp-GpuMem-freeRow" data-key={row.key}>
                    <td colSpan={2}>
                      <FreePanel {...free} free={here} />
                    </td>
                  </tr>
                )}
              </React.Fragment>
            );
          })}
        </tbody>
      </table>
      <p className="jp-GpuMem-whoExplained">{explainedText(report, trans)}</p>
      {report.outside_allocator > 0 && (
        <p className="jp-GpuMem-whoNote">
          {trans.__(
            "%1 more is outside PyTorch's allocator",
            formatSize(report.outside_allocator)
          )}
        </p>
      )}
      {report.notes.length > 0 && (
        <ul className="jp-GpuMem-whoNotes">
          {report.notes.map((note, i) => (
            <li key={i}>{note}</li>
          ))}
        </ul>
      )}
    </div>
  );
}

function explainedText(report: IWhoReport, trans: TranslationBundle): string {
  const allocated = report.allocated;
  if (allocated <= 0) {
    return trans.__('Nothing is allocated on this device.');
  }
  const explained = formatSize(report.explained);
  const total = formatSize(allocated);
  const percent = formatPercent(report.explained / allocated);
  return report.by === 'line'
    ? trans.__('lines explain %1 of %2 (%3)', explained, total, percent)
    : trans.__('names explain %1 of %2 (%3)', explained, total, percent);
}

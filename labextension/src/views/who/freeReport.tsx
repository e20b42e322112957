/**
 * A Free's report (`%gpumem free`'s record): the plan of its preview (what
 * will be let go, what is left as it is, what should come back to the
 * driver) and, once done, what came back and what still holds the rest.
 * Every string the kernel sends is rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { cameBackText, expectedText, heldText } from '../../present/free';
import { formatSize } from '../../present/format';
import { IFreeHolder, IFreeReport } from '../../protocol';

/** The plan: held, let go, left as they are, expected back, notes. */
export function FreePlan(props: {
  report: IFreeReport;
  trans: TranslationBundle;
}): JSX.Element {
  const { report, trans } = props;
  return (
    <div className="jp-GpuMem-freePlan">
      <p className="jp-GpuMem-freeHeld">{heldText(report, trans)}</p>
      {report.let_go.length > 0 && (
        <>
          <h5 className="jp-GpuMem-freeTitle">
            {report.done ? trans.__('Let go of') : trans.__('Will let go of')}
          </h5>
          <ul className="jp-GpuMem-freeList jp-GpuMem-freeLetGo">
            {report.let_go.map((g, i) => (
              <li
                key={`${i}-${g.holder}`}
                data-holder={g.holder}
                data-action={g.action}
                data-bytes={g.bytes}
              >
                <code className="jp-GpuMem-freeCode">{g.code}</code>
                <span className="jp-GpuMem-freeWhy">{g.why}</span>
                <span className="jp-GpuMem-freeBytes">
                  {formatSize(g.bytes)}
                </span>
              </li>
            ))}
          </ul>
        </>
      )}
      {report.kept.length > 0 && (
        <Holders
          title={trans.__('Left as they are (they keep part of it)')}
          className="jp-GpuMem-freeKept"
          holders={report.kept}
          trans={trans}
        />
      )}
      <p
        className="jp-GpuMem-freeExpected"
        data-bytes={report.devices.reduce((s, d) => s + d.expected_returned, 0)}
      >
        {expectedText(report, trans)}
      </p>
    </div>
  );
}

/** What came back to the driver on each device, and what still holds the rest. */
export function FreeDone(props: {
  report: IFreeReport;
  trans: TranslationBundle;
}): JSX.Element {
  const { report, trans } = props;
  return (
    <div className="jp-GpuMem-freeDone">
      {report.devices.map(d => (
        <p
          key={d.device}
          className="jp-GpuMem-freeReturned"
          data-device={d.device}
          data-returned={d.returned ?? ''}
        >
          {cameBackText(d, trans)}
        </p>
      ))}
      {report.still.length > 0 && (
        <Holders
          title={trans.__('Still held')}
          className="jp-GpuMem-freeStill"
          holders={report.still}
          trans={trans}
        />
      )}
      <FreePlan report={report} trans={trans} />
    </div>
  );
}

/** The report's notes (a replay says nothing was measured). */
export function FreeNotes(props: { report: IFreeReport }): JSX.Element | null {
  const notes = props.report.notes;
  return notes.length === 0 ? null : (
    <ul className="jp-GpuMem-freeNotes">
      {notes.map((note, i) => (
        <li key={i}>{note}</li>
      ))}
    </ul>
  );
}

function Holders(props: {
  title: string;
  className: string;
  holders: readonly IFreeHolder[];
  trans: TranslationBundle;
}): JSX.Element {
  const { title, className, holders, trans } = props;
  return (
    <>
      <h5 className="jp-GpuMem-freeTitle">{title}</h5>
      <ul className={`jp-GpuMem-freeList ${className}`}>
        {holders.map((h, i) => (
          <li
            key={`${i}-${h.holder}`}
            data-holder={h.holder}
            data-bytes={h.bytes}
          >
            <span className="jp-GpuMem-freeHolder">{h.holder}</span>
            <span className="jp-GpuMem-freeBytes">{formatSize(h.bytes)}</span>
            {h.example !== '' && (
              <span className="jp-GpuMem-freeExample">
                {trans.__('e.g. %1', h.example)}
              </span>
            )}
            <span className="jp-GpuMem-freeWhy">{h.why}</span>
            {h.fix !== '' && (
              <span className="jp-GpuMem-freeFix">
                {trans.__('to free it:')}{' '}
                <code className="jp-GpuMem-freeCode">{h.fix}</code>
              </span>
            )}
          </li>
        ))}
      </ul>
    </>
  );
}

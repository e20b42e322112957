/**
 * The out-of-memory block of the Who tab: why the failed request did not fit
 * (asked, free, cached, fragmented, outside PyTorch, other processes) and
 * what would fix it, each fix judged against what the failed cell needs
 * (first steps, fits, maybe, no, with the shortfall). A fix that deletes
 * names is one click: *Free* previews it, as an owner row's does. Every string
 * the kernel sends is rendered as text.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatSize } from '../../present/format';
import { deviceLabel } from '../../present/messages';
import { IFix, IPostMortem } from '../../protocol';
import { FreeOrigin } from '../../state';
import { Figure } from '../overview/figures';
import { IViewProps } from '../props';
import { canFree, freeAt, FreeButton, FreePanel } from './freePreview';

type Verdict = 'first' | 'yes' | 'maybe' | 'no';

function verdictOf(fix: IFix): Verdict {
  if (fix.first_step) {
    return 'first';
  }
  return fix.fits === null ? 'maybe' : fix.fits ? 'yes' : 'no';
}

function fitsLabel(verdict: Verdict, trans: TranslationBundle): string {
  switch (verdict) {
    case 'first':
      return trans.__('first');
    case 'yes':
      return trans.__('fits');
    case 'no':
      return trans.__('no');
    default:
      return trans.__('maybe');
  }
}

function fitsHelp(
  fix: IFix,
  verdict: Verdict,
  trans: TranslationBundle
): string {
  switch (verdict) {
    case 'first':
      return trans.__(
        'A first step before any retry: it frees memory of the failed run itself, which a re-run allocates again'
      );
    case 'yes':
      return trans.__(
        'After this the whole cell fits (a scan of it says what it needs)'
      );
    case 'maybe':
      return trans.__(
        'It covers what the cell needed up to the failure; it may need more after'
      );
    default: {
      const no = trans.__('Not enough');
      return typeof fix.shortfall === 'number'
        ? `${no} ${trans.__('(%1 short)', formatSize(fix.shortfall))}`
        : no;
    }
  }
}

function Fix(props: {
  fix: IFix;
  trans: TranslationBundle;
  /** Given, with the fix's place: a `del` of names gets *Free*. */
  free: IViewProps | null;
  origin: FreeOrigin;
}): JSX.Element {
  const { fix, trans, free, origin } = props;
  const verdict = verdictOf(fix);
  const names = fix.free_names ?? [];
  const freeing = free !== null && names.length > 0;
  const open = freeing ? freeAt(free.state, origin) : null;
  return (
    <li className="jp-GpuMem-fix" data-fix={fix.kind} data-fits={verdict}>
      <span
        className={`jp-GpuMem-fits jp-mod-${verdict}`}
        title={fitsHelp(fix, verdict, trans)}
      >
        {fitsLabel(verdict, trans)}
      </span>
      <span className="jp-GpuMem-fixText">
        {fix.text}
        {fix.command !== '' && !fix.text.includes(fix.command) && (
          <>
            {' '}
            <code className="jp-GpuMem-fixCommand">{fix.command}</code>
          </>
        )}
      </span>
      {freeing && (
        <>
          {' '}
          <FreeButton {...free} names={names} origin={origin} />
        </>
      )}
      {free !== null && open !== null && <FreePanel {...free} free={open} />}
    </li>
  );
}

/**
 * Why the last request that ran out of memory failed on a device, and the
 * fixes, best first (as the kernel ranks them: those after which the request
 * fits come first).
 */
export function OutOfMemory(props: {
  postmortem: IPostMortem;
  trans: TranslationBundle;
  /** Given: fixes that delete names get *Free* (when the kernel offers it). */
  free?: IViewProps;
}): JSX.Element {
  const { postmortem: p, trans } = props;
  const free = props.free && canFree(props.free.state) ? props.free : null;
  const bytes = (n: number) => formatSize(n);
  const title = trans.__('Out of memory on %1', deviceLabel(p.device, trans));
  return (
    <section
      className="jp-GpuMem-oom"
      aria-label={title}
      data-device={p.device}
    >
      <h3 className="jp-GpuMem-oomTitle">{title}</h3>
      <p className="jp-GpuMem-whoHint">
        {trans.__('The last cell that ran out of memory')}
      </p>
      <dl className="jp-GpuMem-figures">
        <Figure
          name="oom_requested"
          label={trans.__('Asked for')}
          value={bytes(p.requested)}
          help={trans.__('The allocation that failed')}
          warn
        />
        <Figure
          name="oom_free"
          label={trans.__('Free')}
          value={bytes(p.free)}
          help={trans.__('Free on the device when it failed')}
        />
        <Figure
          name="oom_cap"
          label={trans.__('Cap')}
          value={p.cap === null ? trans.__('none') : bytes(p.cap)}
          help={trans.__('The memory cap of this process on the device')}
        />
        <Figure
          name="oom_largest_free_block"
          label={trans.__('Largest free block')}
          value={bytes(p.largest_free_block)}
          help={trans.__(
            "The largest free block in PyTorch's cache: a request larger than it needs new memory from the device"
          )}
        />
        <Figure
          name="oom_free_pieces"
          label={trans.__('Free pieces')}
          value={trans._n(
            '%1 piece, %2',
            '%1 pieces, %2',
            p.free_pieces,
            bytes(p.free_pieces_bytes)
          )}
          help={trans.__(
            "Free blocks in PyTorch's cache and their bytes: many small pieces mean fragmentation"
          )}
        />
        {typeof p.need === 'number' && (
          <Figure
            name="oom_need"
            label={trans.__('Needs')}
            value={bytes(p.need)}
            help={trans.__(
              'What the cell had allocated above its start when it failed, plus the failed request'
            )}
            warn
          />
        )}
        {typeof p.need_full === 'number' && (
          <Figure
            name="oom_need_full"
            label={trans.__('Whole cell')}
            value={bytes(p.need_full)}
            help={trans.__('What the whole cell needs, from a scan of it')}
          />
        )}
        {typeof p.room === 'number' && (
          <Figure
            name="oom_room"
            label={trans.__('Room')}
            value={bytes(p.room)}
            help={trans.__(
              'What PyTorch can use for the cell here after the first steps'
            )}
          />
        )}
        {p.other_processes.length > 0 && (
          <Figure
            name="oom_other_processes"
            label={trans.__('Other processes')}
            value={p.other_processes
              .map(o => `${o.name} (${o.pid}) ${bytes(o.bytes)}`)
              .join(', ')}
            help={trans.__('Other processes using this device')}
          />
        )}
      </dl>
      {p.hint && <p className="jp-GpuMem-oomHint">{p.hint}</p>}
      {p.fixes.length > 0 && (
        <>
          <h4 className="jp-GpuMem-fixesTitle">
            {trans.__('Fixes, best first')}
          </h4>
          <ol className="jp-GpuMem-fixes">
            {p.fixes.map((fix, i) => (
              <Fix
                key={`${i}-${fix.kind}`}
                fix={fix}
                trans={trans}
                free={free}
                origin={{ kind: 'fix', device: p.device, index: i }}
              />
            ))}
          </ol>
        </>
      )}
    </section>
  );
}

/**
 * The Who tab's Free (`%gpumem free`): a button on an owner row or a
 * post-mortem's `del` fix that asks the kernel for the plan first (a dry run),
 * shows it where it was asked, then frees on *Free it* and shows what came
 * back. While a cell runs the kernel answers busy and lets go of nothing.
 * Keyboard: the buttons are buttons; *Free it* (then *Close*) takes the focus
 * when it appears; Escape closes.
 */
import * as React from 'react';

import { freeNames } from '../../present/free';
import { availability, errorText } from '../../present/messages';
import { FreeOrigin, IFreeState, IGpuMemState, sameOrigin } from '../../state';
import { ActionButton } from '../common/actionButton';
import { Message } from '../common/message';
import { IViewProps } from '../props';
import { FreeDone, FreeNotes, FreePlan } from './freeReport';

/** The Free open at `origin`, if any. */
export function freeAt(
  state: IGpuMemState,
  origin: FreeOrigin
): IFreeState | null {
  const free = state.process.free;
  return free !== null && sameOrigin(free.origin, origin) ? free : null;
}

/** Whether the kernel offers `free` (revision 13). */
export function canFree(state: IGpuMemState): boolean {
  return state.actions.includes('free');
}

/** *Free*: preview letting go of `names`, shown at `origin`. */
export function FreeButton(
  props: IViewProps & { names: readonly string[]; origin: FreeOrigin }
): JSX.Element {
  const { model, state, trans, names, origin } = props;
  const what = freeNames(names);
  return (
    <ActionButton
      className="jp-GpuMem-freeButton"
      label={trans.__('Free')}
      ariaLabel={trans.__(
        'Free %1: preview what letting it go gives back',
        what
      )}
      help={trans.__(
        'Let go of everything that keeps the GPU memory of %1 alive (%2): a preview first',
        what,
        `%gpumem free ${what}`
      )}
      expanded={freeAt(state, origin) !== null}
      availability={availability(state, 'free', trans)}
      onClick={() => void model.previewFree(names, origin)}
      onRefused={reason => model.reportError('free', reason)}
    />
  );
}

/** The open Free's preview, result, or why there is none. */
export function FreePanel(
  props: IViewProps & { free: IFreeState }
): JSX.Element {
  const { model, trans, free } = props;
  const what = freeNames(free.names);
  const busy = free.status === 'previewing' || free.status === 'freeing';
  return (
    <section
      className="jp-GpuMem-free"
      role="region"
      aria-label={trans.__('Free %1', what)}
      aria-busy={busy}
      data-free={free.status}
      onKeyDown={event => {
        if (event.key === 'Escape' && free.status !== 'freeing') {
          event.stopPropagation();
          model.closeFree();
        }
      }}
    >
      <h4 className="jp-GpuMem-freeName">
        {free.status === 'done'
          ? trans.__('Freed %1', what)
          : trans.__('Free %1', what)}
      </h4>
      <FreeBody {...props} />
    </section>
  );
}

function FreeBody(props: IViewProps & { free: IFreeState }): JSX.Element {
  const { model, trans, free } = props;
  const close = (label: string, focus = false) => (
    <button
      type="button"
      className="jp-GpuMem-button jp-mod-styled"
      autoFocus={focus}
      onClick={() => model.closeFree()}
    >
      {label}
    </button>
  );
  switch (free.status) {
    case 'previewing':
      return (
        <p className="jp-GpuMem-freeStatus" role="status">
          {trans.__('Finding what holds it…')}
        </p>
      );
    case 'preview':
    case 'freeing': {
      const plan = free.preview;
      return (
        <>
          {plan && <FreePlan report={plan} trans={trans} />}
          {plan && <FreeNotes report={plan} />}
          {free.status === 'freeing' ? (
            <p className="jp-GpuMem-freeStatus" role="status">
              {trans.__('Freeing…')}
            </p>
          ) : (
            <div className="jp-GpuMem-freeActions">
              <button
                type="button"
                className="jp-GpuMem-button jp-mod-styled jp-mod-accept"
                autoFocus
                onClick={() => void model.confirmFree()}
              >
                {trans.__('Free it')}
              </button>
              {close(trans.__('Cancel'))}
            </div>
          )}
        </>
      );
    }
    case 'done':
      return (
        <>
          {free.result && <FreeDone report={free.result} trans={trans} />}
          {free.result && <FreeNotes report={free.result} />}
          <div className="jp-GpuMem-freeActions">
            {close(trans.__('Close'), true)}
          </div>
        </>
      );
    default:
      return (
        <div
          className={
            free.status === 'busy'
              ? 'jp-GpuMem-freeBusy'
              : 'jp-GpuMem-freeError'
          }
          role={free.status === 'busy' ? 'status' : 'alert'}
        >
          <Message {...failure(free, props)}>
            <div className="jp-GpuMem-freeActions">
              <button
                type="button"
                className="jp-GpuMem-button jp-mod-styled"
                onClick={() => void model.retryFree()}
              >
                {trans.__('Try again')}
              </button>
              {close(trans.__('Cancel'), true)}
            </div>
          </Message>
        </div>
      );
  }
}

function failure(
  free: IFreeState,
  props: IViewProps
): { title: string; detail?: string } {
  const { trans } = props;
  const error = free.error;
  const nothing = trans.__('Nothing was let go.');
  if (free.status === 'busy') {
    // The kernel's words for `busy` (BUSY_MESSAGE), translated.
    return {
      title: trans.__('busy: available when the cell ends'),
      detail: nothing
    };
  }
  if (error === null) {
    return { title: trans.__('Free failed') };
  }
  if (error.code === 'refused') {
    return { title: error.message, detail: nothing };
  }
  return { title: errorText(error, trans) };
}

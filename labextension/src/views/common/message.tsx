/**
 * The boxed messages the panel shows instead of figures: no kernel, loading,
 * not loaded (with Attach), incompatible (with Check again), restarting, dead,
 * no device, a kernel too old for a view.
 */
import * as React from 'react';

import { availability, statusText } from '../../present/messages';
import { PROTOCOL_REVISION } from '../../protocol';
import { ActionButton } from './actionButton';
import { IViewProps } from '../props';

/**
 * A boxed message with a title, maybe a detail, maybe buttons.
 */
export function Message(props: {
  title: string;
  detail?: string;
  children?: React.ReactNode;
}): JSX.Element {
  return (
    <div className="jp-GpuMem-message">
      <p className="jp-GpuMem-messageTitle">{props.title}</p>
      {props.detail && (
        <p className="jp-GpuMem-messageDetail">{props.detail}</p>
      )}
      {props.children}
    </div>
  );
}

/**
 * The message for the state of the kernel; nothing when it shows figures.
 */
export function StatusMessage(props: IViewProps): JSX.Element | null {
  const { model, state, trans } = props;
  const message = statusText(state.status, trans);
  if (!message) {
    return null;
  }
  return (
    <Message title={message.title} detail={message.detail}>
      {state.status.kind === 'not_loaded' && (
        <ActionButton
          className="jp-mod-accept"
          label={trans.__('Attach')}
          ariaLabel={trans.__('Attach: load jupyter_gpumem in this kernel')}
          help={trans.__('Run %1 in the kernel', '%load_ext jupyter_gpumem')}
          availability={availability(state, 'attach', trans)}
          onClick={() => void model.attach()}
          onRefused={reason => model.reportError('attach', reason)}
        />
      )}
      {state.status.kind === 'incompatible' && (
        <button
          type="button"
          className="jp-GpuMem-button jp-mod-styled"
          onClick={() => model.refresh()}
        >
          {trans.__('Check again')}
        </button>
      )}
    </Message>
  );
}

/**
 * The kernel answers but has no device to show.
 */
export function NoDeviceMessage(props: IViewProps): JSX.Element {
  return <Message title={props.trans.__('The kernel reports no device')} />;
}

/**
 * The kernel's jupyter_gpumem does not answer a view's action: it needs the
 * protocol revision this panel speaks (the schema's, one source).
 */
export function TooOldMessage(
  props: Pick<IViewProps, 'state' | 'trans'> & {
    /** What the view is called, in the user's words. */
    title: string;
  }
): JSX.Element {
  const { state, trans } = props;
  return (
    <Message
      title={trans.__("This kernel's jupyter_gpumem is too old for this view")}
      detail={trans.__(
        '%1 needs jupyter_gpumem with protocol revision %2 in the kernel (it has %3). Upgrade it where the kernel runs and restart the kernel.',
        props.title,
        PROTOCOL_REVISION,
        state.version ?? trans.__('an unknown version')
      )}
    />
  );
}

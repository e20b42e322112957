/**
 * The cap of one device: a text field, Set cap and Clear cap.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { parseCap } from '../../present/cap';
import {
  availability,
  deviceLabel,
  IAvailability
} from '../../present/messages';
import type { GpuMemModel } from '../../model';
import { IDevice } from '../../protocol';
import { IGpuMemState } from '../../state';
import { ActionButton } from '../common/actionButton';

export function CapControl(props: {
  model: GpuMemModel;
  device: IDevice;
  state: IGpuMemState;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, device, state, trans } = props;
  const [text, setText] = React.useState('');
  const setAvailability = availability(state, 'set_limit', trans, device);
  const clearAvailability: IAvailability = !device.limit
    ? { enabled: false, reason: trans.__('No cap is set') }
    : setAvailability;
  const refused = (reason: string) => model.reportError('set_limit', reason);
  const submit = () => {
    if (!setAvailability.enabled) {
      refused(setAvailability.reason);
      return;
    }
    const parsed = parseCap(text, { total: device.total, trans });
    if (!parsed.ok) {
      model.reportError('set_limit', parsed.error);
      return;
    }
    void model.setLimit(device.index, parsed.value);
  };
  const inputId = `jp-GpuMem-cap-${device.index}`;
  return (
    <form
      className="jp-GpuMem-cap"
      onSubmit={event => {
        event.preventDefault();
        submit();
      }}
    >
      <label htmlFor={inputId}>{trans.__('Cap')}</label>
      <input
        id={inputId}
        className="jp-GpuMem-capInput jp-mod-styled"
        type="text"
        value={text}
        placeholder={trans.__('24 GiB · 0.3 · off')}
        aria-label={trans.__(
          'Memory cap for %1',
          deviceLabel(device.index, trans)
        )}
        onChange={event => setText(event.target.value)}
      />
      <ActionButton
        label={trans.__('Set cap')}
        ariaLabel={trans.__(
          'Set the memory cap of %1',
          deviceLabel(device.index, trans)
        )}
        help={trans.__(
          'Cap the bytes PyTorch may reserve on this device (frees nothing)'
        )}
        availability={setAvailability}
        onClick={submit}
        onRefused={refused}
      />
      <ActionButton
        label={trans.__('Clear cap')}
        ariaLabel={trans.__(
          'Clear the memory cap of %1',
          deviceLabel(device.index, trans)
        )}
        help={trans.__('Remove the cap')}
        availability={clearAvailability}
        onClick={() => void model.setLimit(device.index, null)}
        onRefused={refused}
      />
    </form>
  );
}

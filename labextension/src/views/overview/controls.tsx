/**
 * The allocator actions of the whole kernel: Empty cache, Caching on/off,
 * Reset peak.
 */
import * as React from 'react';

import { availability } from '../../present/messages';
import { UserAction } from '../../state';
import { ActionButton } from '../common/actionButton';
import { IViewProps } from '../props';

export function Controls(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  const caching = state.process.sample ? state.process.sample.caching : null;
  const refused = (action: UserAction) => (reason: string) =>
    model.reportError(action, reason);
  return (
    <div
      className="jp-GpuMem-controls"
      role="group"
      aria-label={trans.__('Allocator actions')}
    >
      <ActionButton
        label={trans.__('Empty cache')}
        ariaLabel={trans.__(
          'Empty the cache: release cached free blocks to the driver'
        )}
        help={trans.__(
          'torch.cuda.empty_cache(): release cached free blocks to the driver'
        )}
        availability={availability(state, 'empty_cache', trans)}
        onClick={() => void model.emptyCache()}
        onRefused={refused('empty_cache')}
      />
      <ActionButton
        label={
          caching === false ? trans.__('Caching on') : trans.__('Caching off')
        }
        ariaLabel={
          caching === false
            ? trans.__('Switch the caching allocator on')
            : trans.__('Switch the caching allocator off')
        }
        help={
          caching === false
            ? trans.__('Let PyTorch keep freed blocks for reuse again')
            : trans.__(
                'Every allocation goes straight to the driver; allocator figures stop counting new allocations'
              )
        }
        availability={availability(state, 'set_caching', trans)}
        onClick={() => void model.setCaching(caching === false)}
        onRefused={refused('set_caching')}
      />
      <ActionButton
        label={trans.__('Reset peak')}
        ariaLabel={trans.__('Reset the peak counters to the current figures')}
        help={trans.__(
          'Set the peak counters to the current figures (for everyone in this kernel)'
        )}
        availability={availability(state, 'reset_peak', trans)}
        onClick={() => void model.resetPeak()}
        onRefused={refused('reset_peak')}
      />
    </div>
  );
}

/**
 * The panel's action button.
 */
import * as React from 'react';

import { IAvailability } from '../../present/messages';

/**
 * A button that stays focusable when not applicable: activating it then says
 * why in the status line instead of doing nothing.
 */
export function ActionButton(props: {
  label: string;
  ariaLabel: string;
  help: string;
  availability: IAvailability;
  onClick: () => void;
  onRefused: (reason: string) => void;
  className?: string;
  /** For a button that opens something below it: whether it is open. */
  expanded?: boolean;
}): JSX.Element {
  const { enabled, reason } = props.availability;
  return (
    <button
      type="button"
      className={`jp-GpuMem-button jp-mod-styled ${props.className ?? ''}`}
      aria-label={props.ariaLabel}
      aria-disabled={!enabled}
      aria-expanded={props.expanded}
      title={enabled ? props.help : reason}
      onClick={() => (enabled ? props.onClick() : props.onRefused(reason))}
    >
      {props.label}
    </button>
  );
}

/**
 * The Overview tab: the allocator actions, the last cell's forecast before the
 * OOM, one section per device and the notebook's worker processes, once the
 * kernel sends figures.
 */
import * as React from 'react';

import { Controls } from './controls';
import { DeviceSection } from './deviceSection';
import { ForecastLines } from './forecastLine';
import { NoDeviceMessage } from '../common/message';
import { IViewProps } from '../props';
import { WorkersSection } from './workersSection';

export function Overview(props: IViewProps): JSX.Element | null {
  const { state } = props;
  const sample = state.process.sample;
  const showFigures =
    sample !== null &&
    (state.status.kind === 'ok' || state.status.kind === 'not_initialized');
  if (!showFigures || !sample) {
    return null;
  }
  return (
    <>
      {sample.devices.length === 0 && <NoDeviceMessage {...props} />}
      <Controls {...props} />
      {state.process.forecast && (
        <ForecastLines
          forecasts={state.process.forecast.forecasts}
          cell={state.process.forecast.cell}
          trans={props.trans}
        />
      )}
      {sample.devices.map(device => (
        <DeviceSection
          key={device.index}
          {...props}
          device={device}
          sample={sample}
        />
      ))}
      <WorkersSection {...props} sample={sample} />
    </>
  );
}

/**
 * One device: its title, bar and legend, figures, trend chart and cap.
 */
import * as React from 'react';

import { barGeometry } from '../../present/bar';
import { formatBytes } from '../../present/format';
import { deviceLabel } from '../../present/messages';
import { IDevice, ISample } from '../../protocol';
import { CapControl } from './capControl';
import { DeviceBar, Legend } from './deviceBar';
import { Figures } from './figures';
import { IViewProps } from '../props';
import { useInView } from '../common/inView';
import { TrendChart } from './trendChart';

export function DeviceSection(
  props: IViewProps & { device: IDevice; sample: ISample }
): JSX.Element {
  const { model, state, trans, device, sample } = props;
  const now = Math.max(state.process.lastHeard ?? 0, sample.time);
  const scale = model.settings.barScale;
  const geometry = barGeometry(device, scale);
  // The chart is drawn only while the section can be seen (see inView.ts).
  const [ref, inView] = useInView<HTMLElement>();
  // The chart's height, read once when it is drawn: the placeholder keeps it.
  const chartHeight = React.useRef(0);
  const measureChart = React.useCallback((el: HTMLDivElement | null) => {
    if (el) {
      chartHeight.current = el.offsetHeight;
    }
  }, []);
  return (
    <section
      ref={ref}
      className="jp-GpuMem-device"
      aria-label={`${deviceLabel(device.index, trans)}: ${device.name}`}
      data-device={device.index}
    >
      <h3 className="jp-GpuMem-deviceTitle">
        <span>{deviceLabel(device.index, trans)}</span>
        <span className="jp-GpuMem-deviceName">{device.name}</span>
        <span className="jp-GpuMem-backend">{device.backend}</span>
      </h3>
      <div className="jp-GpuMem-scale" data-scale={scale}>
        <span className="jp-GpuMem-scaleText">
          {geometry.scaleIsTotal
            ? trans.__('Scale: the device, %1', formatBytes(geometry.scale))
            : trans.__(
                'Scale: 0 to %1, fitted to this kernel',
                formatBytes(geometry.scale)
              )}
        </span>
        <button
          type="button"
          className="jp-GpuMem-linkButton"
          aria-pressed={scale === 'total'}
          title={trans.__(
            'Switch the bars between the device total and a scale fitted to what this kernel holds'
          )}
          onClick={() =>
            model.configure({ barScale: scale === 'fit' ? 'total' : 'fit' })
          }
        >
          {scale === 'fit'
            ? trans.__('Show the device total')
            : trans.__('Fit to this kernel')}
        </button>
      </div>
      <DeviceBar device={device} trans={trans} scale={scale} />
      <Legend device={device} trans={trans} />
      <Figures device={device} caching={sample.caching} trans={trans} />
      {device.error && <p className="jp-GpuMem-deviceError">{device.error}</p>}
      {inView ? (
        <div ref={measureChart}>
          <TrendChart
            device={device}
            points={state.process.history[device.index] ?? []}
            cells={state.process.cells}
            now={now}
            minutes={state.trendMinutes}
            trans={trans}
            onGoTo={n => void model.scrollToCell(n)}
          />
        </div>
      ) : (
        <div
          className="jp-GpuMem-trendPlaceholder"
          aria-hidden="true"
          style={
            chartHeight.current ? { height: chartHeight.current } : undefined
          }
        />
      )}
      <CapControl model={model} device={device} state={state} trans={trans} />
    </section>
  );
}

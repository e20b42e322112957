/**
 * The sidebar panel: draws the model's state.
 */
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import {
  ITranslator,
  nullTranslator,
  TranslationBundle
} from '@jupyterlab/translation';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { barGeometry, cachedFree, SegmentKey } from './bar';
import { parseCap } from './cap';
import { formatBytes, formatDelta, formatPercent, Units } from './format';
import { gpuMemIcon } from './icon';
import {
  availability,
  deviceLabel,
  errorText,
  IAvailability,
  noticeText,
  statusText
} from './messages';
import { GpuMemModel } from './model';
import { ICellMarker, IDevice, ISample } from './protocol';
import { IGpuMemState, ITrendPoint, UserAction } from './reducer';

/** Translation domain of the extension. */
export const TRANSLATION_DOMAIN = 'jupyter_gpumem';

interface IViewProps {
  model: GpuMemModel;
  state: IGpuMemState;
  trans: TranslationBundle;
}

function segmentLabel(key: SegmentKey, trans: TranslationBundle): string {
  switch (key) {
    case 'allocated':
      return trans.__('Allocated');
    case 'reserved':
      return trans.__('Reserved');
    case 'process':
      return trans.__('This process');
    case 'device':
      return trans.__('All processes');
  }
}

function segmentHelp(key: SegmentKey, trans: TranslationBundle): string {
  switch (key) {
    case 'allocated':
      return trans.__('Memory held by live tensors');
    case 'reserved':
      return trans.__(
        "Memory PyTorch's caching allocator holds: allocated plus cached free blocks"
      );
    case 'process':
      return trans.__(
        'Memory this kernel process uses on the device (reserved plus the CUDA context), from NVML'
      );
    case 'device':
      return trans.__('Memory used on the device by all processes');
  }
}

/**
 * A button that stays focusable when not applicable: activating it then says
 * why in the status line instead of doing nothing.
 */
function ActionButton(props: {
  label: string;
  ariaLabel: string;
  help: string;
  availability: IAvailability;
  onClick: () => void;
  onRefused: (reason: string) => void;
  className?: string;
}): JSX.Element {
  const { enabled, reason } = props.availability;
  return (
    <button
      type="button"
      className={`jp-GpuMem-button jp-mod-styled ${props.className ?? ''}`}
      aria-label={props.ariaLabel}
      aria-disabled={!enabled}
      title={enabled ? props.help : reason}
      onClick={() => (enabled ? props.onClick() : props.onRefused(reason))}
    >
      {props.label}
    </button>
  );
}

function Bar(props: {
  device: IDevice;
  units: Units;
  trans: TranslationBundle;
}): JSX.Element {
  const { device, units, trans } = props;
  const geometry = barGeometry(device);
  const described = geometry.segments
    .slice()
    .reverse()
    .map(s => `${segmentLabel(s.key, trans)} ${formatBytes(s.bytes, units)}`);
  if (device.total !== null) {
    described.push(trans.__('of %1', formatBytes(device.total, units)));
  }
  return (
    <div
      className="jp-GpuMem-bar"
      role="img"
      aria-label={described.join(', ')}
      data-scale={geometry.scale}
    >
      {geometry.segments.map(segment => (
        <div
          key={segment.key}
          className={`jp-GpuMem-segment jp-GpuMem-segment-${segment.key}`}
          style={{ width: `${(segment.fraction * 100).toFixed(3)}%` }}
          data-bytes={segment.bytes}
          title={`${segmentLabel(segment.key, trans)}: ${formatBytes(segment.bytes, units)}`}
        />
      ))}
      {geometry.peak !== null && (
        <div
          className="jp-GpuMem-peak"
          style={{ left: `${(geometry.peak * 100).toFixed(3)}%` }}
          title={trans.__(
            'Peak allocated since the last reset: %1',
            formatBytes(device.peak_allocated ?? 0, units)
          )}
        />
      )}
      {geometry.limit !== null && device.limit && (
        <div
          className="jp-GpuMem-limit"
          style={{ left: `${(geometry.limit * 100).toFixed(3)}%` }}
          title={trans.__(
            'Cap: %1 (%2)',
            formatBytes(device.limit.bytes, units),
            formatPercent(device.limit.fraction)
          )}
        />
      )}
    </div>
  );
}

function Legend(props: {
  device: IDevice;
  units: Units;
  trans: TranslationBundle;
}): JSX.Element {
  const { device, units, trans } = props;
  const geometry = barGeometry(device);
  const rows = geometry.segments.slice().reverse();
  return (
    <ul className="jp-GpuMem-legend">
      {rows.map(segment => (
        <li key={segment.key} title={segmentHelp(segment.key, trans)}>
          <span
            className={`jp-GpuMem-swatch jp-GpuMem-segment-${segment.key}`}
            aria-hidden="true"
          />
          <span className="jp-GpuMem-legendLabel">
            {segmentLabel(segment.key, trans)}
          </span>
          <span className="jp-GpuMem-value" data-figure={segment.key}>
            {formatBytes(segment.bytes, units)}
          </span>
        </li>
      ))}
      {device.total !== null && (
        <li title={trans.__('Capacity of the device')}>
          <span
            className="jp-GpuMem-swatch jp-GpuMem-segment-total"
            aria-hidden="true"
          />
          <span className="jp-GpuMem-legendLabel">{trans.__('Total')}</span>
          <span className="jp-GpuMem-value" data-figure="total">
            {formatBytes(device.total, units)}
          </span>
        </li>
      )}
    </ul>
  );
}

function Figure(props: {
  label: string;
  value: string;
  help: string;
  name: string;
  warn?: boolean;
}): JSX.Element {
  return (
    <>
      <dt title={props.help}>{props.label}</dt>
      <dd
        data-figure={props.name}
        className={props.warn ? 'jp-GpuMem-warn' : undefined}
      >
        {props.value}
      </dd>
    </>
  );
}

function Figures(props: {
  device: IDevice;
  caching: boolean | null;
  units: Units;
  trans: TranslationBundle;
}): JSX.Element {
  const { device, caching, units, trans } = props;
  const free = cachedFree(device);
  return (
    <dl className="jp-GpuMem-figures">
      {device.initialized && device.peak_allocated !== null && (
        <Figure
          name="peak_allocated"
          label={trans.__('Peak allocated')}
          value={formatBytes(device.peak_allocated, units)}
          help={trans.__(
            'Highest allocation since the last peak reset (the solid mark on the bar)'
          )}
        />
      )}
      {device.initialized && device.peak_reserved !== null && (
        <Figure
          name="peak_reserved"
          label={trans.__('Peak reserved')}
          value={formatBytes(device.peak_reserved, units)}
          help={trans.__('Highest reservation since the last peak reset')}
        />
      )}
      {free !== null && (
        <Figure
          name="cached_free"
          label={trans.__('Cached, free')}
          value={formatBytes(free, units)}
          help={trans.__('Reserved but not allocated: blocks kept for reuse')}
        />
      )}
      {device.initialized && device.inactive_split !== null && (
        <Figure
          name="inactive_split"
          label={trans.__('Non-releasable')}
          value={formatBytes(device.inactive_split, units)}
          help={trans.__(
            'Fragmentation: free parts of split blocks that Empty cache cannot return (inactive_split)'
          )}
        />
      )}
      {device.initialized && (
        <Figure
          name="caching"
          label={trans.__('Caching')}
          value={
            caching === null
              ? trans.__('unknown')
              : caching
                ? trans.__('on')
                : trans.__('off')
          }
          help={trans.__("State of PyTorch's caching allocator in this kernel")}
          warn={caching === false}
        />
      )}
      <Figure
        name="limit"
        label={trans.__('Cap')}
        value={
          device.limit
            ? trans.__(
                '%1 (%2)',
                formatBytes(device.limit.bytes, units),
                formatPercent(device.limit.fraction)
              )
            : trans.__('none')
        }
        help={trans.__(
          'Memory cap set with set_per_process_memory_fraction (the dashed mark on the bar)'
        )}
      />
      {(device.alloc_retries ?? 0) > 0 && (
        <Figure
          name="alloc_retries"
          label={trans.__('Allocation retries')}
          value={String(device.alloc_retries)}
          help={trans.__(
            'cudaMalloc failed, the cache was flushed and the allocation retried: slow'
          )}
          warn
        />
      )}
      {(device.ooms ?? 0) > 0 && (
        <Figure
          name="ooms"
          label={trans.__('Out of memory errors')}
          value={String(device.ooms)}
          help={trans.__(
            'OutOfMemoryError raised by the allocator on this device'
          )}
          warn
        />
      )}
    </dl>
  );
}

const TREND_WIDTH = 300;
const TREND_HEIGHT = 64;

function cellTooltip(
  cell: ICellMarker,
  index: number,
  units: Units,
  trans: TranslationBundle
): string {
  const lines = [
    cell.execution_count === null
      ? trans.__('Cell')
      : trans.__('Cell [%1]', cell.execution_count),
    cell.first_line,
    trans.__('Wall time %1 s', cell.wall_time.toFixed(2))
  ];
  if (cell.failed) {
    lines.push(trans.__('Failed'));
  }
  const device = cell.devices.find(d => d.index === index);
  if (device) {
    lines.push(
      trans.__('Allocated %1', formatDelta(device.allocated_delta, units))
    );
    lines.push(
      trans.__('Reserved %1', formatDelta(device.reserved_delta, units))
    );
    if (device.peak_allocated !== null) {
      lines.push(
        trans.__('Peak allocated %1', formatBytes(device.peak_allocated, units))
      );
    }
  }
  return lines.join('\n');
}

function spanLabel(seconds: number, trans: TranslationBundle): string {
  if (seconds < 90) {
    return trans.__('-%1 s', Math.round(seconds));
  }
  const minutes = Math.round((seconds / 60) * 10) / 10;
  return trans.__('-%1 min', minutes);
}

function Trend(props: {
  device: IDevice;
  points: readonly ITrendPoint[];
  cells: readonly ICellMarker[];
  now: number;
  minutes: number;
  units: Units;
  trans: TranslationBundle;
}): JSX.Element | null {
  const { device, points, cells, now, minutes, units, trans } = props;
  if (points.length === 0) {
    return null;
  }
  // Until the history fills the window, show what there is (at least 1 min).
  const span = Math.min(
    Math.max(1, minutes * 60),
    Math.max(60, now - points[0].time)
  );
  const start = now - span;
  // Scaled to the data: a far-away cap would flatten the lines; it is drawn
  // only when it falls inside.
  const highest = Math.max(
    1,
    ...points.map(p => Math.max(p.reserved, p.allocated))
  );
  const top = highest * 1.05;
  const limitBytes =
    device.limit && device.limit.bytes <= top ? device.limit.bytes : null;
  const x = (time: number) => ((time - start) / span) * TREND_WIDTH;
  const y = (bytes: number) =>
    TREND_HEIGHT - (bytes / top) * (TREND_HEIGHT - 2) - 1;
  const path = (key: 'allocated' | 'reserved') => {
    // Samples come only when a figure changed: hold each value until the next.
    const parts: string[] = [];
    points.forEach((p, i) => {
      const px = Math.max(0, x(p.time)).toFixed(1);
      if (i > 0) {
        parts.push(`${px},${y(points[i - 1][key]).toFixed(1)}`);
      }
      parts.push(`${px},${y(p[key]).toFixed(1)}`);
    });
    const last = points[points.length - 1];
    parts.push(`${TREND_WIDTH},${y(last[key]).toFixed(1)}`);
    return parts.join(' ');
  };
  const visibleCells = cells.filter(
    c => c.time >= start && c.devices.some(d => d.index === device.index)
  );
  return (
    <figure className="jp-GpuMem-trend">
      <svg
        viewBox={`0 0 ${TREND_WIDTH} ${TREND_HEIGHT}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={trans.__(
          'Allocated and reserved memory of %1, %2 until now',
          deviceLabel(device.index, trans),
          spanLabel(span, trans)
        )}
      >
        {limitBytes !== null && (
          <line
            className="jp-GpuMem-trendLimit"
            x1={0}
            x2={TREND_WIDTH}
            y1={y(limitBytes)}
            y2={y(limitBytes)}
          />
        )}
        <polyline
          className="jp-GpuMem-trendReserved"
          points={path('reserved')}
        />
        <polyline
          className="jp-GpuMem-trendAllocated"
          points={path('allocated')}
        />
        {visibleCells.map((cell, i) => (
          <g key={`${cell.time}-${i}`} className="jp-GpuMem-cellMarker">
            <title>{cellTooltip(cell, device.index, units, trans)}</title>
            <line
              className={
                cell.failed
                  ? 'jp-GpuMem-cellLine jp-mod-failed'
                  : 'jp-GpuMem-cellLine'
              }
              x1={x(cell.time)}
              x2={x(cell.time)}
              y1={0}
              y2={TREND_HEIGHT}
            />
            <rect
              x={x(cell.time) - 3}
              y={0}
              width={6}
              height={TREND_HEIGHT}
              fill="transparent"
            />
          </g>
        ))}
      </svg>
      <figcaption className="jp-GpuMem-trendAxis">
        <span>{spanLabel(span, trans)}</span>
        <span>{trans.__('max %1', formatBytes(highest, units))}</span>
        <span>{trans.__('now')}</span>
      </figcaption>
    </figure>
  );
}

function CapControl(props: {
  model: GpuMemModel;
  device: IDevice;
  state: IGpuMemState;
  trans: TranslationBundle;
}): JSX.Element {
  const { model, device, state, trans } = props;
  const [text, setText] = React.useState('');
  const units = model.settings.units;
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
    const parsed = parseCap(text, { total: device.total, trans, units });
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

function DeviceRow(
  props: IViewProps & { device: IDevice; sample: ISample }
): JSX.Element {
  const { model, state, trans, device, sample } = props;
  const units = model.settings.units;
  const now = Math.max(state.lastHeard ?? 0, sample.time);
  return (
    <section
      className="jp-GpuMem-device"
      aria-label={`${deviceLabel(device.index, trans)}: ${device.name}`}
      data-device={device.index}
    >
      <h3 className="jp-GpuMem-deviceTitle">
        <span>{deviceLabel(device.index, trans)}</span>
        <span className="jp-GpuMem-deviceName">{device.name}</span>
        <span className="jp-GpuMem-backend">{device.backend}</span>
      </h3>
      <Bar device={device} units={units} trans={trans} />
      <Legend device={device} units={units} trans={trans} />
      <Figures
        device={device}
        caching={sample.caching}
        units={units}
        trans={trans}
      />
      {device.error && <p className="jp-GpuMem-deviceError">{device.error}</p>}
      <Trend
        device={device}
        points={state.history[device.index] ?? []}
        cells={state.cells}
        now={now}
        minutes={state.trendMinutes}
        units={units}
        trans={trans}
      />
      <CapControl model={model} device={device} state={state} trans={trans} />
    </section>
  );
}

function Controls(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  const caching = state.sample ? state.sample.caching : null;
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

function Header(props: IViewProps): JSX.Element {
  const { state, trans } = props;
  const details: string[] = [];
  if (state.sample && state.sample.torch_version) {
    details.push(trans.__('torch %1', state.sample.torch_version));
  }
  if (state.sample && state.sample.host_rss !== null) {
    details.push(
      trans.__(
        'host RSS %1',
        formatBytes(state.sample.host_rss, props.model.settings.units)
      )
    );
  }
  return (
    <header className="jp-GpuMem-header">
      <h2 className="jp-GpuMem-title">
        <gpuMemIcon.react tag="span" className="jp-GpuMem-titleIcon" />
        {trans.__('GPU memory')}
      </h2>
      <div className="jp-GpuMem-source" title={trans.__('Kernel shown')}>
        {state.source ?? trans.__('No notebook or console')}
        {state.busy && (
          <span className="jp-GpuMem-busy">{trans.__('running')}</span>
        )}
      </div>
      {details.length > 0 && (
        <div className="jp-GpuMem-details">{details.join(' · ')}</div>
      )}
      {state.status.kind === 'ok' && state.status.sample.message && (
        // The kernel's remark on figures it shows anyway (a replay, say).
        <div className="jp-GpuMem-note">{state.status.sample.message}</div>
      )}
    </header>
  );
}

function StatusLine(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  let text = '';
  let kind = '';
  if (state.lastError) {
    text = errorText(state.lastError, trans);
    kind = 'jp-mod-error';
  } else if (state.notice) {
    text = noticeText(state.notice, trans, model.settings.units);
  } else if (state.pending) {
    text = trans.__('Waiting for the kernel…');
  }
  return (
    <div
      className={`jp-GpuMem-statusLine ${kind}`}
      role="status"
      aria-live="polite"
    >
      <span className="jp-GpuMem-statusText">{text}</span>
      {text !== '' && !state.pending && (
        <button
          type="button"
          className="jp-GpuMem-dismiss"
          aria-label={trans.__('Dismiss the message')}
          onClick={() => model.dismiss()}
        >
          ×
        </button>
      )}
    </div>
  );
}

/**
 * The whole panel for one state.
 */
export function GpuMemView(props: IViewProps): JSX.Element {
  const { model, state, trans } = props;
  const message = statusText(state.status, trans);
  const sample = state.sample;
  const showFigures =
    sample !== null &&
    (state.status.kind === 'ok' || state.status.kind === 'not_initialized');
  return (
    <div className="jp-GpuMem-body" data-state={state.status.kind}>
      <Header {...props} />
      {message && (
        <div className="jp-GpuMem-message">
          <p className="jp-GpuMem-messageTitle">{message.title}</p>
          {message.detail && (
            <p className="jp-GpuMem-messageDetail">{message.detail}</p>
          )}
          {state.status.kind === 'not_loaded' && (
            <ActionButton
              className="jp-mod-accept"
              label={trans.__('Attach')}
              ariaLabel={trans.__('Attach: load jupyter_gpumem in this kernel')}
              help={trans.__(
                'Run %1 in the kernel',
                '%load_ext jupyter_gpumem'
              )}
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
        </div>
      )}
      {showFigures && sample && sample.devices.length === 0 && (
        <div className="jp-GpuMem-message">
          <p className="jp-GpuMem-messageTitle">
            {trans.__('The kernel reports no device')}
          </p>
        </div>
      )}
      {showFigures && sample && (
        <>
          <Controls {...props} />
          {sample.devices.map(device => (
            <DeviceRow
              key={device.index}
              {...props}
              device={device}
              sample={sample}
            />
          ))}
        </>
      )}
      <StatusLine {...props} />
    </div>
  );
}

/**
 * The sidebar widget. The model streams only while this is visible.
 */
export class GpuMemPanel extends ReactWidget {
  constructor(options: GpuMemPanel.IOptions) {
    super();
    this._model = options.model;
    this._trans = (options.translator ?? nullTranslator).load(
      TRANSLATION_DOMAIN
    );
    this.id = 'jp-GpuMem-panel';
    this.addClass('jp-GpuMem-panel');
    this.title.icon = gpuMemIcon;
    this.title.caption = this._trans.__('GPU memory');
  }

  get model(): GpuMemModel {
    return this._model;
  }

  protected render(): JSX.Element {
    return (
      <UseSignal
        signal={this._model.stateChanged}
        initialArgs={this._model.state}
      >
        {(_, state) => (
          <GpuMemView
            model={this._model}
            state={state ?? this._model.state}
            trans={this._trans}
          />
        )}
      </UseSignal>
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.setVisible(true);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.setVisible(false);
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this._model.setVisible(this.isVisible);
  }

  protected onBeforeDetach(msg: Message): void {
    this._model.setVisible(false);
    super.onBeforeDetach(msg);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.setVisible(false);
    super.dispose();
  }

  private _model: GpuMemModel;
  private _trans: TranslationBundle;
}

export namespace GpuMemPanel {
  export interface IOptions {
    model: GpuMemModel;
    translator?: ITranslator;
  }
}

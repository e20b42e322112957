/**
 * The Segments tab: every segment PyTorch's caching allocator holds, and the
 * blocks inside it drawn to scale within the segment (live, pending, free
 * pieces that fragment the cache, cached free), with the summary called out.
 */
import { TranslationBundle } from '@jupyterlab/translation';
import * as React from 'react';

import { formatBytes, formatPercent } from '../../present/format';
import { deviceLabel } from '../../present/messages';
import {
  BlockKind,
  ISegment,
  ISegmentMap,
  ISegmentsResult,
  ISegmentsWorker
} from '../../protocol';
import { IActionError, IGpuMemState } from '../../state';
import { IViewProps } from '../props';
import { RankChooser, workerWords } from './rankChooser';
import { ReadingFrame, useReading } from '../common/readingFrame';

/** Blocks narrower than this share of their segment are drawn merged. */
export const MIN_RUN_FRACTION = 0.004;

/** What is drawn: a block, or neighbouring tiny blocks of one kind merged. */
export interface IBlockRun {
  offset: number;
  size: number;
  kind: BlockKind;
  /** Blocks in the run (1: a block). */
  blocks: number;
  /** The line that allocated it, when one block and known. */
  site: string;
  /** The largest free block of the device is this one. */
  largest: boolean;
}

/**
 * The runs of a segment: each block, except that consecutive blocks of one
 * kind narrower than `minFraction` of the segment are merged (a segment of
 * thousands of small blocks stays a few hundred elements).
 */
export function segmentRuns(
  segment: ISegment,
  labels: readonly string[],
  largestFree: number,
  minFraction = MIN_RUN_FRACTION
): IBlockRun[] {
  const runs: IBlockRun[] = [];
  const tiny = segment.size * minFraction;
  let markedLargest = false;
  for (const [offset, size, kind, label] of segment.blocks) {
    const last = runs[runs.length - 1];
    const free = kind === 'piece' || kind === 'cached';
    const largest =
      free && !markedLargest && largestFree > 0 && size === largestFree;
    if (largest) {
      markedLargest = true;
    }
    if (
      last &&
      !largest &&
      !last.largest &&
      last.kind === kind &&
      size < tiny &&
      last.size < tiny * Math.max(1, last.blocks) &&
      last.offset + last.size === offset
    ) {
      last.size += size;
      last.blocks += 1;
      last.site = '';
      continue;
    }
    runs.push({
      offset,
      size,
      kind,
      blocks: 1,
      site: label >= 0 && label < labels.length ? labels[label] : '',
      largest
    });
  }
  return runs;
}

function kindLabel(kind: BlockKind, trans: TranslationBundle): string {
  switch (kind) {
    case 'allocated':
      return trans.__('Allocated');
    case 'pending':
      return trans.__('Freed, pending another stream');
    case 'piece':
      return trans.__('Free piece (fragmentation)');
    case 'cached':
      return trans.__('Cached free (empty cache returns it)');
  }
}

const KINDS: readonly BlockKind[] = ['allocated', 'pending', 'piece', 'cached'];

export function runTitle(
  run: IBlockRun,
  segment: ISegment,
  trans: TranslationBundle
): string {
  const lines = [
    run.blocks === 1
      ? `${kindLabel(run.kind, trans)}: ${formatBytes(run.size)}`
      : trans.__(
          '%1 blocks, %2: %3',
          run.blocks,
          kindLabel(run.kind, trans),
          formatBytes(run.size)
        ),
    trans.__(
      'at +%1 in a %2 segment, stream %3',
      formatBytes(run.offset),
      formatBytes(segment.size),
      segment.stream
    )
  ];
  if (run.site) {
    lines.push(run.site);
  }
  if (run.largest) {
    lines.push(trans.__('The largest free block'));
  }
  return lines.join('\n');
}

function SegmentRow(props: {
  segment: ISegment;
  labels: readonly string[];
  largestFree: number;
  trans: TranslationBundle;
}): JSX.Element {
  const { segment, trans } = props;
  const runs = segmentRuns(segment, props.labels, props.largestFree);
  const live = segment.blocks
    .filter(b => b[2] === 'allocated' || b[2] === 'pending')
    .reduce((sum, b) => sum + b[1], 0);
  return (
    <li
      className="jp-GpuMem-segmentRow"
      data-size={segment.size}
      data-pool={segment.pool}
    >
      <div className="jp-GpuMem-segmentHead">
        <span className="jp-GpuMem-value">{formatBytes(segment.size)}</span>
        <span>
          {segment.pool === 'small'
            ? trans.__('small pool')
            : trans.__('large pool')}
          {segment.stream !== 0
            ? ` · ${trans.__('stream %1', segment.stream)}`
            : ''}
          {segment.expandable ? ` · ${trans.__('expandable')}` : ''}
        </span>
        <span className="jp-GpuMem-segmentLive">
          {trans.__('%1 live', formatBytes(live))}
        </span>
      </div>
      <div
        className={
          segment.expandable
            ? 'jp-GpuMem-segmentBar jp-mod-expandable'
            : 'jp-GpuMem-segmentBar'
        }
        role="img"
        aria-label={trans.__(
          'Segment of %1: %2 live in %3 blocks',
          formatBytes(segment.size),
          formatBytes(live),
          segment.blocks.length
        )}
      >
        {runs.map(run => (
          <div
            key={run.offset}
            className={`jp-GpuMem-block jp-GpuMem-block-${run.kind}${
              run.largest ? ' jp-mod-largest' : ''
            }`}
            data-kind={run.kind}
            data-bytes={run.size}
            data-blocks={run.blocks}
            style={{
              left: `${((run.offset / segment.size) * 100).toFixed(3)}%`,
              width: `${((run.size / segment.size) * 100).toFixed(3)}%`
            }}
            title={runTitle(run, segment, trans)}
          />
        ))}
      </div>
    </li>
  );
}

/** The map of one device; pure, for tests. */
export function SegmentMapView(props: {
  map: ISegmentMap;
  deviceName: string;
  trans: TranslationBundle;
}): JSX.Element {
  const { map, trans } = props;
  const s = map.summary;
  return (
    <section
      className="jp-GpuMem-segmentMap"
      data-device={map.device}
      aria-label={trans.__('Segments of %1', deviceLabel(map.device, trans))}
    >
      <h3 className="jp-GpuMem-deviceTitle">
        <span>{deviceLabel(map.device, trans)}</span>
        <span className="jp-GpuMem-deviceName">{props.deviceName}</span>
      </h3>
      <dl className="jp-GpuMem-segmentSummary">
        <dt>{trans.__('Segments')}</dt>
        <dd data-figure="segments">{s.segments}</dd>
        <dt>{trans.__('Reserved')}</dt>
        <dd data-figure="reserved">{formatBytes(s.reserved)}</dd>
        <dt>{trans.__('Allocated')}</dt>
        <dd data-figure="allocated">{formatBytes(s.allocated)}</dd>
        <dt
          title={trans.__(
            'Free blocks in segments that also hold live ones: empty cache cannot return them'
          )}
        >
          {trans.__('Free pieces')}
        </dt>
        <dd data-figure="pieces">
          {trans.__('%1 (%2)', s.pieces, formatBytes(s.pieces_bytes))}
        </dd>
        <dt>{trans.__('Largest free block')}</dt>
        <dd data-figure="largest">{formatBytes(s.largest_free_block)}</dd>
        <dt
          title={trans.__('Share of the cached free memory that is in pieces')}
        >
          {trans.__('Fragmentation')}
        </dt>
        <dd data-figure="fragmentation">{formatPercent(s.fragmentation)}</dd>
        <dt>{trans.__('Releasable')}</dt>
        <dd data-figure="releasable">{formatBytes(s.releasable)}</dd>
      </dl>
      <ul className="jp-GpuMem-legend jp-GpuMem-blockLegend">
        {KINDS.map(kind => (
          <li key={kind}>
            <span
              className={`jp-GpuMem-swatch jp-GpuMem-block-${kind}`}
              aria-hidden="true"
            />
            <span className="jp-GpuMem-legendLabel">
              {kindLabel(kind, trans)}
            </span>
          </li>
        ))}
      </ul>
      {map.segments.length === 0 ? (
        <p className="jp-GpuMem-whoHint">
          {trans.__('The allocator holds no segment on this device.')}
        </p>
      ) : (
        <ol className="jp-GpuMem-segmentList">
          {map.segments.map(segment => (
            <SegmentRow
              key={segment.address}
              segment={segment}
              labels={map.labels}
              largestFree={s.largest_free_block}
              trans={trans}
            />
          ))}
        </ol>
      )}
      {map.omitted > 0 && (
        <p className="jp-GpuMem-whoHint" data-omitted={map.omitted}>
          {trans.__(
            '%1 smaller segments (%2) not drawn.',
            map.omitted,
            formatBytes(map.omitted_bytes)
          )}
        </p>
      )}
      <p className="jp-GpuMem-whoHint">
        {map.tracking
          ? trans.__(
              'Hover a block for its size, stream and the line that allocated it.'
            )
          : trans.__(
              'Hover a block for its size and stream; track allocation sites (Who holds it) to see the lines too.'
            )}
      </p>
    </section>
  );
}

/** The Segments tab. */
export function Segments(props: IViewProps): JSX.Element | null {
  useReading(props, 'segments');
  return <SegmentsView {...props} />;
}

/** Whose map it is, when a worker's: its name, and why this one. */
function WorkerHeading(props: {
  worker: ISegmentsWorker;
  trans: TranslationBundle;
}): JSX.Element {
  const { worker, trans } = props;
  return (
    <div className="jp-GpuMem-segmentsOwner" data-pid={worker.pid}>
      <p className="jp-GpuMem-segmentsOwnerName">
        {trans.__(
          'The own allocator of %1',
          workerWords(worker.rank, worker.pid, trans, worker.host)
        )}
      </p>
      {worker.note && <p className="jp-GpuMem-whoHint">{worker.note}</p>}
      {worker.trimmed && (
        <p className="jp-GpuMem-whoHint">
          {trans.__(
            'Its snapshot was trimmed to be handed over: each run of adjacent live blocks is drawn as one block.'
          )}
        </p>
      )}
    </div>
  );
}

/** The device's name: the kernel's, or the worker's own for a worker's map. */
function deviceName(
  state: IGpuMemState,
  worker: ISegmentsWorker | undefined,
  index: number
): string {
  if (worker) {
    const w = state.process.sample?.workers?.find(x => x.pid === worker.pid);
    return w?.devices.find(d => d.index === index)?.name ?? '';
  }
  return state.process.sample?.devices.find(d => d.index === index)?.name ?? '';
}

/** A worker's refusal is the kernel's sentence about it, as it is. */
function workerError(state: IGpuMemState, error: IActionError): string | null {
  if (state.process.segmentsSource === null || error.code !== 'refused') {
    return null;
  }
  const text = error.message;
  return text.charAt(0).toUpperCase() + text.slice(1) + '.';
}

/** What the tab shows for one state; no hooks, for tests. */
export function SegmentsView(props: IViewProps): JSX.Element | null {
  const { state, trans } = props;
  return (
    <ReadingFrame<ISegmentsResult>
      {...props}
      view="segments"
      title={trans.__('Segments')}
      help={trans.__("Read the allocator's segments now (a snapshot, ~10 ms)")}
      controls={<RankChooser {...props} />}
      errorTitle={error => workerError(state, error)}
    >
      {data => (
        <>
          {data.worker && <WorkerHeading worker={data.worker} trans={trans} />}
          {data.devices.length === 0 ? (
            <p className="jp-GpuMem-whoHint">
              {data.worker
                ? trans.__("The worker's allocator holds no segment.")
                : trans.__(
                    "PyTorch's allocator holds no segment: CUDA is not initialised, or the cache is empty."
                  )}
            </p>
          ) : (
            data.devices.map(map => (
              <SegmentMapView
                key={map.device}
                map={map}
                deviceName={deviceName(state, data.worker, map.device)}
                trans={trans}
              />
            ))
          )}
        </>
      )}
    </ReadingFrame>
  );
}

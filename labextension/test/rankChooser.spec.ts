/**
 * The Segments tab's process chooser (protocol revision 12): this kernel or a
 * live worker of the latest sample; the request carries the worker's rank and
 * pid, a map read for another process is never shown under the new choice,
 * and a worker that did not answer is named in the kernel's own sentence.
 */
import * as React from 'react';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { READING_ARGS, readingArgs } from '../src/kernel/readings';
import { plainTrans } from '../src/present/trans';
import { GpuMemModel } from '../src/model';
import { ISegmentsResult, IWorker } from '../src/protocol';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import {
  RANK_REVISION,
  RankChooser,
  segmentsChoices
} from '../src/views/segments/rankChooser';
import { SegmentsView } from '../src/views/segments/segmentMap';
import { FakeKernel, FakeSession } from './fakes';
import {
  errorReply,
  GiB,
  helloResult,
  okReply,
  sample,
  STREAM
} from './fixtures';
import { byClass, findAll, render, text } from './render';

const trans = plainTrans as any;

function worker(
  pid: number,
  rank: number | null,
  overrides: Partial<IWorker> = {}
): IWorker {
  return {
    pid,
    rank,
    host: 'gpu-node',
    status: 'running',
    started_in_cell: true,
    age: 0.1,
    devices: [
      {
        index: 1,
        name: 'NVIDIA H200 (rank)',
        allocated: GiB,
        reserved: 2 * GiB,
        peak_allocated: 2 * GiB,
        peak_reserved: 2 * GiB,
        ooms: 0
      }
    ],
    ...overrides
  };
}

const WORKERS = [
  worker(4243, 1),
  worker(4242, 0),
  worker(4244, 2, { status: 'exited' }),
  worker(4245, null)
];

function stateAfter(
  events: GpuMemEvent[],
  options: { revision?: number; workers?: IWorker[] } = {}
) {
  const s = sample({ workers: options.workers ?? WORKERS });
  const hello = {
    ...helloResult(s),
    revision: options.revision ?? RANK_REVISION
  };
  const all: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', hello) },
    ...events
  ];
  return all.reduce(reduce, initialState());
}

function fakeModel() {
  return {
    settings: { units: 'binary' },
    fetchReading: vi.fn(async () => undefined),
    setReadingShown: vi.fn(),
    setSegmentsSource: vi.fn(async () => undefined),
    reportError: vi.fn()
  };
}

const WORKER_MAP: ISegmentsResult = {
  devices: [
    {
      device: 1,
      summary: {
        segments: 1,
        reserved: 2 * GiB,
        allocated: GiB,
        cached_free: GiB,
        releasable: 0,
        pieces: 1,
        pieces_bytes: GiB,
        largest_free_block: GiB,
        fragmentation: 1
      },
      segments: [
        {
          address: 0x7f0000000000,
          size: 2 * GiB,
          pool: 'large',
          stream: 0,
          expandable: false,
          blocks: [
            [0, GiB, 'allocated', -1],
            [GiB, GiB, 'piece', -1]
          ]
        }
      ],
      labels: [],
      omitted: 0,
      omitted_bytes: 0,
      tracking: false
    }
  ],
  worker: {
    pid: 4243,
    rank: 1,
    host: 'gpu-node',
    label: 'rank 1 (pid 4243)',
    note: '',
    trimmed: false
  }
};

describe('the choices', () => {
  it('lists this kernel and each live worker, by rank', () => {
    const choices = segmentsChoices(stateAfter([]), trans);
    expect(choices.map(c => c.label)).toEqual([
      'This kernel',
      'rank 0 (pid 4242)',
      'rank 1 (pid 4243)',
      'worker (pid 4245)'
    ]);
    expect(choices[2].source).toEqual({ pid: 4243, rank: 1 });
    expect(choices[0].source).toBeNull();
  });

  it('names the host where workers run on several', () => {
    const choices = segmentsChoices(
      stateAfter([], {
        workers: [worker(1, 0), worker(2, 1, { host: 'node-b' })]
      }),
      trans
    );
    expect(choices.map(c => c.label)).toEqual([
      'This kernel',
      'rank 0 (pid 1 on gpu-node)',
      'rank 1 (pid 2 on node-b)'
    ]);
  });

  it('keeps the chosen worker once it is no longer live', () => {
    const state = stateAfter([
      { type: 'segments_source', source: { pid: 4244, rank: 2 } }
    ]);
    const last = segmentsChoices(state, trans).pop()!;
    expect(last).toMatchObject({
      key: '4244',
      label: 'rank 2 (pid 4244), not running'
    });
  });
});

describe('the chooser', () => {
  it('shows a select of the choices; choosing asks the model', () => {
    const model = fakeModel();
    const nodes = render(
      React.createElement(RankChooser, {
        model: model as any,
        state: stateAfter([]),
        trans
      })
    );
    const [select] = findAll(nodes, n => n.type === 'select');
    expect(select.props.value).toBe('kernel');
    const options = findAll(nodes, n => n.type === 'option');
    expect(options.map(o => o.props.value)).toEqual([
      'kernel',
      '4242',
      '4243',
      '4245'
    ]);
    select.props.onChange({ target: { value: '4243' } });
    expect(model.setSegmentsSource).toHaveBeenCalledWith({
      pid: 4243,
      rank: 1
    });
    select.props.onChange({ target: { value: 'kernel' } });
    expect(model.setSegmentsSource).toHaveBeenLastCalledWith(null);
  });

  it('is not there without workers, or with an older kernel side', () => {
    const draw = (state: ReturnType<typeof stateAfter>) =>
      render(
        React.createElement(RankChooser, {
          model: fakeModel() as any,
          state,
          trans
        })
      );
    expect(draw(stateAfter([], { workers: [] }))).toEqual([]);
    expect(draw(stateAfter([], { revision: RANK_REVISION - 1 }))).toEqual([]);
    expect(draw(stateAfter([]))).toHaveLength(1);
  });
});

describe('the state', () => {
  it('forgets the reading of the process chosen before', () => {
    const read: GpuMemEvent[] = [
      { type: 'reading_sent', view: 'segments' },
      {
        type: 'reply',
        action: 'segments',
        reply: okReply('segments', { devices: [] })
      }
    ];
    const before = stateAfter(read);
    expect(before.process.readings.segments.status).toBe('ok');
    const after = reduce(before, {
      type: 'segments_source',
      source: { pid: 4243, rank: 1 }
    });
    expect(after.process.segmentsSource).toEqual({ pid: 4243, rank: 1 });
    expect(after.process.readings.segments.data).toBeNull();
    // the same choice again changes nothing
    expect(
      reduce(after, {
        type: 'segments_source',
        source: { pid: 4243, rank: 1 }
      })
    ).toBe(after);
    // a reply on its way for the old choice is dropped
    const crossed = [
      { type: 'reading_sent', view: 'segments' } as GpuMemEvent,
      {
        type: 'segments_source',
        source: null
      } as GpuMemEvent,
      {
        type: 'reply',
        action: 'segments',
        reply: okReply('segments', WORKER_MAP as any)
      } as GpuMemEvent
    ].reduce(reduce, after);
    expect(crossed.process.readings.segments.data).toBeNull();
  });

  it('goes back to the kernel when the process restarts, and knows the revision', () => {
    const state = stateAfter([
      { type: 'segments_source', source: { pid: 4243, rank: 1 } }
    ]);
    expect(state.revision).toBe(RANK_REVISION);
    const restarted = reduce(state, {
      type: 'kernel_status',
      status: 'restarting'
    });
    expect(restarted.process.segmentsSource).toBeNull();
  });

  it('asks for the chosen worker by rank and pid', () => {
    const state = stateAfter([
      { type: 'segments_source', source: { pid: 4245, rank: null } }
    ]);
    expect(readingArgs('segments', state)).toEqual({
      ...READING_ARGS.segments,
      pid: 4245
    });
    expect(
      readingArgs(
        'segments',
        reduce(state, {
          type: 'segments_source',
          source: { pid: 4243, rank: 1 }
        })
      )
    ).toEqual({ ...READING_ARGS.segments, pid: 4243, rank: 1 });
    expect(readingArgs('history', state)).toEqual(READING_ARGS.history);
  });
});

describe('the Segments tab with a worker chosen', () => {
  const chosen: GpuMemEvent = {
    type: 'segments_source',
    source: { pid: 4243, rank: 1 }
  };

  function view(events: GpuMemEvent[]) {
    return render(
      React.createElement(SegmentsView, {
        model: fakeModel() as any,
        state: stateAfter([chosen, ...events]),
        trans
      })
    );
  }

  it('titles the map with the worker and names its own device', () => {
    const nodes = view([
      { type: 'reading_sent', view: 'segments' },
      {
        type: 'reply',
        action: 'segments',
        reply: okReply('segments', WORKER_MAP as any)
      }
    ]);
    expect(text(byClass(nodes, 'jp-GpuMem-segmentsOwner'))).toBe(
      'The own allocator of rank 1 (pid 4243 on gpu-node)'
    );
    const [map] = byClass(nodes, 'jp-GpuMem-segmentMap');
    expect(map.props['data-device']).toBe(1);
    expect(text(map)).toContain('NVIDIA H200 (rank)');
    const blocks = byClass(map, 'jp-GpuMem-block');
    expect(
      blocks.map(b => [b.props['data-kind'], b.props['data-bytes']])
    ).toEqual([
      ['allocated', GiB],
      ['piece', GiB]
    ]);
    // the chooser sits beside Refresh
    const [select] = findAll(nodes, n => n.type === 'select');
    expect(select.props.value).toBe('4243');
  });

  it("says when a worker did not answer, in the kernel's sentence", () => {
    const nodes = view([
      { type: 'reading_sent', view: 'segments' },
      {
        type: 'reply',
        action: 'segments',
        reply: errorReply(
          'segments',
          'refused',
          'rank 1 (pid 4243) did not answer within 2 s'
        )
      }
    ]);
    expect(text(byClass(nodes, 'jp-GpuMem-readingError'))).toBe(
      'Rank 1 (pid 4243) did not answer within 2 s.'
    );
  });

  it('says the trimming and the choice among several of a rank', () => {
    const nodes = view([
      { type: 'reading_sent', view: 'segments' },
      {
        type: 'reply',
        action: 'segments',
        reply: okReply('segments', {
          ...WORKER_MAP,
          worker: {
            ...WORKER_MAP.worker!,
            trimmed: true,
            note: '2 live worker processes report rank 1 (pids 4240, 4243)'
          }
        } as any)
      }
    ]);
    const owner = text(byClass(nodes, 'jp-GpuMem-segmentsOwner'));
    expect(owner).toContain('2 live worker processes report rank 1');
    expect(owner).toContain('trimmed');
  });
});

describe('the model reads the chosen process', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });

  afterEach(() => {
    vi.useRealTimers();
  });

  async function flush(ms = 0): Promise<void> {
    await vi.advanceTimersByTimeAsync(ms);
  }

  it('asks with rank and pid, and again when the choice changes in flight', async () => {
    const model = new GpuMemModel();
    const kernel = new FakeKernel();
    model.setSource({
      label: 'Untitled.ipynb',
      sessionContext: new FakeSession(kernel) as any
    });
    model.setVisible(true);
    const hello = helloResult(sample({ workers: WORKERS }));
    kernel.last('hello').reply(
      okReply('hello', {
        ...hello,
        revision: RANK_REVISION,
        stream: { ...hello.stream, comm_id: 'comm-1' }
      })
    );
    await flush();
    kernel
      .last('subscribe')
      .reply(
        okReply('subscribe', { stream: { ...STREAM, comm_id: 'comm-1' } })
      );
    await flush();
    model.setReadingShown('segments', true);
    await flush();
    expect(kernel.requests('segments')).toHaveLength(1);
    kernel.last('segments').reply(okReply('segments', { devices: [] }));
    await flush();
    // rank 1 chosen: asked at once, by rank and pid
    void model.setSegmentsSource({ pid: 4243, rank: 1 });
    await flush();
    expect(kernel.requests('segments')).toHaveLength(2);
    const asked = kernel.last('segments');
    expect(asked.msg.content.args).toEqual({
      ...READING_ARGS.segments,
      pid: 4243,
      rank: 1
    });
    // back to the kernel before the worker answered: its answer is not shown,
    // and the kernel's map is read once it came
    void model.setSegmentsSource(null);
    await flush();
    expect(kernel.requests('segments')).toHaveLength(2);
    asked.reply(okReply('segments', WORKER_MAP as any));
    await flush();
    expect(model.state.process.readings.segments.data).toBeNull();
    expect(kernel.requests('segments')).toHaveLength(3);
    expect(kernel.last('segments').msg.content.args).toEqual(
      READING_ARGS.segments
    );
    kernel.last('segments').reply(okReply('segments', { devices: [] }));
    await flush();
    expect(model.state.process.readings.segments.status).toBe('ok');
    expect(model.state.process.readings.segments.data?.worker).toBeUndefined();
    model.dispose();
  });
});

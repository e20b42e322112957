/**
 * The Segments tab, drawn from the kernel's `segments` reply for the H200
 * recording (test/fixtures/segments.json, written by
 * tests/fixtures/make_panel_fixtures.py): 16 blocks of 64 MiB in one segment,
 * every other one freed, then a request that ran out of memory.
 */
import { readFileSync } from 'fs';
import { join } from 'path';
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { ISegment, ISegmentsResult } from '../src/protocol';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import { plainTrans } from '../src/present/trans';
import {
  segmentRuns,
  SegmentsView,
  SegmentMapView
} from '../src/views/segments/segmentMap';
import { errorReply, helloResult, MiB, okReply } from './fixtures';
import { byClass, findAll, render, text } from './render';

const trans = plainTrans as any;

const recorded = JSON.parse(
  readFileSync(join(__dirname, 'fixtures', 'segments.json'), 'utf8')
) as {
  reply: ISegmentsResult;
  truth: { largest_free_block: number; pieces_64mib: number };
};
const map = recorded.reply.devices[0];

function fakeModel() {
  return {
    settings: { units: 'binary' },
    fetchReading: vi.fn(async () => undefined),
    setReadingShown: vi.fn(),
    reportError: vi.fn()
  };
}

function stateAfter(events: GpuMemEvent[], actions?: string[]) {
  const hello = helloResult();
  if (actions) {
    hello.actions = actions;
  }
  const all: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', hello) },
    ...events
  ];
  return all.reduce(reduce, initialState());
}

const readOk: GpuMemEvent[] = [
  { type: 'reading_sent', view: 'segments' },
  {
    type: 'reply',
    action: 'segments',
    reply: okReply('segments', recorded.reply as any),
    at: Date.UTC(2026, 0, 1, 12)
  }
];

function view(events: GpuMemEvent[], actions?: string[]) {
  return render(
    React.createElement(SegmentsView, {
      model: fakeModel() as any,
      state: stateAfter(events, actions),
      trans
    })
  );
}

describe('the segment map', () => {
  it('draws the planted pieces to scale, the largest free block marked', () => {
    const nodes = render(
      React.createElement(SegmentMapView, {
        map,
        deviceName: 'NVIDIA H200',
        trans
      })
    );
    const rows = byClass(nodes, 'jp-GpuMem-segmentRow');
    expect(rows).toHaveLength(map.segments.length);
    // The largest segment first: 1 GiB with 16 blocks of 64 MiB, every
    // other one a free piece.
    const first = byClass(rows[0], 'jp-GpuMem-block');
    expect(first).toHaveLength(16);
    const pieces = first.filter(b => b.props['data-kind'] === 'piece');
    expect(pieces).toHaveLength(recorded.truth.pieces_64mib);
    for (const piece of pieces) {
      expect(piece.props['data-bytes']).toBe(64 * MiB);
      expect(piece.props.style.width).toBe('6.250%');
    }
    expect(first[1].props.style.left).toBe('6.250%');
    const largest = byClass(nodes, 'jp-mod-largest');
    expect(largest).toHaveLength(1);
    expect(largest[0].props['data-bytes']).toBe(
      recorded.truth.largest_free_block
    );
    // The summary calls out what the recording planted.
    const figure = (name: string) =>
      text(findAll(nodes, n => n.props['data-figure'] === name));
    expect(figure('pieces')).toBe(
      `${map.summary.pieces} (${(map.summary.pieces_bytes / MiB).toFixed(0)} MiB)`
    );
    expect(figure('largest')).toBe('64.0 MiB');
    expect(figure('fragmentation')).toBe('100%');
    expect(figure('segments')).toBe(String(map.summary.segments));
  });

  it('names the line that allocated a block in its title', () => {
    const runs = segmentRuns(
      map.segments[0],
      map.labels,
      map.summary.largest_free_block
    );
    const live = runs.find(r => r.kind === 'allocated')!;
    expect(live.site).toContain('In[14] line 2');
    expect(live.site).toContain('torch.empty(64 << 20');
  });

  it('merges runs of tiny blocks of one kind, keeping bytes and counts', () => {
    const KiB = 1024;
    const segment: ISegment = {
      address: 0,
      size: 2 * MiB,
      pool: 'small',
      stream: 0,
      expandable: false,
      blocks: [
        ...Array.from(
          { length: 100 },
          (_, i) => [i * 512, 512, 'allocated', -1] as ISegment['blocks'][0]
        ),
        [50 * KiB, 2 * MiB - 50 * KiB, 'cached', -1]
      ]
    };
    const runs = segmentRuns(segment, [], 0);
    expect(runs.length).toBeLessThan(10);
    const allocated = runs.filter(r => r.kind === 'allocated');
    expect(allocated.reduce((s, r) => s + r.size, 0)).toBe(100 * 512);
    expect(allocated.reduce((s, r) => s + r.blocks, 0)).toBe(100);
    expect(runs[runs.length - 1]).toMatchObject({
      kind: 'cached',
      blocks: 1,
      size: 2 * MiB - 50 * KiB
    });
  });

  it('escapes hostile lines (React text, never markup)', () => {
    const evil = '<img src=x onerror=alert(1)>';
    const nodes = render(
      React.createElement(SegmentMapView, {
        map: { ...map, labels: [evil, ...map.labels.slice(1)] },
        deviceName: evil,
        trans
      })
    );
    expect(text(nodes)).toContain(evil);
    const titled = findAll(nodes, n =>
      String(n.props.title ?? '').includes(evil)
    );
    expect(titled.length).toBeGreaterThan(0);
    expect(findAll(nodes, n => n.type === 'img')).toHaveLength(0);
  });
});

describe('the Segments tab', () => {
  it('says it was not read yet, then shows the map once read', () => {
    expect(text(view([]))).toContain('Not read yet');
    const nodes = view(readOk);
    expect(byClass(nodes, 'jp-GpuMem-segmentMap')).toHaveLength(1);
    expect(findAll(nodes, n => n.props['data-reading'] === 'ok')).toHaveLength(
      1
    );
  });

  it("shows the kernel's refusal, keeping the last map", () => {
    const refused = view([
      ...readOk,
      { type: 'reading_sent', view: 'segments' },
      {
        type: 'reply',
        action: 'segments',
        reply: errorReply(
          'segments',
          'refused',
          'CUDA is not initialised in this kernel'
        )
      }
    ]);
    expect(text(byClass(refused, 'jp-GpuMem-readingError'))).toContain(
      'Segments refused: CUDA is not initialised in this kernel'
    );
    expect(byClass(refused, 'jp-GpuMem-segmentMap')).toHaveLength(1);
    expect(byClass(refused, 'jp-mod-stale')).toHaveLength(1);
  });

  it('says when the kernel side is too old for it', () => {
    expect(text(view([], ['hello', 'sample']))).toContain('too old');
  });

  it('says a timeout in words', () => {
    const nodes = view([
      { type: 'reading_sent', view: 'segments' },
      { type: 'no_reply', action: 'segments' }
    ]);
    expect(text(nodes)).toContain('the kernel did not answer in time');
  });
});

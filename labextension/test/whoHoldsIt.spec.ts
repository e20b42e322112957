/**
 * The "Who holds it" tab for each state of its reading.
 */
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { IWhoResult, PROTOCOL_REVISION } from '../src/protocol';
import { GpuMemEvent, IGpuMemState, initialState, reduce } from '../src/state';
import { plainTrans } from '../src/present/trans';
import { TABS } from '../src/views/tabs';
import { WhoHoldsIt, WhoView } from '../src/views/who/whoHoldsIt';
import {
  errorReply,
  GiB,
  helloResult,
  lineReport,
  MiB,
  okReply,
  postmortem,
  sample,
  whoReport,
  whoResult
} from './fixtures';
import { byClass, Child, findAll, INode, render, text } from './render';

const trans = plainTrans as any;

function fakeModel() {
  return {
    settings: { units: 'binary' },
    who: vi.fn(async () => undefined),
    setTracking: vi.fn(async () => undefined),
    releaseTraceback: vi.fn(async () => undefined),
    reportError: vi.fn(),
    setWhoShown: vi.fn()
  };
}

function stateAfter(
  events: GpuMemEvent[],
  options: { actions?: string[]; devices?: boolean } = {}
): IGpuMemState {
  const hello = helloResult(
    options.devices === false ? sample({ devices: [] }) : sample()
  );
  if (options.actions) {
    hello.actions = options.actions;
  }
  const all: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', hello) },
    ...events
  ];
  return all.reduce(reduce, initialState());
}

const sent: GpuMemEvent = { type: 'who_sent' };

function read(result: IWhoResult = whoResult()): GpuMemEvent[] {
  return [
    sent,
    {
      type: 'reply',
      action: 'who',
      reply: okReply('who', result as any),
      at: Date.UTC(2026, 0, 1, 12, 0, 0)
    }
  ];
}

function view(state: IGpuMemState, model = fakeModel()): Child[] {
  return render(
    React.createElement(WhoView, { model: model as any, state, trans })
  );
}

function row(nodes: Child[], by: string, key: string): INode {
  const [table] = findAll(
    nodes,
    n => n.type === 'table' && n.props['data-by'] === by
  );
  expect(table).toBeDefined();
  const rows = findAll(
    table,
    n => n.type === 'tr' && n.props['data-key'] === key
  );
  expect(rows).toHaveLength(1);
  return rows[0];
}

function button(nodes: Child[], label: RegExp): INode {
  const found = findAll(
    nodes,
    n => n.type === 'button' && label.test(n.props['aria-label'] ?? '')
  );
  expect(found).toHaveLength(1);
  return found[0];
}

describe('the Who holds it tab', () => {
  it('is a tab after Overview, History and Segments', () => {
    expect(TABS.slice(0, 4).map(t => [t.id, t.label(trans)])).toEqual([
      ['overview', 'Overview'],
      ['history', 'History'],
      ['segments', 'Segments'],
      ['who', 'Who holds it']
    ]);
    expect(TABS[3].view).toBe(WhoHoldsIt);
  });

  it('shows the owners with their sizes, shares and what the names explain', () => {
    const model = fakeModel();
    const nodes = view(stateAfter(read()), model);
    const base = row(nodes, 'variable', 'base');
    expect(base.props['data-bytes']).toBe(64 * MiB);
    // Tracking on: where the owner's block was allocated.
    expect(text(byClass(base, 'jp-GpuMem-whoSite'))).toBe(
      'allocated at In[8] line 1'
    );
    expect(byClass(row(nodes, 'variable', 'a'), 'jp-GpuMem-whoSite')).toEqual(
      []
    );
    expect(text(byClass(base, 'jp-GpuMem-whoBytes'))).toBe('64.00 MiB');
    expect(byClass(base, 'jp-GpuMem-shareFill')[0].props.style.width).toBe(
      '64.00%'
    );
    expect(
      text(byClass(row(nodes, 'variable', 'a'), 'jp-GpuMem-whoBytes'))
    ).toBe('3.00 MiB');
    const unreachable = row(
      nodes,
      'variable',
      'not reachable from the namespace'
    );
    expect(unreachable.props['data-kind']).toBe('unreachable');
    expect(text(byClass(nodes, 'jp-GpuMem-whoExplained'))).toBe(
      'names explain 67.00 MiB of 100.00 MiB (67%)'
    );
    expect(text(nodes)).toContain('Read at');
    // No lines without tracking: a hint instead.
    expect(findAll(nodes, n => n.props['data-by'] === 'line')).toHaveLength(0);
    expect(text(byClass(nodes, 'jp-GpuMem-whoHint'))).toContain(
      'Track allocation sites'
    );
    // Refresh reads again.
    button(nodes, /^Refresh/).props.onClick();
    expect(model.who).toHaveBeenCalledTimes(1);
    // No kept traceback, no Release traceback.
    expect(
      findAll(nodes, n =>
        /^Release traceback/.test(n.props['aria-label'] ?? '')
      )
    ).toHaveLength(0);
    // The device's name from the sample.
    expect(text(byClass(nodes, 'jp-GpuMem-deviceTitle'))).toBe(
      'GPU 0 NVIDIA H200'
    );
  });

  it('switches tracking from its checkbox and shows the lines once on', () => {
    const model = fakeModel();
    const off = view(stateAfter(read()), model);
    const [box] = findAll(off, n => n.type === 'input');
    expect(box.props.type).toBe('checkbox');
    expect(box.props.checked).toBe(false);
    box.props.onChange();
    expect(model.setTracking).toHaveBeenCalledWith(true);

    const tracked = whoResult({
      tracking: true,
      devices: [
        {
          index: 0,
          by_variable: whoReport({ tracking: true }),
          by_line: lineReport()
        }
      ]
    });
    const on = view(stateAfter(read(tracked)), model);
    const [checked] = findAll(on, n => n.type === 'input');
    expect(checked.props.checked).toBe(true);
    const line = row(on, 'line', 'In[8] line 1');
    expect(text(line)).toContain(
      "`base = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')`"
    );
    expect(text(line)).toContain('held by base');
    expect(
      row(on, 'line', 'no Python stack (backward pass or C++)').props[
        'data-kind'
      ]
    ).toBe('untracked');
    expect(text(byClass(on, 'jp-GpuMem-whoExplained'))).toContain(
      'lines explain 64.00 MiB of 100.00 MiB (64%)'
    );
    checked.props.onChange();
    expect(model.setTracking).toHaveBeenLastCalledWith(false);
  });

  it('says why tracking cannot switch while an action waits', () => {
    const model = fakeModel();
    const state = stateAfter([
      ...read(),
      { type: 'pending', action: 'empty_cache' }
    ]);
    const [box] = findAll(view(state, model), n => n.type === 'input');
    expect(box.props['aria-disabled']).toBe(true);
    box.props.onChange();
    expect(model.setTracking).not.toHaveBeenCalled();
    expect(model.reportError).toHaveBeenCalledWith(
      'track',
      'Waiting for the kernel to answer…'
    );
  });

  it('offers Release traceback when a kept traceback holds memory', () => {
    const model = fakeModel();
    const held = whoResult({
      devices: [
        {
          index: 0,
          by_variable: whoReport({
            rows: [
              {
                key: 'traceback: g: big',
                detail: 'kept traceback',
                bytes: 1 * GiB,
                blocks: 1,
                example: 'big',
                kind: 'owner',
                site: ''
              }
            ]
          }),
          by_line: null
        }
      ]
    });
    const nodes = view(stateAfter(read(held)), model);
    const release = button(nodes, /^Release traceback/);
    expect(release.props['aria-disabled']).toBe(false);
    release.props.onClick();
    expect(model.releaseTraceback).toHaveBeenCalledTimes(1);
  });

  it('says busy, and keeps the older reading dimmed', () => {
    const busy: GpuMemEvent = {
      type: 'reply',
      action: 'who',
      reply: errorReply('who', 'busy', 'busy: available when the cell ends')
    };
    const first = view(stateAfter([sent, busy]));
    expect(text(byClass(first, 'jp-GpuMem-messageTitle'))).toBe(
      'busy: available when the cell ends'
    );
    expect(text(first)).toContain('This tab reads again when the cell ends.');
    expect(byClass(first, 'jp-GpuMem-whoData')).toHaveLength(0);

    const later = view(stateAfter([...read(), sent, busy]));
    expect(text(byClass(later, 'jp-GpuMem-messageTitle'))).toBe(
      'busy: available when the cell ends'
    );
    const [data] = byClass(later, 'jp-GpuMem-whoData');
    expect(data.props.className).toContain('jp-mod-stale');
    expect(row(later, 'variable', 'base').props['data-bytes']).toBe(64 * MiB);
  });

  it("shows the kernel's reason when it refuses or fails", () => {
    const refused = view(
      stateAfter([
        sent,
        {
          type: 'reply',
          action: 'who',
          reply: errorReply(
            'who',
            'refused',
            'CUDA is not initialised in this kernel: PyTorch holds no GPU memory yet'
          )
        }
      ])
    );
    expect(text(byClass(refused, 'jp-GpuMem-whoError'))).toBe(
      'Nothing to attribute CUDA is not initialised in this kernel: PyTorch holds no GPU memory yet'
    );
    const failed = view(
      stateAfter([
        sent,
        {
          type: 'reply',
          action: 'who',
          reply: errorReply('who', 'failed', 'RuntimeError: walk exploded')
        }
      ])
    );
    expect(text(byClass(failed, 'jp-GpuMem-whoError'))).toBe(
      'Reading who holds the memory failed RuntimeError: walk exploded'
    );
    const timeout = view(
      stateAfter([sent, { type: 'no_reply', action: 'who' }])
    );
    expect(text(byClass(timeout, 'jp-GpuMem-whoError'))).toContain(
      'The kernel did not answer in time'
    );
  });

  it('says when the kernel side is too old for it', () => {
    const nodes = view(
      stateAfter([], {
        actions: ['hello', 'sample', 'empty_cache', 'subscribe', 'unsubscribe']
      })
    );
    expect(text(byClass(nodes, 'jp-GpuMem-messageTitle'))).toBe(
      "This kernel's jupyter_gpumem is too old for this view"
    );
    expect(text(nodes)).toContain(
      `Who holds it needs jupyter_gpumem with protocol revision ${PROTOCOL_REVISION} in the kernel (it has 0.1.0)`
    );
    expect(findAll(nodes, n => n.type === 'button')).toHaveLength(0);
  });

  it('says something in every other state', () => {
    expect(text(view(stateAfter([])))).toContain('Not read yet');
    expect(text(view(stateAfter([sent])))).toContain(
      'Reading who holds the memory…'
    );
    expect(text(view(stateAfter([...read(), sent])))).toContain('Reading…');
    expect(text(view(stateAfter([], { devices: false })))).toBe(
      'The kernel reports no device'
    );
    expect(text(view(stateAfter(read(whoResult({ devices: [] })))))).toContain(
      "PyTorch's allocator holds no memory: nothing to attribute"
    );
    // Without figures the kernel's message above the tabs speaks.
    const events: GpuMemEvent[] = [
      { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
      {
        type: 'reply',
        action: 'hello',
        reply: okReply(
          'hello',
          helloResult(sample({ state: 'no_torch', devices: [] }))
        )
      }
    ];
    const noTorch = events.reduce(reduce, initialState());
    expect(view(noTorch)).toEqual([]);
  });

  it('explains an out-of-memory error with the fixes, best first', () => {
    const nodes = view(
      stateAfter(read(whoResult({ postmortems: [postmortem()] })))
    );
    const [oom] = byClass(nodes, 'jp-GpuMem-oom');
    expect(text(byClass(oom, 'jp-GpuMem-oomTitle'))).toBe(
      'Out of memory on GPU 0'
    );
    const figure = (name: string) =>
      text(findAll(oom, n => n.props['data-figure'] === name));
    expect(figure('oom_requested')).toBe('128.00 MiB');
    expect(figure('oom_free')).toBe('138.00 GiB');
    expect(figure('oom_cap')).toBe('1.13 GiB');
    expect(figure('oom_largest_free_block')).toBe('64.00 MiB');
    expect(figure('oom_free_pieces')).toBe('13 pieces, 532.00 MiB');
    const fixes = byClass(oom, 'jp-GpuMem-fix');
    expect(fixes.map(f => f.props['data-fix'])).toEqual([
      'fragmentation',
      'delete',
      'empty_cache'
    ]);
    expect(fixes.map(f => text(byClass(f, 'jp-GpuMem-fits')))).toEqual([
      'fits',
      'maybe',
      'no'
    ]);
    expect(text(fixes[0])).toContain(
      'largest free block 64.00 MiB < 128.00 MiB requested'
    );
    // A command is shown apart only when the text does not say it.
    expect(byClass(fixes[0], 'jp-GpuMem-fixCommand')).toHaveLength(0);
    expect(text(byClass(fixes[2], 'jp-GpuMem-fixCommand'))).toBe(
      '%gpumem empty-cache'
    );
  });

  it('judges the fixes against what the cell needs (revision 6)', () => {
    const pm = postmortem({
      need: 10 * GiB,
      need_full: 100 * GiB,
      room: 9 * GiB,
      hint: '`batch` = 64 needs about 100.00 GiB; 12 fits in 24 GiB (verified)',
      fixes: [
        {
          kind: 'traceback',
          text: 'first, before any retry: `%gpumem release-traceback` frees 8.82 GiB',
          frees: 8.82 * GiB,
          fits: null,
          command: '%gpumem release-traceback',
          first_step: true,
          shortfall: null
        },
        {
          kind: 'delete',
          text: '`del opt` frees 967.40 MiB: not enough',
          frees: 967 * MiB,
          fits: false,
          command: 'del opt',
          first_step: false,
          shortfall: 2 * GiB
        }
      ]
    });
    const nodes = view(stateAfter(read(whoResult({ postmortems: [pm] }))));
    const [oom] = byClass(nodes, 'jp-GpuMem-oom');
    const figure = (name: string) =>
      text(findAll(oom, n => n.props['data-figure'] === name));
    expect(figure('oom_need')).toBe('10.00 GiB');
    expect(figure('oom_need_full')).toBe('100.00 GiB');
    expect(figure('oom_room')).toBe('9.00 GiB');
    expect(text(byClass(oom, 'jp-GpuMem-oomHint'))).toBe(pm.hint);
    const fixes = byClass(oom, 'jp-GpuMem-fix');
    expect(fixes.map(f => f.props['data-fits'])).toEqual(['first', 'no']);
    const labels = fixes.map(f => byClass(f, 'jp-GpuMem-fits')[0]);
    expect(labels.map(l => text(l))).toEqual(['first', 'no']);
    expect(labels[0].props.title).toContain('A first step before any retry');
    expect(labels[1].props.title).toBe('Not enough (2.00 GiB short)');
  });

  it('shows no need figures for an older kernel (revision 5)', () => {
    const nodes = view(
      stateAfter(read(whoResult({ postmortems: [postmortem()] })))
    );
    const [oom] = byClass(nodes, 'jp-GpuMem-oom');
    const names = findAll(oom, n => n.props['data-figure'] !== undefined).map(
      n => n.props['data-figure']
    );
    expect(names).not.toContain('oom_need');
    expect(byClass(oom, 'jp-GpuMem-oomHint')).toHaveLength(0);
  });

  it("renders the kernel's strings as text", () => {
    const evil = '<img src=x onerror="alert(1)">';
    const nodes = view(
      stateAfter(
        read(
          whoResult({
            devices: [
              {
                index: 0,
                by_variable: whoReport({
                  notes: [evil],
                  rows: [
                    {
                      key: evil,
                      detail: evil,
                      bytes: 1,
                      blocks: 1,
                      example: evil,
                      kind: 'owner',
                      site: ''
                    }
                  ]
                }),
                by_line: null
              }
            ]
          })
        )
      )
    );
    const strings: string[] = [];
    const collect = (children: Child[]) =>
      children.forEach(c =>
        typeof c === 'string' ? strings.push(c) : collect(c.children)
      );
    collect(nodes);
    expect(strings.filter(s => s.includes(evil)).length).toBeGreaterThanOrEqual(
      3
    );
    expect(
      findAll(nodes, n => 'dangerouslySetInnerHTML' in n.props)
    ).toHaveLength(0);
    expect(findAll(nodes, n => n.type === 'img')).toHaveLength(0);
  });
});

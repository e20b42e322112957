/**
 * The Who tab's Free as drawn: a button per owner (and per post-mortem fix
 * that deletes names), the preview under its row with *Free it* and *Cancel*,
 * the result, busy and refusals; nothing of it for a kernel that cannot free.
 */
import * as React from 'react';
import { describe, expect, it, vi } from 'vitest';

import { IWhoResult } from '../src/protocol';
import { plainTrans } from '../src/present/trans';
import {
  FreeOrigin,
  GpuMemEvent,
  IGpuMemState,
  initialState,
  reduce
} from '../src/state';
import { WhoView } from '../src/views/who/whoHoldsIt';
import {
  ACTIONS_BEFORE_FREE,
  errorReply,
  freeReport,
  GiB,
  helloResult,
  MiB,
  okReply,
  postmortem,
  sample,
  whoReport,
  whoResult
} from './fixtures';
import { byClass, Child, findAll, INode, render, text } from './render';

const trans = plainTrans as any;
const BASE: FreeOrigin = { kind: 'owner', device: 0, key: 'base' };

function fakeModel() {
  return {
    settings: { units: 'binary' },
    who: vi.fn(async () => undefined),
    setTracking: vi.fn(async () => undefined),
    releaseTraceback: vi.fn(async () => undefined),
    previewFree: vi.fn(async () => undefined),
    confirmFree: vi.fn(async () => undefined),
    retryFree: vi.fn(async () => undefined),
    closeFree: vi.fn(),
    reportError: vi.fn(),
    setWhoShown: vi.fn()
  };
}

function stateAfter(
  events: GpuMemEvent[],
  result: IWhoResult = whoResult(),
  actions?: string[]
): IGpuMemState {
  const hello = helloResult();
  if (actions) {
    hello.actions = actions;
  }
  const all: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'a.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', hello) },
    { type: 'who_sent' },
    { type: 'reply', action: 'who', reply: okReply('who', result as any) },
    ...events
  ];
  return all.reduce(reduce, initialState());
}

function sent(dry: boolean, origin = BASE, names = ['base']): GpuMemEvent {
  return { type: 'free_sent', names, dry, origin };
}

function answer(dry: boolean, reply: any, names = ['base']): GpuMemEvent {
  return { type: 'reply', action: 'free', reply, args: { names, dry } };
}

const PREVIEW = [
  sent(true),
  answer(true, okReply('free', { report: freeReport(), sample: sample() }))
];

function view(state: IGpuMemState, model = fakeModel()): Child[] {
  return render(
    React.createElement(WhoView, { model: model as any, state, trans })
  );
}

function freeButtons(nodes: Child[] | Child): INode[] {
  return findAll(
    nodes,
    n => n.type === 'button' && /^Free /.test(n.props['aria-label'] ?? '')
  );
}

function labelled(nodes: Child[] | Child, label: string): INode {
  const found = findAll(nodes, n => n.type === 'button' && text(n) === label);
  expect(found).toHaveLength(1);
  return found[0];
}

describe('Free in the Who tab', () => {
  it('puts a Free button on owner rows only', () => {
    const model = fakeModel();
    const nodes = view(stateAfter([]), model);
    const buttons = freeButtons(nodes);
    // base and a; not the unreachable memory.
    expect(buttons.map(b => b.props['aria-label'])).toEqual([
      'Free base: preview what letting it go gives back',
      'Free a: preview what letting it go gives back'
    ]);
    expect(buttons[0].props['aria-expanded']).toBe(false);
    expect(buttons[0].props.title).toContain('%gpumem free base');
    buttons[0].props.onClick();
    expect(model.previewFree).toHaveBeenCalledWith(['base'], BASE);
    // Nothing opened yet.
    expect(byClass(nodes, 'jp-GpuMem-free')).toHaveLength(0);
  });

  it("has no Free for a kernel that cannot free, a traceback's local or a line", () => {
    expect(
      freeButtons(view(stateAfter([], whoResult(), ACTIONS_BEFORE_FREE)))
    ).toEqual([]);
    const rows = [
      ...whoReport().rows,
      {
        key: 'traceback: g: big',
        detail: 'kept traceback',
        bytes: GiB,
        blocks: 1,
        example: 'big',
        kind: 'owner' as const,
        site: ''
      },
      {
        key: 'base',
        detail: 'gradients',
        bytes: MiB,
        blocks: 1,
        example: 'base.grad',
        kind: 'owner' as const,
        site: ''
      }
    ];
    const result = whoResult({
      devices: [{ index: 0, by_variable: whoReport({ rows }), by_line: null }]
    });
    const labels = freeButtons(view(stateAfter([], result))).map(
      b => b.props['aria-label']
    );
    // One per name (base's gradients row shares its first row's), none for
    // the traceback's local.
    expect(labels).toHaveLength(2);
    expect(labels.join()).not.toContain('traceback');
  });

  it('shows the plan under its row, with Free it and Cancel', () => {
    const model = fakeModel();
    const waiting = view(stateAfter([sent(true)]), model);
    expect(text(byClass(waiting, 'jp-GpuMem-freeStatus'))).toBe(
      'Finding what holds it…'
    );
    const nodes = view(stateAfter(PREVIEW), model);
    const [row] = findAll(
      nodes,
      n => n.type === 'tr' && n.props.className === 'jp-GpuMem-freeRow'
    );
    expect(row.props['data-key']).toBe('base');
    const [panel] = byClass(row, 'jp-GpuMem-free');
    expect(panel.props['aria-label']).toBe('Free base');
    expect(panel.props['data-free']).toBe('preview');
    expect(text(byClass(panel, 'jp-GpuMem-freeHeld'))).toBe(
      'Holds 64.00 MiB on GPU 0'
    );
    const letGo = findAll(
      byClass(panel, 'jp-GpuMem-freeLetGo'),
      n => n.type === 'li'
    );
    expect(letGo.map(li => text(li))).toEqual([
      'del base the name you gave 64.00 MiB',
      'del view a part of base 64.00 MiB'
    ]);
    expect(text(byClass(panel, 'jp-GpuMem-freeExpected'))).toBe(
      'Expected back to the driver: 64.00 MiB on GPU 0'
    );
    expect(freeButtons(nodes)[0].props['aria-expanded']).toBe(true);
    const confirm = labelled(panel, 'Free it');
    expect(confirm.props.autoFocus).toBe(true);
    confirm.props.onClick();
    expect(model.confirmFree).toHaveBeenCalledTimes(1);
    labelled(panel, 'Cancel').props.onClick();
    expect(model.closeFree).toHaveBeenCalledTimes(1);
    // Escape closes too.
    panel.props.onKeyDown({ key: 'Escape', stopPropagation: () => undefined });
    expect(model.closeFree).toHaveBeenCalledTimes(2);
  });

  it('names what is left as it is, and what the cache already held', () => {
    const report = freeReport({
      kept: [
        {
          holder: 'results',
          bytes: 3 * MiB,
          example: "results['base']",
          why: 'also holds 1.00 GiB of other GPU memory: left as it is',
          fix: "del results['base']"
        }
      ]
    });
    report.devices[0].cached_free = 2 * MiB;
    const nodes = view(
      stateAfter([
        sent(true),
        answer(true, okReply('free', { report, sample: sample() }))
      ])
    );
    expect(text(byClass(nodes, 'jp-GpuMem-freeKept'))).toBe(
      "results 3.00 MiB e.g. results['base'] also holds 1.00 GiB of other GPU memory: left as it is to free it: del results['base']"
    );
    expect(text(byClass(nodes, 'jp-GpuMem-freeExpected'))).toBe(
      'Expected back to the driver: 64.00 MiB on GPU 0 (2.00 MiB of it already free in the cache)'
    );
  });

  it('shows what came back to the driver, and what still holds the rest', () => {
    const report = freeReport(
      {
        done: true,
        still: [
          {
            holder: 'no Python object',
            bytes: 16 * MiB,
            example: '',
            why: 'a C/C++ extension',
            fix: ''
          }
        ]
      },
      48 * MiB
    );
    // After the free, base left the table: the result shows above it.
    const gone = whoResult({
      devices: [
        {
          index: 0,
          by_variable: whoReport({ rows: whoReport().rows.slice(1) }),
          by_line: null
        }
      ]
    });
    const model = fakeModel();
    const nodes = view(
      stateAfter(
        [
          ...PREVIEW,
          sent(false),
          answer(false, okReply('free', { report, sample: sample() }))
        ],
        gone
      ),
      model
    );
    const [panel] = byClass(nodes, 'jp-GpuMem-free');
    expect(panel.props['data-free']).toBe('done');
    expect(text(byClass(panel, 'jp-GpuMem-freeName'))).toBe('Freed base');
    expect(text(byClass(panel, 'jp-GpuMem-freeReturned'))).toBe(
      'Came back to the driver on GPU 0: 48.00 MiB (75% of what it held, 75% of the expected); allocated fell by 64.00 MiB'
    );
    expect(text(byClass(panel, 'jp-GpuMem-freeStill'))).toBe(
      'no Python object 16.00 MiB a C/C++ extension'
    );
    expect(text(byClass(panel, 'jp-GpuMem-freeTitle'))).toContain('Let go of');
    labelled(panel, 'Close').props.onClick();
    expect(model.closeFree).toHaveBeenCalledTimes(1);
    // The row is gone from the table: no Free for it.
    expect(freeButtons(nodes).map(b => b.props['aria-label'])).toEqual([
      'Free a: preview what letting it go gives back'
    ]);
  });

  it('says plainly when nothing was measured (a replay)', () => {
    const report = freeReport({
      done: true,
      notes: ['replayed on recorded data: nothing was measured']
    });
    const nodes = view(
      stateAfter([
        ...PREVIEW,
        sent(false),
        answer(false, okReply('free', { report, sample: sample() }))
      ])
    );
    expect(text(byClass(nodes, 'jp-GpuMem-freeReturned'))).toBe(
      'GPU 0: nothing was measured'
    );
    expect(text(byClass(nodes, 'jp-GpuMem-freeNotes'))).toBe(
      'replayed on recorded data: nothing was measured'
    );
  });

  it('says busy while a cell runs, and offers to try again', () => {
    const model = fakeModel();
    const nodes = view(
      stateAfter([
        ...PREVIEW,
        sent(false),
        answer(
          false,
          errorReply('free', 'busy', 'busy: available when the cell ends')
        )
      ]),
      model
    );
    const [busy] = byClass(nodes, 'jp-GpuMem-freeBusy');
    expect(busy.props.role).toBe('status');
    expect(text(busy)).toContain(
      'busy: available when the cell ends Nothing was let go.'
    );
    labelled(busy, 'Try again').props.onClick();
    expect(model.retryFree).toHaveBeenCalledTimes(1);
  });

  it("shows the kernel's refusal", () => {
    const nodes = view(
      stateAfter([
        sent(true),
        answer(
          true,
          errorReply(
            'free',
            'refused',
            "base hold(s) no GPU memory of this process's allocator: nothing to free"
          )
        )
      ])
    );
    const [error] = byClass(nodes, 'jp-GpuMem-freeError');
    expect(error.props.role).toBe('alert');
    expect(text(byClass(error, 'jp-GpuMem-messageTitle'))).toBe(
      "base hold(s) no GPU memory of this process's allocator: nothing to free"
    );
  });

  it("makes a post-mortem's del fix one click, previewed under the fix", () => {
    const pm = postmortem({
      fixes: [
        ...postmortem().fixes,
        {
          kind: 'delete',
          text: '`del blocks` frees 512.00 MiB',
          frees: 512 * MiB,
          fits: null,
          command: 'del blocks',
          free_names: ['blocks']
        }
      ]
    });
    const result = whoResult({ postmortems: [pm] });
    const model = fakeModel();
    const nodes = view(stateAfter([], result), model);
    const [oom] = byClass(nodes, 'jp-GpuMem-oom');
    const buttons = freeButtons(oom);
    // Only the fix that deletes names: not the unreachable memory's.
    expect(buttons.map(b => b.props['aria-label'])).toEqual([
      'Free blocks: preview what letting it go gives back'
    ]);
    buttons[0].props.onClick();
    const fix: FreeOrigin = { kind: 'fix', device: 0, index: 3 };
    expect(model.previewFree).toHaveBeenCalledWith(['blocks'], fix);
    const open = view(
      stateAfter(
        [
          sent(true, fix, ['blocks']),
          answer(
            true,
            okReply('free', {
              report: freeReport({ names: ['blocks'] }),
              sample: sample()
            }),
            ['blocks']
          )
        ],
        result
      )
    );
    const [item] = findAll(
      open,
      n =>
        n.type === 'li' &&
        n.props['data-fix'] === 'delete' &&
        text(n).includes('blocks')
    );
    expect(byClass(item, 'jp-GpuMem-free')).toHaveLength(1);
    // Only there: not under an owner row.
    expect(byClass(open, 'jp-GpuMem-free')).toHaveLength(1);
  });
});

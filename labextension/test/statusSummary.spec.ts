/**
 * What the status bar says: the busiest GPU, the warning near the cap or the
 * device's end, the text, the replay marker; and the item and the replay
 * banner drawn from them.
 */
import { describe, expect, it, vi } from 'vitest';
import * as React from 'react';

import { plainTrans } from '../src/present/trans';
import { replayBody, replayText } from '../src/present/replay';
import {
  busiestDevice,
  NEAR_THE_END,
  nearTheEnd,
  statusSummary
} from '../src/present/statusSummary';
import { IReplay, ISample } from '../src/protocol';
import { GpuMemEvent, initialState, reduce } from '../src/state';
import { ReplayBanner } from '../src/views/frame/replayBanner';
import { StatusItem } from '../src/views/statusBar/statusItem';
import {
  device,
  GiB,
  helloResult,
  MiB,
  okReply,
  sample,
  uninitializedDevice
} from './fixtures';
import { byClass, render, text } from './render';

const trans = plainTrans as any;

/** The recording's words, as the kernel side writes them. */
const REPLAY: IReplay = {
  gpu: 'NVIDIA H200',
  torch_version: '2.11.0+cu130',
  recorded: '2026-11-21',
  description:
    'replay: readings recorded on an NVIDIA H200 with torch 2.11.0+cu130 on 2026-11-21 are replayed; nothing here is measured on this machine (this kernel: torch 2.13.0+cpu)'
};

function stateWith(s: ISample) {
  const events: GpuMemEvent[] = [
    { type: 'follow', kernelId: 'k1', source: 'train.ipynb' },
    { type: 'reply', action: 'hello', reply: okReply('hello', helloResult(s)) }
  ];
  return events.reduce(reduce, initialState());
}

describe('the busiest GPU', () => {
  it('is the one with the most reserved, of those with figures', () => {
    const devices = [
      device({ index: 0, reserved: 2 * GiB }),
      device({ index: 1, reserved: 6 * GiB }),
      device({ index: 2, reserved: 4 * GiB }),
      // more reserved than any, but no allocator figures: not a candidate
      uninitializedDevice({ index: 3, reserved: null })
    ];
    expect(busiestDevice(devices)?.index).toBe(1);
  });

  it('is the lowest index on a tie, and none without figures', () => {
    expect(
      busiestDevice([
        device({ index: 0, reserved: 0 }),
        device({ index: 1, reserved: 0 })
      ])?.index
    ).toBe(0);
    expect(busiestDevice([uninitializedDevice()])).toBeNull();
    expect(busiestDevice([])).toBeNull();
  });
});

describe('near the end', () => {
  const cap = (bytes: number) => ({ fraction: bytes / (140 * GiB), bytes });

  it('warns from 90 % of the cap, allocated or reserved', () => {
    expect(NEAR_THE_END).toBe(0.9);
    // reserved 9 GiB of a 10 GiB cap: exactly 90 %
    expect(
      nearTheEnd(
        device({ allocated: GiB, reserved: 9 * GiB, limit: cap(10 * GiB) })
      )
    ).toBe('cap');
    // one MiB less: not yet
    expect(
      nearTheEnd(
        device({
          allocated: GiB,
          reserved: 9 * GiB - MiB,
          limit: cap(10 * GiB)
        })
      )
    ).toBeNull();
    // caching off: allocated can be the larger
    expect(
      nearTheEnd(
        device({ allocated: 9.5 * GiB, reserved: 0, limit: cap(10 * GiB) })
      )
    ).toBe('cap');
  });

  it("warns from 90 % of the device's memory used by all processes", () => {
    expect(
      nearTheEnd(device({ total: 100 * GiB, device_used: 90 * GiB }))
    ).toBe('device');
    expect(
      nearTheEnd(device({ total: 100 * GiB, device_used: 89 * GiB }))
    ).toBeNull();
    // unknown figures never warn
    expect(
      nearTheEnd(device({ total: null, device_used: 90 * GiB }))
    ).toBeNull();
  });
});

describe('statusSummary', () => {
  it('shows allocated / reserved of the one GPU', () => {
    const summary = statusSummary(
      stateWith(
        sample({
          devices: [device({ allocated: 1.2 * GiB, reserved: 2 * GiB })]
        })
      ),
      trans
    );
    expect(summary?.text).toBe('GPU 1.20 GiB / 2.00 GiB');
    expect(summary?.near).toBeNull();
    expect(summary?.replay).toBeNull();
    expect(summary?.tooltip.split('\n')).toEqual([
      'GPU 0 (NVIDIA H200) of the kernel of train.ipynb',
      'Allocated 1.20 GiB: held by live tensors',
      "Reserved 2.00 GiB: held by PyTorch's caching allocator (allocated plus cached free blocks)",
      'Device: 10.0 GiB used of 140 GiB, by all processes',
      'Click to open the GPU memory panel'
    ]);
  });

  it('names the busiest of several GPUs', () => {
    const summary = statusSummary(
      stateWith(
        sample({
          devices: [
            device({ index: 0, allocated: GiB, reserved: 2 * GiB }),
            device({ index: 1, allocated: 3 * GiB, reserved: 5 * GiB })
          ]
        })
      ),
      trans
    );
    expect(summary?.index).toBe(1);
    expect(summary?.text).toBe('GPU 1: 3.00 GiB / 5.00 GiB');
    expect(summary?.tooltip).toContain(
      'The busiest of 2 GPUs: the one with the most reserved'
    );
  });

  it('says why it warns', () => {
    const summary = statusSummary(
      stateWith(
        sample({
          devices: [
            device({
              allocated: 8 * GiB,
              reserved: 9.5 * GiB,
              limit: { fraction: 10 / 140, bytes: 10 * GiB }
            })
          ]
        })
      ),
      trans
    );
    expect(summary?.near).toBe('cap');
    expect(summary?.tooltip).toContain('Cap 10.0 GiB (7.1% of the device)');
    expect(summary?.tooltip).toContain('Near the cap: reserved is 95% of it');
  });

  it('marks replayed figures', () => {
    const summary = statusSummary(stateWith(sample({ replay: REPLAY })), trans);
    expect(summary?.text).toBe('GPU 1.00 GiB / 2.00 GiB (replay)');
    expect(summary?.replay).toEqual(REPLAY);
    expect(summary?.tooltip).toContain(
      'Replay: readings recorded on an NVIDIA H200 with torch 2.11.0+cu130 on 2026-11-21 are replayed'
    );
  });

  it('shows nothing without GPU figures', () => {
    expect(statusSummary(initialState(), trans)).toBeNull();
    expect(
      statusSummary(
        reduce(initialState(), {
          type: 'follow',
          kernelId: 'k1',
          source: 'a.ipynb'
        }),
        trans
      )
    ).toBeNull();
    expect(
      statusSummary(
        stateWith(
          sample({ state: 'not_initialized', devices: [uninitializedDevice()] })
        ),
        trans
      )
    ).toBeNull();
    expect(
      statusSummary(stateWith(sample({ state: 'no_gpu', devices: [] })), trans)
    ).toBeNull();
  });
});

describe('the status item', () => {
  it('draws the text, the tooltip, the warning and opens the panel', () => {
    const summary = statusSummary(
      stateWith(
        sample({
          replay: REPLAY,
          devices: [device({ total: 100 * GiB, device_used: 95 * GiB })]
        })
      ),
      trans
    )!;
    const onOpen = vi.fn();
    const [button] = render(
      React.createElement(StatusItem, { summary, onOpen })
    );
    expect(typeof button).not.toBe('string');
    const node = button as Exclude<typeof button, string>;
    expect(node.type).toBe('button');
    expect(text(node)).toBe('GPU 1.00 GiB / 2.00 GiB (replay)');
    expect(node.props.className).toContain('jp-mod-warn');
    expect(node.props['data-near']).toBe('device');
    expect(node.props['data-replay']).toBe('true');
    expect(node.props.title).toContain(
      'Nearly full: 95% of the device is used'
    );
    node.props.onClick();
    expect(onOpen).toHaveBeenCalledTimes(1);
  });
});

describe('the replay banner', () => {
  it("says it is a replay, in the kernel's words", () => {
    const nodes = render(
      React.createElement(ReplayBanner, { replay: REPLAY, trans })
    );
    const [banner] = byClass(nodes, 'jp-GpuMem-replayBanner');
    expect(banner.props.role).toBe('note');
    expect(text(banner)).toBe(
      'Replay readings recorded on an NVIDIA H200 with torch 2.11.0+cu130 on 2026-11-21 are replayed; nothing here is measured on this machine (this kernel: torch 2.13.0+cpu)'
    );
    expect(banner.props['data-gpu']).toBe('NVIDIA H200');
    expect(banner.props['data-torch']).toBe('2.11.0+cu130');
  });

  it('is absent for live figures', () => {
    expect(
      render(React.createElement(ReplayBanner, { replay: undefined, trans }))
    ).toEqual([]);
  });

  it('words the recording itself when the kernel gave no sentence', () => {
    const bare = { ...REPLAY, description: '' };
    expect(replayBody(bare, trans)).toBe(
      'readings recorded on NVIDIA H200 with torch 2.11.0+cu130 on 2026-11-21; nothing here is measured on this machine'
    );
    expect(
      replayText({ ...bare, torch_version: null, recorded: null }, trans)
    ).toBe(
      'Replay: readings recorded on NVIDIA H200; nothing here is measured on this machine'
    );
  });
});

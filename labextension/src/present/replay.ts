/**
 * Words for replayed figures (`sample.replay`, protocol revision 9): the
 * kernel replays readings recorded elsewhere (the demo without a GPU, the UI
 * tests) instead of measuring. Pure.
 */
import { IReplay } from '../protocol';
import { ITrans } from './trans';

/**
 * What was replayed, after a "Replay" label: the kernel's sentence without
 * its own "replay:" lead, else one made of the recording's GPU, torch and day.
 */
export function replayBody(replay: IReplay, trans: ITrans): string {
  const sentence = (replay.description ?? '')
    .trim()
    .replace(/^replay:\s*/i, '');
  if (sentence !== '') {
    return sentence;
  }
  const gpu = replay.gpu || trans.__('a GPU');
  const torch = replay.torch_version;
  const recorded = replay.recorded ?? null;
  if (torch && recorded) {
    return trans.__(
      'readings recorded on %1 with torch %2 on %3; nothing here is measured on this machine',
      gpu,
      torch,
      recorded
    );
  }
  if (torch) {
    return trans.__(
      'readings recorded on %1 with torch %2; nothing here is measured on this machine',
      gpu,
      torch
    );
  }
  return trans.__(
    'readings recorded on %1; nothing here is measured on this machine',
    gpu
  );
}

/** One line: "Replay: readings recorded on an NVIDIA H200 …". */
export function replayText(replay: IReplay, trans: ITrans): string {
  return trans.__('Replay: %1', replayBody(replay, trans));
}

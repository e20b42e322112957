/**
 * The kernel <-> panel protocol, version 1: the types generated from
 * jupyter_gpumem/protocol/schema.json (`schema.generated.ts`, the one source;
 * docs/protocol.md explains it), the names the panel uses for their parts,
 * what older kernels send that the schema no longer says, and the checks that
 * make a reply or a comm message safe to read.
 */
import {
  Action,
  CommMessage,
  ErrorCode,
  IActionResults,
  ICellMarker,
  IDevice,
  IHistoryCell,
  IFix,
  IFreeLetGo,
  IPostMortem,
  ISample,
  ISegmentMap,
  ITracking,
  IWhoReport,
  IWhoRow,
  PROTOCOL_VERSION
} from './schema.generated';

export * from './schema.generated';

/**
 * What `who`, `release_traceback` and `free` answer while a cell runs (code
 * `busy`).
 */
export const BUSY_MESSAGE = 'busy: available when the cell ends';

// -- names for the parts of the generated types ------------------------------
export type SampleState = ISample['state'];
export type Backend = IDevice['backend'];
/** A child process of the kernel on the device (multi-process training). */
export type IChildProcess = NonNullable<IDevice['children']>[number];
export type ICellMarkerDevice = ICellMarker['devices'][number];
export type WhoRowKind = IWhoRow['kind'];
export type WhoBy = IWhoReport['by'];
export type FixKind = IFix['kind'];
export type IOtherProcess = IPostMortem['other_processes'][number];
export type ISegment = ISegmentMap['segments'][number];
export type ISegmentSummary = ISegmentMap['summary'];
/**
 * One block: offset from the segment's start, size, kind, and the index of
 * the line that allocated it in the map's `labels` (-1: unknown).
 */
export type SegmentBlock = ISegment['blocks'][number];
/** Kinds of blocks in a segment, in the user's words. */
export type BlockKind = SegmentBlock[2];
export type IHistoryCellDevice = IHistoryCell['devices'][number];

// -- results -----------------------------------------------------------------
export type IHelloResult = IActionResults['hello'];
export type ISampleResult = IActionResults['sample'];
export type IEmptyCacheResult = IActionResults['empty_cache'];
export type ISetCachingResult = IActionResults['set_caching'];
export type ISetLimitResult = IActionResults['set_limit'];
export type IStreamResult = IActionResults['subscribe'];
export type IWhoResult = IActionResults['who'];
export type IWhoDevice = IWhoResult['devices'][number];
export type ISegmentsResult = IActionResults['segments'];
export type IHistoryResult = IActionResults['history'];
export type IReleaseTracebackResult = IActionResults['release_traceback'];
export type IFreeResult = IActionResults['free'];
export type FreeAction = IFreeLetGo['action'];
/** `track`'s result; `tracking` was a boolean before revision 3. */
export type ITrackResult = Omit<IActionResults['track'], 'tracking'> & {
  tracking: ITracking | boolean;
};

// -- messages ----------------------------------------------------------------
export interface IRequestContent {
  protocol: number;
  action: Action;
  args: Record<string, unknown>;
}

export interface IReplyOk<R = Record<string, unknown>> {
  protocol: number;
  action: Action;
  status: 'ok';
  result: R;
}

export interface IReplyError {
  protocol: number;
  action: Action;
  status: 'error';
  error: { code: ErrorCode; message: string };
}

export type Reply<R = Record<string, unknown>> = IReplyOk<R> | IReplyError;

type CommOf<T extends CommMessage['type']> = Extract<CommMessage, { type: T }>;
/** The first message after the stream (re)starts; no `seq` before revision 2. */
export type ICommOpenData = Omit<CommOf<'open'>, 'seq'> & { seq?: number };
export type ICommSampleData = CommOf<'sample'>;
export type ICommHeartbeatData = CommOf<'heartbeat'>;
export type ICommCellData = CommOf<'cell'>;
export type CommData =
  ICommSampleData | ICommHeartbeatData | ICommCellData | ICommOpenData;

/**
 * Build the content of a `gpumem_request`.
 */
export function makeRequest(
  action: Action,
  args: Record<string, unknown> = {}
): IRequestContent {
  return { protocol: PROTOCOL_VERSION, action, args };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Check the shape of a reply well enough to read it safely.
 *
 * Returns a reason string when the content is not a protocol reply.
 */
export function checkReply(content: unknown): Reply | string {
  if (!isObject(content)) {
    return 'reply is not an object';
  }
  if (content.protocol !== PROTOCOL_VERSION) {
    return `unsupported protocol ${JSON.stringify(content.protocol)}`;
  }
  if (content.status === 'ok') {
    if (!isObject(content.result)) {
      return 'reply has no result';
    }
    return content as unknown as IReplyOk;
  }
  if (content.status === 'error') {
    if (!isObject(content.error)) {
      return 'error reply has no error';
    }
    return content as unknown as IReplyError;
  }
  return `unknown reply status ${JSON.stringify(content.status)}`;
}

/**
 * Check the shape of a comm message's data; null when it is not ours.
 */
export function checkCommData(data: unknown): CommData | null {
  if (!isObject(data) || data.protocol !== PROTOCOL_VERSION) {
    return null;
  }
  switch (data.type) {
    case 'open':
      return isObject(data.stream) ? (data as unknown as ICommOpenData) : null;
    case 'sample':
      return typeof data.seq === 'number' && isObject(data.sample)
        ? (data as unknown as ICommSampleData)
        : null;
    case 'heartbeat':
      return typeof data.seq === 'number'
        ? (data as unknown as ICommHeartbeatData)
        : null;
    case 'cell':
      return typeof data.seq === 'number' && isObject(data.cell)
        ? (data as unknown as ICommCellData)
        : null;
    default:
      return null;
  }
}

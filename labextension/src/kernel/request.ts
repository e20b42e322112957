/**
 * One `gpumem_request` on the control channel and the outcome of waiting for
 * its reply.
 */
import { Kernel, KernelMessage } from '@jupyterlab/services';

import {
  Action,
  checkReply,
  makeRequest,
  Reply,
  REQUEST_MSG_TYPE
} from '../protocol';
import { IKernelLike } from './types';

export type RequestOutcome =
  | { kind: 'reply'; reply: Reply }
  | { kind: 'timeout' }
  /** Answered by the process a restart replaced. */
  | { kind: 'stale' }
  | { kind: 'error'; message: string };

/**
 * Send one `gpumem_request` on the control channel and wait for its reply.
 * `fromCurrentProcess` tells a reply of the process now running from one of
 * the process a restart replaced.
 */
export function sendRequest(
  kernel: IKernelLike | null,
  action: Action,
  args: Record<string, unknown>,
  timeoutMs: number,
  fromCurrentProcess: (msg: KernelMessage.IMessage) => boolean
): Promise<RequestOutcome> {
  if (!kernel || kernel.isDisposed) {
    return Promise.resolve({ kind: 'error', message: 'no kernel' });
  }
  // The message type union of @jupyterlab/services is closed: a custom
  // control message needs casts.
  const msg = KernelMessage.createMessage<any>({
    msgType: REQUEST_MSG_TYPE as any,
    channel: 'control',
    session: kernel.clientId,
    content: makeRequest(action, args)
  } as any);
  let future: Kernel.IControlFuture<any, any>;
  try {
    future = kernel.sendControlMessage(msg, true, true);
  } catch (reason) {
    return Promise.resolve({ kind: 'error', message: String(reason) });
  }
  return new Promise<RequestOutcome>(resolve => {
    let settled = false;
    const settle = (outcome: RequestOutcome) => {
      if (!settled) {
        settled = true;
        clearTimeout(timer);
        resolve(outcome);
      }
    };
    const onReply = (reply: KernelMessage.IMessage) => {
      if (!fromCurrentProcess(reply)) {
        settle({ kind: 'stale' });
        return;
      }
      const checked = checkReply(reply.content);
      settle(
        typeof checked === 'string'
          ? { kind: 'error', message: checked }
          : { kind: 'reply', reply: checked }
      );
    };
    // Not a Poll: one deadline for one message, cleared when its reply comes.
    const timer = setTimeout(() => {
      settle({ kind: 'timeout' });
      if (!future.isDisposed) {
        future.dispose();
      }
    }, timeoutMs);
    // onReply comes before the kernel's idle status, which `done` waits for.
    future.onReply = onReply;
    future.done.then(
      reply => {
        if (reply) {
          onReply(reply);
        }
      },
      reason => settle({ kind: 'error', message: String(reason) })
    );
  });
}

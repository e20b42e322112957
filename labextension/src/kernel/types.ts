/**
 * The parts of JupyterLab's kernel and session objects the extension uses, so
 * that tests can pass fakes.
 */
import { Kernel } from '@jupyterlab/services';
import { ISignal } from '@lumino/signaling';

/**
 * The part of a kernel connection the model uses (a subset of
 * `Kernel.IKernelConnection`, so that tests can pass a fake).
 */
export type IKernelLike = Pick<
  Kernel.IKernelConnection,
  | 'id'
  | 'clientId'
  | 'status'
  | 'statusChanged'
  | 'iopubMessage'
  | 'anyMessage'
  | 'disposed'
  | 'isDisposed'
  | 'handleComms'
  | 'sendControlMessage'
  | 'createComm'
  | 'hasComm'
  | 'requestExecute'
>;

/**
 * The part of a session context the model uses.
 */
export interface ISessionLike {
  readonly session: { readonly kernel: IKernelLike | null } | null;
  readonly kernelChanged: ISignal<any, any>;
  readonly isDisposed: boolean;
}

/**
 * What the model follows: a notebook's or console's session and its name.
 */
export interface IKernelSource {
  label: string;
  sessionContext: ISessionLike;
}

/** The kernel of a session, or null (none yet, or the session is gone). */
export function kernelOf(session: ISessionLike | null): IKernelLike | null {
  return session && !session.isDisposed && session.session
    ? session.session.kernel
    : null;
}

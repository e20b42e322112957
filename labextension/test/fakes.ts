/**
 * A fake kernel connection that records what the model sends and lets a test
 * answer it, as the kernel side would.
 */
import { Signal } from '@lumino/signaling';

export class FakeFuture {
  constructor(readonly msg: any) {
    this.done = new Promise((resolve, reject) => {
      this._resolve = resolve;
      this._reject = reject;
    });
    // A test that never answers must not leave an unhandled rejection.
    this.done.catch(() => undefined);
  }

  readonly done: Promise<any>;
  onReply: ((msg: any) => void) | null = null;
  isDisposed = false;

  get action(): string {
    return this.msg.content.action;
  }

  get args(): Record<string, unknown> {
    return this.msg.content.args;
  }

  /** Answer as the kernel process with session id `session`. */
  reply(content: unknown, session = 'process-1'): void {
    const msg = { header: { msg_type: 'gpumem_reply', session }, content };
    this.onReply?.(msg);
    this._resolve(msg);
  }

  dispose(): void {
    this.isDisposed = true;
    this._reject(new Error('Canceled future'));
  }

  private _resolve!: (value: any) => void;
  private _reject!: (reason: any) => void;
}

export class FakeComm {
  /** `onDispose`: as JupyterLab's, unregisters the id from the connection. */
  constructor(
    readonly commId: string,
    private readonly onDispose: () => void = () => undefined
  ) {}
  onMsg: ((msg: any) => void) | null = null;
  onClose: ((msg: any) => void) | null = null;
  isDisposed = false;
  dispose(): void {
    if (!this.isDisposed) {
      this.isDisposed = true;
      this.onDispose();
    }
  }
}

export class FakeKernel {
  constructor(readonly id = 'k1') {}

  clientId = `client-${this.id}`;
  status = 'idle';
  handleComms = true;
  isDisposed = false;
  statusChanged = new Signal<any, any>(this);
  iopubMessage = new Signal<any, any>(this);
  anyMessage = new Signal<any, any>(this);
  disposed = new Signal<any, any>(this);
  sent: FakeFuture[] = [];
  executed: any[] = [];
  comms = new Map<string, FakeComm>();
  /** Target names of the comms created, in order. */
  created: string[] = [];
  executeReply: any = { status: 'ok', execution_count: null };

  sendControlMessage(msg: any): FakeFuture {
    if (msg.channel !== 'control' || msg.header.msg_type !== 'gpumem_request') {
      throw new Error(
        `unexpected message ${msg.header.msg_type} on ${msg.channel}`
      );
    }
    const future = new FakeFuture(msg);
    this.sent.push(future);
    return future;
  }

  /** Requests sent for an action, oldest first. */
  requests(action: string): FakeFuture[] {
    return this.sent.filter(f => f.action === action);
  }

  last(action: string): FakeFuture {
    const all = this.requests(action);
    if (all.length === 0) {
      throw new Error(`no ${action} request was sent`);
    }
    return all[all.length - 1];
  }

  requestExecute(content: any): { done: Promise<any> } {
    this.executed.push(content);
    return { done: Promise.resolve({ content: this.executeReply }) };
  }

  /** As JupyterLab's: the client side of a comm, nothing sent. */
  createComm(target: string, commId: string): FakeComm {
    if (!this.handleComms) {
      throw new Error('Comms are disabled on this kernel connection');
    }
    if (this.hasComm(commId)) {
      throw new Error('Comm is already created');
    }
    // Unregisters by id, whichever comm holds it now (as JupyterLab does).
    const comm = new FakeComm(commId, () => this.comms.delete(commId));
    this.comms.set(commId, comm);
    this.created.push(target);
    return comm;
  }

  hasComm(commId: string): boolean {
    return this.comms.has(commId);
  }

  /**
   * The kernel sends a comm message; as in JupyterLab, it reaches only a comm
   * created with its id.
   */
  commMsg(commId: string, data: unknown, session = 'process-1'): boolean {
    const comm = this.comms.get(commId);
    if (comm && !comm.isDisposed) {
      comm.onMsg?.({
        header: { msg_type: 'comm_msg', session },
        content: { comm_id: commId, data }
      });
      return true;
    }
    return false;
  }

  /**
   * A comm_close from the kernel: as JupyterLab, unregister the comm, await
   * its onClose, then dispose of it.
   */
  async commClose(commId: string): Promise<void> {
    const comm = this.comms.get(commId);
    if (comm) {
      this.comms.delete(commId);
      await comm.onClose?.({ content: { comm_id: commId, data: {} } });
      comm.dispose();
    }
  }

  setStatus(status: string): void {
    this.status = status;
    this.statusChanged.emit(status);
  }

  /** IOPub status of a cell (execute_request) or of another request. */
  iopubStatus(
    state: 'busy' | 'idle' | 'starting',
    parentType = 'execute_request',
    session = 'process-1'
  ): void {
    const msg = {
      channel: 'iopub',
      header: { msg_type: 'status', session },
      parent_header: { msg_type: parentType },
      content: { execution_state: state }
    };
    this.anyMessage.emit({ msg, direction: 'recv' });
    this.iopubMessage.emit(msg);
  }

  /** A restarted process says it is ready, as after JupyterLab's kernel_info_request. */
  newProcessIdle(session: string): void {
    this.setStatus('idle');
    this.iopubStatus('busy', 'kernel_info_request', session);
    this.iopubStatus('idle', 'kernel_info_request', session);
  }
}

export class FakeSession {
  constructor(kernel: FakeKernel | null) {
    this.session = { kernel: kernel as any };
  }

  session: { kernel: any } | null;
  kernelChanged = new Signal<any, any>(this);
  isDisposed = false;

  changeKernel(kernel: FakeKernel | null): void {
    this.session = { kernel };
    this.kernelChanged.emit({
      name: 'kernel',
      oldValue: null,
      newValue: kernel
    });
  }
}

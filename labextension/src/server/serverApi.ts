/**
 * What the "On this GPU" tab needs from JupyterLab: the server connection,
 * a way to shut a kernel down, and a way to ask the user. index.ts builds it
 * from the app; tests pass fakes. No DOM here (the dialog is index.ts's).
 */
import { ServerConnection } from '@jupyterlab/services';

/** A yes/no question; `accept` labels the button that says yes. */
export interface IConfirmation {
  title: string;
  body: string;
  accept: string;
}

export interface IServerApi {
  /** The server the panel was loaded from. */
  readonly settings: ServerConnection.ISettings;
  /** Shut a kernel of the server down (and its notebook's session). */
  shutdownKernel(kernelId: string): Promise<void>;
  /** Ask the user; true when they accept. */
  confirm(question: IConfirmation): Promise<boolean>;
}

/** The parts of JupyterLab's service manager `shutdownKernel` uses. */
export interface IServiceManagerLike {
  readonly serverSettings: ServerConnection.ISettings;
  readonly sessions: {
    refreshRunning(): Promise<void>;
    running(): IterableIterator<{ id: string; kernel: { id: string } | null }>;
    shutdown(id: string): Promise<void>;
  };
  readonly kernels: { shutdown(id: string): Promise<void> };
}

/**
 * Shut a kernel down through JupyterLab's own managers: the session whose
 * kernel it is (so that the notebook shows "No Kernel" at once), else the
 * kernel alone (a kernel without a session, or one another tab started).
 */
export async function shutdownKernel(
  services: IServiceManagerLike,
  kernelId: string
): Promise<void> {
  // The list may not know sessions started in another browser tab yet.
  await services.sessions.refreshRunning();
  for (const session of services.sessions.running()) {
    if (session.kernel?.id === kernelId) {
      await services.sessions.shutdown(session.id);
      return;
    }
  }
  await services.kernels.shutdown(kernelId);
}

/** An `IServerApi` over a service manager and a question asker. */
export function serverApi(
  services: IServiceManagerLike,
  confirm: (question: IConfirmation) => Promise<boolean>
): IServerApi {
  return {
    get settings() {
      return services.serverSettings;
    },
    shutdownKernel: id => shutdownKernel(services, id),
    confirm
  };
}

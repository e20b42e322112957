/**
 * Replies of `GET api/gpumem/devices` (docs/server.md) for tests: one H200
 * with two notebooks of this server (one with a child process), another
 * user's process, and a third kernel that uses no GPU.
 */
import {
  IGpuDevice,
  IGpuProcess,
  IGpuTable,
  IServerKernel
} from '../src/server/gpuTable';

export const GiB = 1024 ** 3;

/** The reading's server time: 2026-11-22 13:12:00 UTC. */
export const TIME = Date.UTC(2026, 10, 22, 13, 12, 0) / 1000;

export const TRAIN = 'k-train-0000';
export const EVAL = 'k-eval-1111';
export const IDLE_CPU = 'k-cpu-2222';

export function process(overrides: Partial<IGpuProcess> = {}): IGpuProcess {
  return {
    pid: 777,
    name: 'python3',
    user: 'bob',
    used: 1 * GiB,
    kernel_id: null,
    role: 'other',
    ...overrides
  };
}

export function gpuDevice(overrides: Partial<IGpuDevice> = {}): IGpuDevice {
  return {
    index: 0,
    cuda_index: 0,
    uuid: 'GPU-72bff03d-0000-0000-0000-000000000000',
    name: 'NVIDIA H200',
    total: 140 * GiB,
    used: 12 * GiB,
    processes: [
      process({ pid: 4300, used: 5 * GiB, kernel_id: EVAL, role: 'kernel' }),
      process({ pid: 4242, used: 2 * GiB, kernel_id: TRAIN, role: 'kernel' }),
      process({ pid: 4243, used: 1 * GiB, kernel_id: TRAIN, role: 'child' }),
      process({ pid: 777, used: 3 * GiB })
    ],
    ...overrides
  };
}

export function serverKernel(
  overrides: Partial<IServerKernel> = {}
): IServerKernel {
  return {
    id: TRAIN,
    name: 'python3',
    pid: 4242,
    path: 'train.ipynb',
    execution_state: 'idle',
    // 3 h 12 min before TIME
    last_activity: '2026-11-22T10:00:00.000000Z',
    connections: 1,
    gpu_used: 3 * GiB,
    devices: [{ index: 0, used: 3 * GiB }],
    children: [{ pid: 4243, used: 1 * GiB }],
    ...overrides
  };
}

export function gpuTable(overrides: Partial<IGpuTable> = {}): IGpuTable {
  return {
    version: 1,
    time: TIME,
    nvml: { available: true, driver: '580.159.04', error: null },
    pid_namespace: 'shared',
    note: null,
    devices: [gpuDevice()],
    kernels: [
      serverKernel(),
      serverKernel({
        id: EVAL,
        pid: 4300,
        path: 'eval.ipynb',
        execution_state: 'busy',
        last_activity: '2026-11-22T13:11:59.000000Z',
        gpu_used: 5 * GiB,
        devices: [{ index: 0, used: 5 * GiB }],
        children: []
      }),
      serverKernel({
        id: IDLE_CPU,
        pid: 5000,
        path: 'notes.ipynb',
        gpu_used: 0,
        devices: [],
        children: []
      })
    ],
    ...overrides
  };
}

/** NVML's PIDs are another namespace's: nothing is matched. */
export function foreignTable(): IGpuTable {
  return gpuTable({
    pid_namespace: 'foreign',
    note: "NVML reports processes by PIDs this server can't match (a container without the host's PID namespace?): they are listed by the PID and name NVML gives and are not matched with notebooks",
    devices: [
      gpuDevice({
        processes: [
          process({ pid: 91234, name: '/usr/bin/python3', user: null }),
          process({ pid: 91300, name: 'python', user: null, used: 2 * GiB })
        ]
      })
    ]
  });
}

/**
 * The same, with what the kernels of train.ipynb and eval.ipynb said they
 * hold (the server asked them), and 4 GiB in use by processes NVML does not
 * list (outside the server's PID namespace) beside 0.5 GiB the driver keeps.
 */
export function reportedTable(): IGpuTable {
  const table = foreignTable();
  const device = table.devices[0];
  device.used = 12 * GiB;
  device.driver_reserved = GiB / 2;
  device.unseen = 4 * GiB;
  device.reported = [
    { kernel_id: EVAL, reserved: 3 * GiB, allocated: 2 * GiB, time: TIME - 2 },
    { kernel_id: TRAIN, reserved: 5 * GiB, allocated: 4 * GiB, time: TIME - 2 }
  ];
  return table;
}

/** No driver: no device, NVML's reason. */
export function noNvmlTable(): IGpuTable {
  return gpuTable({
    nvml: {
      available: false,
      driver: null,
      error: 'NVML unavailable: the nvidia-ml-py package is not installed'
    },
    pid_namespace: 'unknown',
    devices: []
  });
}

/**
 * The panel's state: its types, the reducer over its slices, the store.
 */
export * from './types';
export { reduce } from './reducer';
export { applySample } from './samples';
export { freeInFlight, sameOrigin } from './free';
export { readTracking } from './replies';
export { GpuMemStore } from './store';

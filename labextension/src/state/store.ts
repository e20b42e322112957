/**
 * The panel's state: folds events into it with the pure reducer and says when
 * it changed. No DOM, no kernel.
 */
import { reduce } from './reducer';
import { GpuMemEvent, IGpuMemState, initialState } from './types';

export class GpuMemStore {
  /**
   * `onChange` is called with the new state after every event that changed
   * it (the reducer returns the same object otherwise).
   */
  constructor(
    trendMinutes: number,
    private readonly _onChange: (state: IGpuMemState) => void
  ) {
    this._state = initialState(trendMinutes);
  }

  get state(): IGpuMemState {
    return this._state;
  }

  dispatch(event: GpuMemEvent): void {
    const next = reduce(this._state, event);
    if (next !== this._state) {
      this._state = next;
      this._onChange(next);
    }
  }

  private _state: IGpuMemState;
}

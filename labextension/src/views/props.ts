/**
 * What every section of the panel is drawn from.
 */
import { TranslationBundle } from '@jupyterlab/translation';

import type { GpuMemModel } from '../model';
import { IGpuMemState } from '../state';

export interface IViewProps {
  model: GpuMemModel;
  state: IGpuMemState;
  trans: TranslationBundle;
}

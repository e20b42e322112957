/**
 * The Overview's forecast before the OOM: after the last measured cell, each
 * device whose allocated grew steadily over the last cells, with when it would
 * run out at that rate (docs/views.md). Nothing when there is none.
 */
import * as React from 'react';

import { ITrans } from '../../present/trans';
import {
  forecastDetail,
  forecastTarget,
  forecastText
} from '../../present/forecast';
import { IForecast } from '../../protocol';

export function ForecastLines(props: {
  forecasts: readonly IForecast[];
  /** Execution count of the cell they were made after. */
  cell: number | null;
  trans: ITrans;
}): JSX.Element | null {
  const { forecasts, cell, trans } = props;
  if (forecasts.length === 0) {
    return null;
  }
  return (
    <section
      className="jp-GpuMem-forecast"
      role="note"
      aria-label={trans.__('Forecast before the out-of-memory error')}
      data-cell={cell ?? ''}
    >
      <ul className="jp-GpuMem-forecastList">
        {forecasts.map(f => (
          <li
            key={`${f.worker ?? ''}:${f.device}`}
            data-device={f.device}
            data-worker={f.worker ?? ''}
            data-cells-left={f.cells_left}
          >
            <div className="jp-GpuMem-forecastText">
              <strong>{forecastTarget(f)}</strong>
              {cell === null
                ? `: ${forecastText(f, trans)}`
                : trans.__(' after [%1]: %2', cell, forecastText(f, trans))}
            </div>
            <div className="jp-GpuMem-forecastDetail">
              {forecastDetail(f, trans)}
            </div>
          </li>
        ))}
      </ul>
    </section>
  );
}

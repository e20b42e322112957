/**
 * Words for a Free (`%gpumem free`): what the named objects hold, what should
 * come back to the driver, what came back. Pure: the translator is passed in.
 */
import { IFreeDevice, IFreeReport } from '../protocol';
import { formatPercent, formatSize } from './format';
import { deviceLabel } from './messages';
import { ITrans } from './trans';

/** The names of a Free, as the user wrote them: "model, Out[7]". */
export function freeNames(names: readonly string[]): string {
  return names.join(', ');
}

/** "64.00 MiB on GPU 0, 1.00 GiB on GPU 1". */
function onEachDevice(
  devices: readonly IFreeDevice[],
  bytes: (d: IFreeDevice) => number,
  trans: ITrans
): string {
  return devices
    .map(d =>
      trans.__('%1 on %2', formatSize(bytes(d)), deviceLabel(d.device, trans))
    )
    .join(', ');
}

/** What the named objects hold: "Holds 64.00 MiB on GPU 0". */
export function heldText(report: IFreeReport, trans: ITrans): string {
  if (report.devices.length === 0) {
    return trans.__('Holds nothing on the GPU');
  }
  return trans.__(
    'Holds %1',
    onEachDevice(report.devices, d => d.held, trans)
  );
}

/**
 * What should come back to the driver after the free and empty_cache, with
 * what of it the cache held free already.
 */
export function expectedText(report: IFreeReport, trans: ITrans): string {
  if (report.devices.length === 0) {
    return trans.__('Expected back to the driver: nothing');
  }
  const parts = report.devices.map(d => {
    const where = trans.__(
      '%1 on %2',
      formatSize(d.expected_returned),
      deviceLabel(d.device, trans)
    );
    return d.cached_free > 0
      ? trans.__(
          '%1 (%2 of it already free in the cache)',
          where,
          formatSize(d.cached_free)
        )
      : where;
  });
  return trans.__('Expected back to the driver: %1', parts.join(', '));
}

/**
 * What came back to the driver on one device (cudaMemGetInfo), against what
 * the named objects held and what was expected; said plainly when nothing
 * was measured (a replay kernel plays the plan on its recording).
 */
export function cameBackText(d: IFreeDevice, trans: ITrans): string {
  const where = deviceLabel(d.device, trans);
  if (d.returned === null) {
    return d.freed === null
      ? trans.__('%1: nothing was measured', where)
      : trans.__(
          "%1: the driver's figure could not be read; allocated fell by %2",
          where,
          formatSize(d.freed)
        );
  }
  const back = formatSize(d.returned);
  const ofHeld = d.held > 0 ? formatPercent(d.returned / d.held) : null;
  const ofExpected =
    d.expected_returned > 0
      ? formatPercent(d.returned / d.expected_returned)
      : null;
  let text: string;
  if (ofHeld !== null && ofExpected !== null) {
    text = trans.__(
      'Came back to the driver on %1: %2 (%3 of what it held, %4 of the expected)',
      where,
      back,
      ofHeld,
      ofExpected
    );
  } else if (ofHeld !== null) {
    text = trans.__(
      'Came back to the driver on %1: %2 (%3 of what it held)',
      where,
      back,
      ofHeld
    );
  } else {
    text = trans.__('Came back to the driver on %1: %2', where, back);
  }
  return d.freed === null
    ? text
    : `${text}; ${trans.__('allocated fell by %1', formatSize(d.freed))}`;
}

/** Small statistics over rounds and samples. */

/** The q-quantile (0..1) of `values`, by linear interpolation between closest ranks. */
export function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (pos - lo);
}

/** Median, minimum and maximum of the values of one metric over rounds. */
export interface Spread {
  median: number;
  min: number;
  max: number;
  n: number;
}

/** The median, minimum and maximum of the finite values; null if there are none. */
export function spread(values: readonly number[]): Spread | null {
  const v = values.filter((x) => Number.isFinite(x));
  if (v.length === 0) return null;
  return { median: quantile(v, 0.5), min: Math.min(...v), max: Math.max(...v), n: v.length };
}

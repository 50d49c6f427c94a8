/**
 * A seeded pseudo-random generator (mulberry32), so every random choice of a
 * chaos or load run can be replayed from its seed.
 */

/** A seeded source of random choices. */
export interface Prng {
  /** A float in [0, 1). */
  next(): number;
  /** A whole number in [min, max]. */
  int(min: number, max: number): number;
  /** True with probability p. */
  chance(p: number): boolean;
  /** One element of a non-empty list. */
  pick<T>(list: readonly T[]): T;
  /** One key, chosen with probability proportional to its weight. */
  weighted<K extends string>(weights: Record<K, number>): K;
}

/** Makes a generator from a 32-bit seed. */
export function prng(seed: number): Prng {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (min, max) => min + Math.floor(next() * (max - min + 1)),
    chance: (p) => next() < p,
    pick: (list) => list[Math.floor(next() * list.length)]!,
    weighted(weights) {
      const entries = Object.entries(weights) as [string, number][];
      const total = entries.reduce((s, [, w]) => s + w, 0);
      let r = next() * total;
      for (const [k, w] of entries) {
        r -= w;
        if (r < 0) return k as never;
      }
      return entries[entries.length - 1]![0] as never;
    },
  };
}

/** Reads `--seed N` from argv, else makes one from the clock. */
export function seedFromArgs(argv: readonly string[]): number {
  const i = argv.indexOf('--seed');
  if (i >= 0 && argv[i + 1]) return Number(argv[i + 1]) >>> 0;
  return (Date.now() ^ (process.pid << 16)) >>> 0;
}

/**
 * What refusing an oversized input costs: the memory (growth of the peak
 * RSS) and time of `prepareRow`, the check every enqueue passes, for a 100 MB
 * input (`wide`: 50 million 'é', 100 MB of UTF-8). Figures in
 * docs/benchmarks.md ("Refusing an oversized input").
 *
 *   node --import tsx scripts/input-size-memory.ts [wide]
 */
import { z } from 'zod';
import { defineTask } from '../src/model/task.js';
import { prepareRow } from '../src/model/row.js';

const task = defineTask({ name: 'big', input: z.object({ s: z.string() }), run: () => null });
const input = { s: process.argv[2] === 'wide' ? 'é'.repeat(50_000_000) : 'x'.repeat(100_000_000) };
input.s.charCodeAt(5); // a flat string, as one read from a request body would be
const before = process.resourceUsage().maxRSS;
const started = performance.now();
try {
  prepareRow(task, input, null, {});
} catch (err) {
  console.log((err as Error).message.slice(0, 160));
}
console.log(`peak RSS grew ${((process.resourceUsage().maxRSS - before) / 1024).toFixed(0)} MB in ${(performance.now() - started).toFixed(0)} ms`);

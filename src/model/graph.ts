/**
 * Checks a graph of steps before anything is written: names, dependencies
 * that point nowhere, and cycles.
 */
import { InvalidGraphError } from './errors.js';

const STEP_PATTERN = /^[^\s\u0000-\u001f][^\u0000-\u001f]{0,199}$/;

/** Checks a step name: 1-200 printable characters, not starting with a space. */
export function checkStepName(step: unknown, where: string): string {
  if (typeof step !== 'string' || !STEP_PATTERN.test(step)) {
    throw new InvalidGraphError(`outlive: ${where}: step name ${JSON.stringify(step)} is invalid: use 1-200 printable characters`);
  }
  return step;
}

/**
 * Validates edges among `steps` (each step names the steps it waits for).
 * `external` names steps that exist outside this set (already in the run) and
 * may be waited for. Throws {@link InvalidGraphError} naming the problem:
 * a dependency on an unknown step, a step waiting on itself, or a cycle (with
 * its path).
 */
export function checkGraph(
  where: string,
  steps: ReadonlyMap<string, readonly string[]>,
  external: ReadonlySet<string> = new Set(),
): void {
  for (const [step, after] of steps) {
    for (const dep of after) {
      if (dep === step) throw new InvalidGraphError(`outlive: ${where}: step "${step}" waits for itself`);
      if (!steps.has(dep) && !external.has(dep)) {
        throw new InvalidGraphError(`outlive: ${where}: step "${step}" waits for "${dep}", which is not in the run`);
      }
    }
  }
  // Depth-first search with colours, on a stack of its own: a chain of
  // 20,000 steps visited from its end is deeper than the call stack. The
  // grey path is the cycle when one closes.
  const colour = new Map<string, 1 | 2>();
  for (const root of steps.keys()) {
    if (colour.has(root)) continue;
    const path: string[] = [root];
    const next: number[] = [0];
    colour.set(root, 1);
    while (path.length > 0) {
      const top = path.length - 1;
      const after = steps.get(path[top]!) ?? [];
      const i = next[top]!;
      if (i === after.length) {
        colour.set(path[top]!, 2);
        path.pop();
        next.pop();
        continue;
      }
      next[top] = i + 1;
      const dep = after[i]!;
      if (!steps.has(dep)) continue;
      const c = colour.get(dep);
      if (c === 1) {
        const cycle = [...path.slice(path.indexOf(dep)), dep];
        throw new InvalidGraphError(`outlive: ${where}: dependency cycle: ${cycle.join(' -> ')}`);
      }
      if (c === undefined) {
        colour.set(dep, 1);
        path.push(dep);
        next.push(0);
      }
    }
  }
}

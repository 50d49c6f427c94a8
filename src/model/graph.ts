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
  // Depth-first search with colours; the grey path is the cycle when one closes.
  const colour = new Map<string, 1 | 2>();
  const path: string[] = [];
  const visit = (step: string): void => {
    colour.set(step, 1);
    path.push(step);
    for (const dep of steps.get(step) ?? []) {
      if (!steps.has(dep)) continue;
      const c = colour.get(dep);
      if (c === 1) {
        const cycle = [...path.slice(path.indexOf(dep)), dep];
        throw new InvalidGraphError(`outlive: ${where}: dependency cycle: ${cycle.join(' -> ')}`);
      }
      if (c === undefined) visit(dep);
    }
    path.pop();
    colour.set(step, 2);
  };
  // Iterative enough for real graphs: recursion depth is the longest chain.
  for (const step of steps.keys()) if (!colour.has(step)) visit(step);
}

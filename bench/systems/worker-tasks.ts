/**
 * The tasks module the serverless phase bundles into the Cloudflare Worker in
 * place of the app's `functions/tasks.ts`: one no-op task that prints its
 * payload index, which the harness reads back from workerd's output to check
 * that each job ran exactly once (a database write per job would measure the
 * write, not the engine).
 */
import { z } from 'zod';
import { defineTask } from '../../src/model/task.ts';
import type { TasksFor } from '../../src/http/invocation.ts';

const noop = defineTask({
  name: 'noop',
  input: z.object({ i: z.number().int().nonnegative(), t: z.number().optional() }),
  run: ({ i }) => {
    console.log(`bench-ran ${i}`);
  },
});

/** The Worker's task list: the no-op task only. */
export const tasks: TasksFor = () => [noop];

/**
 * The tasks module the drain variant of signal-resume (lib/waits.ts) bundles
 * into the Cloudflare Worker in place of the app's `functions/tasks.ts`: the
 * step after each wait, which prints its run's index for the harness to time
 * as the line reaches it.
 */
import { z } from 'zod';
import { defineTask } from '../../src/model/task.ts';
import type { TasksFor } from '../../src/http/invocation.ts';

// The same name and input as NEXT_TASK of waits-outlive.ts, which writes the runs (importing it would pull pg into the bundle).
const next = defineTask({
  name: 'wait-next',
  input: z.object({ i: z.number().int() }),
  run: ({ i }) => {
    console.log(`bench-wait-next ${i} ${Date.now()}`);
  },
});

/** The Worker's task list: the step after the wait only. */
export const tasks: TasksFor = () => [next];

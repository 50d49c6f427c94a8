// The app's tasks, shared by the code that enqueues (app/api/signup) and the routes that run them.
import { z } from 'zod';
import { defineTask } from 'outlive';
import type { TasksFor } from 'outlive/vercel';   // the same type is in outlive/cloudflare

export const sendWelcome = defineTask({
  name: 'send-welcome',
  input: z.object({ email: z.string().email() }),
  run: async ({ email }) => ({ sent: email }),
});
export const tasks: TasksFor = () => [sendWelcome];

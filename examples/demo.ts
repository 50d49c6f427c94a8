/**
 * A small workload for the local stack: signups that each enqueue a welcome
 * email in the same transaction as the user row, with a mail service that
 * fails now and then (retried with backoff) and one address it always
 * rejects (failed for good, visibly).
 */
import type pg from 'pg';
import { z } from 'zod';
import { defineTask, enqueue, NonRetriableError } from 'outlive';

/** Sends a welcome email; the fake mail service fails 30% of first attempts. */
export const sendWelcome = defineTask({
  name: 'send-welcome',
  input: z.object({ userId: z.number().int(), email: z.string().email() }),
  retry: { maxAttempts: 4, backoff: { baseMs: 200, maxMs: 2_000 } },
  timeoutMs: 5_000,
  async run({ userId, email }, ctx) {
    await new Promise((r) => setTimeout(r, 5 + Math.random() * 20));
    if (email.endsWith('@invalid.example')) throw new NonRetriableError(`mailbox ${email} does not exist`);
    if (ctx.attempt === 1 && Math.random() < 0.3) throw new Error('mail service unavailable (503)');
    return { userId, messageId: `msg-${ctx.taskId}` };
  },
});

/** Creates the demo's business table. */
export async function createUsers(pool: pg.Pool): Promise<void> {
  await pool.query(`CREATE TABLE IF NOT EXISTS demo_users (id serial PRIMARY KEY, email text NOT NULL, created_at timestamptz DEFAULT now())`);
}

/** Signs a user up: the user row and the welcome task commit together, or neither does. */
export async function signUp(pool: pg.Pool, email: string): Promise<{ userId: number; taskId: string }> {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const { rows } = await client.query<{ id: number }>('INSERT INTO demo_users (email) VALUES ($1) RETURNING id', [email]);
    const task = await enqueue(client, sendWelcome, { userId: rows[0]!.id, email });
    await client.query('COMMIT');
    return { userId: rows[0]!.id, taskId: task.id };
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

// POST /api/signup: the business write and its task in one transaction, then a nudge.
import pg from 'pg';
import { enqueue, nudge } from 'outlive';
import { after } from 'next/server';
import { sendWelcome } from '@/lib/tasks';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 5 });

export async function POST(request: Request): Promise<Response> {
  const { email } = (await request.json()) as { email: string };
  const client = await pool.connect();
  let taskId: string;
  try {
    await client.query('BEGIN');
    await client.query('INSERT INTO users (email) VALUES ($1)', [email]);
    const task = await enqueue(client, sendWelcome, { email });
    await client.query('COMMIT');
    taskId = task.id;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
  // After the commit: wake the drain. A lost nudge costs only latency (the cron picks the task up).
  // Self-hosted, the drain answers only as OUTLIVE_DRAIN_URL: nudge that URL, not one built from this request.
  const drain = process.env.OUTLIVE_DRAIN_URL || new URL('/api/drain', request.url).toString();
  after(() => nudge(drain, process.env.OUTLIVE_DRAIN_SECRET!));
  return Response.json({ taskId }, { status: 201 });
}

import { describe, expect, it } from 'vitest';
import { tick } from '../src/index.js';
import { createUsers, sendWelcome, signUp } from '../examples/demo.js';
import { freshDb } from './support/db.js';

const db = await freshDb();
await createUsers(db.pool);

describe('examples/demo.ts', () => {
  it('signs users up with their welcome task in one transaction; the passes send them, or fail the hopeless one visibly', async () => {
    const ok = await signUp(db.pool, 'ada@example.com');
    const bad = await signUp(db.pool, 'nobody@invalid.example');
    for (let i = 0; i < 10; i++) {
      const r = await tick(db.pool, { tasks: [sendWelcome], now: new Date(Date.now() + i * 60_000) });
      if (r.claimed === 0) break;
    }
    const rows = await db.rows<{ id: string; state: string; last_error: string | null }>(
      `SELECT id::text, state::text, last_error FROM outlive.tasks ORDER BY id`,
    );
    // The first attempt may meet the fake mail service's 503 (and be retried); the outcome is fixed.
    expect(rows.map((r) => [r.id, r.state])).toEqual([
      [ok.taskId, 'succeeded'],
      [bad.taskId, 'failed'],
    ]);
    expect(rows[1]!.last_error).toBe('mailbox nobody@invalid.example does not exist');
    expect(await db.rows('SELECT email FROM demo_users ORDER BY id')).toEqual([{ email: 'ada@example.com' }, { email: 'nobody@invalid.example' }]);
  });
});

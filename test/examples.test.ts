import { describe, expect, it } from 'vitest';
import { tick } from '../src/index.js';
import { createUsers, sendWelcome, signUp } from '../examples/demo.js';
import { closePool, freshDb } from './support/db.js';
import { readFileSync } from 'node:fs';
import { drizzle } from 'drizzle-orm/node-postgres';
import { nudge } from '../src/index.js';
import { REBUILD_URL, rebuildHook } from '../examples/verify-nudge.js';

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

describe('examples/generate-pages.ts', () => {
  it('builds every page of two imports under the provider’s limits, never more than 5 calls at once, and waits out a 429 without spending attempts', async () => {
    const { generatePage, importSite, model } = await import('../examples/generate-pages.js');
    const fresh = await freshDb();
    await importSite(fresh.pool, 'acme', Array.from({ length: 30 }, (_, i) => `a${i}`));
    await importSite(fresh.pool, 'tiny', ['t0', 't1', 't2']);
    const pools = Array.from({ length: 3 }, () => fresh.newPool({ max: 3 }));
    for (let round = 0; round < 200; round++) {
      const reports = await Promise.all(pools.map((pool) => tick(pool, { tasks: [generatePage], concurrency: 8 })));
      if (reports.every((r) => r.claimed === 0)) break;
    }
    const done = await fresh.rows<{ customer: string; n: number; last: Date }>(
      `SELECT input->>'customerId' AS customer, count(*)::int AS n, max(finished_at) AS last FROM outlive.tasks WHERE state = 'succeeded' GROUP BY 1 ORDER BY 1`,
    );
    expect(done.map((d) => [d.customer, d.n])).toEqual([['acme', 30], ['tiny', 3]]);
    // The small import was not left behind the big one.
    expect(done[1]!.last.getTime()).toBeLessThan(done[0]!.last.getTime());
    expect(model.mostAtOnce).toBeLessThanOrEqual(5);
    expect(model.refused).toBe(0);
    // The provider's window is full (as if another app used the same key): a 429 pauses the key for everyone.
    model.calls = Array.from({ length: 60 }, () => Date.now());
    await importSite(fresh.pool, 'late', ['l0']);
    expect(await tick(fresh.pool, { tasks: [generatePage] })).toMatchObject({ claimed: 1 });
    expect(model.refused).toBe(1);
    const [late] = await fresh.rows<{ state: string; attempts: number; paused: boolean }>(
      `SELECT t.state::text, t.attempts, l.paused_until > now() AS paused FROM outlive.tasks t, outlive.limits l WHERE t.input->>'customerId' = 'late' AND l.key = 'openai'`,
    );
    expect(late).toEqual({ state: 'pending', attempts: 0, paused: true });
    expect(await tick(fresh.pool, { tasks: [generatePage] })).toMatchObject({ claimed: 0 });
    model.calls = [];
    expect(await tick(fresh.pool, { tasks: [generatePage], now: new Date(Date.now() + 1_500) })).toMatchObject({ claimed: 1, succeeded: 1 });
    await Promise.all(pools.map(closePool));
  });
});

describe('examples/verify-nudge.ts', () => {
  const secret = 'v'.repeat(40);
  /** The request a nudge sends, captured on its way out. */
  async function signed(body: object, url = REBUILD_URL): Promise<Request> {
    let sent: Request | undefined;
    await nudge(url, secret, body, { fetch: async (input, init) => ((sent = new Request(input as string, init)), new Response(null, { status: 204 })) });
    return sent!;
  }

  it('verifies a nudge with the app\'s own pool or drizzle database, refusing a replay, a forgery and another endpoint', async () => {
    for (const handle of [db.pool, drizzle(db.pool)]) {
      const request = await signed({ page: 'home' });
      const again = request.clone();
      const ok = await rebuildHook(request, handle, secret);
      expect({ status: ok.status, text: await ok.text() }).toEqual({ status: 200, text: 'rebuilding home' });
      expect((await rebuildHook(again, handle, secret)).status).toBe(403);
      expect((await rebuildHook(await signed({ page: 'home' }), handle, 'w'.repeat(40))).status).toBe(401);
      expect((await rebuildHook(await signed({ page: 'home' }, 'https://other.example/hooks/rebuild'), handle, secret)).status).toBe(401);
    }
  });

  it('is shown in docs/deploy.md as it is', () => {
    const lines = (text: string) => text.split('\n').map((l) => l.trim()).filter((l) => l && !/^(\/\/|\/\*|\*)/.test(l));
    const file = lines(readFileSync(new URL('../examples/verify-nudge.ts', import.meta.url), 'utf8')).map((l) => l.replace("'../src/index.js'", "'outlive'"));
    const deploy = readFileSync(new URL('../docs/deploy.md', import.meta.url), 'utf8');
    const snippets = [...deploy.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => lines(m[1]!));
    expect(snippets).toContainEqual(file);
  });
});

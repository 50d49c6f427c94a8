/**
 * The suite's own harness: a test database is dropped only after every pool
 * made on it has let go of its connections. pg's pool.end() resolves before
 * its sockets close, and a DROP ... WITH (FORCE) that reaches a backend still
 * closing sends its client a FATAL: an 'error' event on a pool with no
 * listener, which failed a CI run of schedule.test.ts after all its tests had
 * passed.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { closePool, freshDb } from './support/db.js';

const db = await freshDb();

async function sessionsNamed(name: string): Promise<number> {
  const [row] = await db.direct.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1`, [name]).then((r) => r.rows);
  return row!.n;
}

describe('test databases', () => {
  it('closePool resolves only once the server has no session of the pool left', async () => {
    // The sessions linger after pool.end() in some rounds only: 4 of 20 here.
    for (let round = 0; round < 20; round++) {
      const name = `close-pool-${round}`;
      const pool = db.newPool({ connectionString: db.directUrl, max: 4, application_name: name });
      await Promise.all(Array.from({ length: 4 }, () => pool.query('SELECT pg_sleep(0.01)')));
      expect(await sessionsNamed(name)).toBe(4);
      await closePool(pool);
      expect(await sessionsNamed(name)).toBe(0);
    }
  });

  it('closePool of a pool already closed, or never used, returns at once', async () => {
    const used = db.newPool({ max: 1 });
    await used.query('SELECT 1');
    await closePool(used);
    await closePool(used);
    await closePool(db.newPool({ max: 1 }));
  });

  it('test files make their pools with openPool or db.newPool, never pg.Pool directly, so each can be closed before a drop', () => {
    const dir = path.dirname(fileURLToPath(import.meta.url));
    const raw = readdirSync(dir)
      // package.test.ts's one is the scratch app's code, in a string.
      .filter((f) => f.endsWith('.test.ts') && f !== 'package.test.ts')
      .flatMap((f) => readFileSync(path.join(dir, f), 'utf8').split('\n').flatMap((line, i) => (/new (pg\.)?Pool\(/.test(line) ? [`${f}:${i + 1}`] : [])));
    expect(raw).toEqual([]);
  });
});

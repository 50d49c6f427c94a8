/**
 * A database as an older release of outlive left it: the migrations up to
 * one of them applied, by drizzle's migrator as releases before migrate()
 * did.
 */
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate as drizzleMigrate } from 'drizzle-orm/node-postgres/migrator';
import type pg from 'pg';
import { MIGRATIONS_FOLDER } from '../../src/node/migrate.js';

/** Applies the migrations up to and including `last` (a journal tag's number), as an older outlive would have. */
export async function migrateUpTo(client: pg.Client, last: number): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'outlive-mig-'));
  try {
    const journal = JSON.parse(readFileSync(join(MIGRATIONS_FOLDER, 'meta/_journal.json'), 'utf8'));
    journal.entries = journal.entries.filter((e: { idx: number }) => e.idx <= last);
    cpSync(MIGRATIONS_FOLDER, dir, { recursive: true });
    writeFileSync(join(dir, 'meta/_journal.json'), JSON.stringify(journal));
    await drizzleMigrate(drizzle(client), { migrationsFolder: dir, migrationsSchema: 'outlive', migrationsTable: 'migrations' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The scheduled tick: on every cron trigger, recover the tasks whose passes
 * died, then run one bounded pass. Overlapping ticks (two invocations for the
 * same minute, a tick meeting a drain) are harmless: their passes claim
 * disjoint tasks.
 *
 * Cloudflare calls the Worker's `scheduled` handler, which needs no
 * authentication. Vercel calls a route with `GET` and
 * `Authorization: Bearer <CRON_SECRET>`, which {@link handleCronRequest} checks.
 */
import { MIN_SECRET_LENGTHS } from '../model/checks.js';
import { toError } from '../model/errors.js';
import { secretsEqual } from './nudge.js';
import { applyRetention } from '../maintenance/retention.js';
import { enqueueDue } from '../maintenance/schedule.js';
import { PassError, type TickReport } from '../pass/tick.js';
import { json, runPass, type Invocation } from './invocation.js';

/** Rows one cron tick's retention deletes at most: a few batches, well inside the budget. */
export const CRON_RETENTION_ROWS = 2_000;

/**
 * Runs the scheduled tick: enqueue the schedule slots that are due (each
 * exactly once, however many ticks overlap), delete a bounded batch of old
 * finished work, then recovery and a bounded pass (tick recovers first), which
 * also runs the slots just enqueued. A schedule or retention failure is
 * logged and does not stop the pass.
 */
export async function cronPass(inv: Invocation): Promise<TickReport> {
  if (inv.schedules.length > 0) {
    try {
      const due = await enqueueDue(inv.pool, inv.schedules);
      if (due.enqueued.length || due.added.length || due.changed.length || due.removed.length) {
        inv.log('schedules', { enqueued: due.enqueued.length, skipped: due.skipped, added: due.added, changed: due.changed, removed: due.removed });
      }
    } catch (err) {
      inv.log('schedules-failed', { error: toError(err).message });
    }
  }
  try {
    const kept = await applyRetention(inv.pool, { maxRows: CRON_RETENTION_ROWS });
    if (kept.tasks || kept.runTasks || kept.runs || kept.slots) inv.log('retention', { ...kept });
  } catch (err) {
    inv.log('retention-failed', { error: toError(err).message });
  }
  return runPass(inv, 'cron');
}

/** Handles a cron request authenticated by `Authorization: Bearer <CRON_SECRET>`; never throws. */
export async function handleCronRequest(request: Request, inv: Invocation): Promise<Response> {
  if (request.method !== 'GET') return json(405, { error: 'use GET' }, { allow: 'GET' });
  const secret = inv.env.CRON_SECRET;
  if (typeof secret !== 'string' || secret.length < MIN_SECRET_LENGTHS.cron) {
    inv.log('cron-misconfigured', { error: `CRON_SECRET is not set or shorter than ${MIN_SECRET_LENGTHS.cron} characters` });
    return json(500, { error: 'the cron endpoint is not configured' });
  }
  const header = request.headers.get('authorization') ?? '';
  const presented = header.startsWith('Bearer ') ? header.slice('Bearer '.length) : '';
  if (!secretsEqual(presented, secret)) {
    inv.log('cron-rejected', { reason: presented ? 'wrong' : 'missing' });
    return json(401, { error: 'missing or wrong cron secret' }, { 'www-authenticate': 'Bearer' });
  }
  try {
    const report = await cronPass(inv);
    return json(200, { report });
  } catch (err) {
    // runPass logged the error (redacted); the caller gets the counts only.
    return json(500, { error: 'the pass failed', ...(err instanceof PassError ? { report: err.report } : {}) });
  }
}

/**
 * Vercel's signal route: `POST /api/signal`, a provider's Standard Webhooks
 * call (verified with `OUTLIVE_SIGNAL_SECRETS`) or the app's own signed one
 * (`OUTLIVE_DRAIN_SECRET`), whose body `{ key, payload }` ends the steps
 * waiting on `key`; then a pass runs them on in Vercel's `waitUntil`. To
 * take a provider's own events, give it a `toSignal` (see `createSignalRoute`).
 */
import { createSignalRoute } from 'outlive/vercel';
import { tasks } from '../tasks.js';

/** Verifies the call's signature, sends its signal, then runs a bounded pass. */
export const POST = createSignalRoute(tasks);

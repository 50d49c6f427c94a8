/**
 * The metrics snapshot (src/admin/metrics.ts) as OpenTelemetry observable
 * gauges on a `Meter` the app gives: `observeQueues(meter, db)`. Only types
 * come from `@opentelemetry/api` (an optional peer), so nothing here loads
 * it; the app's SDK calls the callback at each collection, and an exporter
 * to Prometheus names the gauges as `/metrics` does (`outlive.queue.lag` in
 * seconds is `outlive_queue_lag_seconds`).
 */
import type { BatchObservableCallback, Meter, Observable } from '@opentelemetry/api';
import { DEPTH_STATES, FINISHED_STATES, QUANTILES, metricsSnapshot, type MetricsOptions, type MetricsSnapshot } from '../admin/metrics.js';
import type { Database } from '../db/executor.js';
import { toError } from '../model/errors.js';

/** How {@link observeQueues} reads. */
export interface ObserveQueuesOptions extends Pick<MetricsOptions, 'windowSeconds' | 'sampleCap'> {
  /**
   * The least time between two reads of the database, in ms (default
   * 10,000): collections closer than that report the last snapshot again,
   * so several readers, or a short export interval, cost one read.
   */
  intervalMs?: number;
  /** Told of a failed read; the collection then reports nothing. Default: a JSON line on `console.error`. */
  onError?: (error: Error) => void;
}

/** What {@link observeQueues} registered; `stop()` removes its callback. */
export interface QueueObserver {
  stop(): void;
}

/**
 * Registers observable gauges of each queue's depth by state, its lag, its
 * pause, its tasks blocked on limits, the paused keys, and the window's
 * finished tasks and quantiles of durations on `meter`, read from the rows
 * at most once per `intervalMs`.
 */
export function observeQueues(meter: Meter, db: Database, options: ObserveQueuesOptions = {}): QueueObserver {
  const intervalMs = options.intervalMs ?? 10_000;
  if (!(Number.isFinite(intervalMs) && intervalMs >= 0)) throw new RangeError(`outlive: observeQueues intervalMs must be a number of ms, 0 or more, not ${intervalMs}`);
  const onError = options.onError ?? ((e: Error) => console.error(JSON.stringify({ outlive: 'metrics-error', error: e.message.split('\n')[0] })));
  const depth = meter.createObservableGauge('outlive.queue.depth', { description: 'Tasks per queue by state: ready, scheduled, running, waiting.', unit: '{task}' });
  const lag = meter.createObservableGauge('outlive.queue.lag', { description: 'Age of the oldest ready task per queue; 0 when none is ready.', unit: 's' });
  const paused = meter.createObservableGauge('outlive.queue.paused', { description: '1 when the queue is paused, else 0.' });
  const blocked = meter.createObservableGauge('outlive.limit.blocked_tasks', { description: 'Tasks per queue waiting for a limit key to have room.', unit: '{task}' });
  const keysPaused = meter.createObservableGauge('outlive.limit.keys_paused', { description: 'Limit keys paused now.', unit: '{key}' });
  const finished = meter.createObservableGauge('outlive.recent.finished_tasks', { description: 'Tasks per queue that reached each final state within the window.', unit: '{task}' });
  const durations = {
    attemptSeconds: meter.createObservableGauge('outlive.recent.attempt_duration', { description: 'Quantiles of the last attempt\'s duration of tasks that succeeded or failed within the window.', unit: 's' }),
    startLatencySeconds: meter.createObservableGauge('outlive.recent.start_latency', { description: 'Quantiles of the time from due to started of the same tasks.', unit: 's' }),
    signalToResumeSeconds: meter.createObservableGauge('outlive.recent.signal_to_resume', { description: 'Quantiles of the time from a wait\'s end by its signal to the start of the step after it.', unit: 's' }),
  } as const;
  const observables: Observable[] = [depth, lag, paused, blocked, keysPaused, finished, ...Object.values(durations)];

  let last: { at: number; snapshot: Promise<MetricsSnapshot> } | null = null;
  const read = (): Promise<MetricsSnapshot> => {
    const at = Date.now();
    if (last === null || at - last.at >= intervalMs) {
      const snapshot = metricsSnapshot(db, { windowSeconds: options.windowSeconds, sampleCap: options.sampleCap });
      last = { at, snapshot };
      // A failed read is not kept: the next collection reads again.
      snapshot.catch(() => { if (last?.snapshot === snapshot) last = null; });
    }
    return last.snapshot;
  };

  const callback: BatchObservableCallback = async (result) => {
    let s: MetricsSnapshot;
    try {
      s = await read();
    } catch (err) {
      onError(toError(err));
      return;
    }
    for (const q of s.queues) {
      for (const state of DEPTH_STATES) result.observe(depth, q.depth[state], { queue: q.queue, state });
      for (const state of FINISHED_STATES) result.observe(finished, q.finished[state], { queue: q.queue, state });
      result.observe(lag, q.lagSeconds, { queue: q.queue });
      result.observe(paused, q.paused ? 1 : 0, { queue: q.queue });
      result.observe(blocked, q.blockedOnLimits, { queue: q.queue });
    }
    result.observe(keysPaused, s.keysPaused);
    for (const [field, gauge] of Object.entries(durations) as [keyof typeof durations, Observable][]) {
      for (const q of QUANTILES) {
        const v = s[field][q];
        if (v !== null) result.observe(gauge, v, { quantile: q });
      }
    }
  };
  meter.addBatchObservableCallback(callback, observables);
  return { stop: () => meter.removeBatchObservableCallback(callback, observables) };
}

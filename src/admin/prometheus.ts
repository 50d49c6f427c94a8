/**
 * A {@link MetricsSnapshot} in Prometheus's text exposition format (0.0.4):
 * a HELP and a TYPE line per metric, then its samples. Names carry their
 * unit (`_seconds`); every metric is a gauge, since each is read afresh from
 * the rows at every scrape; labels are queues, states and quantiles, never
 * an id or a limit's key, so the series stay few.
 */
import { DEPTH_STATES, FINISHED_STATES, QUANTILES, type MetricsSnapshot, type Quantiles } from './metrics.js';

/** The Content-Type of {@link prometheusText}'s output. */
export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

type Labels = Record<string, string>;
type Sample = [Labels, number];

/** A label's value, escaped as the format asks: backslash, double quote and line feed. */
export function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

function escapeHelp(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

function formatValue(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  return String(v);
}

function metric(name: string, help: string, samples: Sample[]): string {
  const lines = [`# HELP ${name} ${escapeHelp(help)}`, `# TYPE ${name} gauge`];
  for (const [labels, value] of samples) {
    const pairs = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabelValue(v)}"`);
    lines.push(`${name}${pairs.length ? `{${pairs.join(',')}}` : ''} ${formatValue(value)}`);
  }
  return lines.join('\n');
}

function quantileSamples(q: Quantiles): Sample[] {
  return QUANTILES.flatMap((quantile): Sample[] => (q[quantile] === null ? [] : [[{ quantile: String(quantile) }, q[quantile]!]]));
}

/** Renders a snapshot as Prometheus text, ending with a line feed. */
export function prometheusText(s: MetricsSnapshot): string {
  const window = `the last ${s.windowSeconds} s`;
  return [
    metric('outlive_queue_depth', 'Tasks per queue by state: ready (due), scheduled (due later), running, waiting (a wait for a signal, a sleep, or blocked on a limit). Tasks waiting on their dependencies are not counted.',
      s.queues.flatMap((q) => DEPTH_STATES.map((state): Sample => [{ queue: q.queue, state }, q.depth[state]]))),
    metric('outlive_queue_lag_seconds', 'Age of the oldest ready task per queue: how long it has been due and not started; 0 when none is ready.',
      s.queues.map((q): Sample => [{ queue: q.queue }, q.lagSeconds])),
    metric('outlive_queue_paused', '1 when the queue is paused (no claim takes its tasks), else 0.',
      s.queues.map((q): Sample => [{ queue: q.queue }, q.paused ? 1 : 0])),
    metric('outlive_limit_blocked_tasks', 'Tasks per queue waiting for a limit key to have room (concurrency, rate, or a paused key).',
      s.queues.map((q): Sample => [{ queue: q.queue }, q.blockedOnLimits])),
    metric('outlive_limit_keys_paused', 'Limit keys paused now, by hand or after a 429.', [[{}, s.keysPaused]]),
    metric('outlive_recent_window_seconds', 'The window the outlive_recent_* metrics are read over, in seconds.', [[{}, s.windowSeconds]]),
    metric('outlive_recent_finished_tasks', `Tasks per queue that reached each final state in ${window} (at most ${s.sampleCap} per state; see outlive_recent_sampled).`,
      s.queues.flatMap((q) => FINISHED_STATES.map((state): Sample => [{ queue: q.queue, state }, q.finished[state]]))),
    metric('outlive_recent_sampled', `1 when a final state reached ${s.sampleCap} tasks in ${window}: the outlive_recent_* figures are then of its latest ${s.sampleCap}.`,
      [[{}, s.sampled ? 1 : 0]]),
    metric('outlive_recent_attempt_duration_seconds', `Quantiles of the last attempt's duration of tasks that succeeded or failed in ${window}.`,
      quantileSamples(s.attemptSeconds)),
    metric('outlive_recent_start_latency_seconds', `Quantiles of the time from due to started of the last attempt of tasks that succeeded or failed in ${window}.`,
      quantileSamples(s.startLatencySeconds)),
    metric('outlive_recent_signal_to_resume_seconds', `Quantiles of the time from a wait's end by its signal to the start of the step after it, for waits ended in ${window}.`,
      quantileSamples(s.signalToResumeSeconds)),
  ].join('\n') + '\n';
}

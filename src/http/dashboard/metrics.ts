/**
 * `GET <dashboard>/metrics`: the metrics snapshot as Prometheus text, for a
 * scraper that presents the dashboard's token as a Bearer token (the
 * dashboard's router checks it before this is called).
 */
import { metricsSnapshot } from '../../admin/metrics.js';
import { PROMETHEUS_CONTENT_TYPE, prometheusText } from '../../admin/prometheus.js';
import type { Database } from '../../db/executor.js';

/** Answers a scrape; a database error propagates to the dashboard's own 500, which logs it. */
export async function metricsResponse(db: Database): Promise<Response> {
  const text = prometheusText(await metricsSnapshot(db));
  return new Response(text, {
    status: 200,
    headers: { 'content-type': PROMETHEUS_CONTENT_TYPE, 'cache-control': 'no-store', 'x-content-type-options': 'nosniff' },
  });
}

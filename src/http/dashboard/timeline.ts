/**
 * A run's timeline as an SVG: one bar per step from its start to its end
 * for a small run, else for each bucket of time how many steps started
 * (above the axis) and finished (below it, by how they finished).
 */
import type { RunTimeline } from '../../admin/run-view.js';
import { html, type Html } from './html.js';
import { STATE_COLOURS } from './graph.js';

const W = 900;
const ROW = 14;

function clock(d: Date): string {
  return d.toISOString().slice(11, 19);
}

/** Draws a run's timeline; each step's bar links to its task (`taskHref`). */
export function renderTimeline(t: RunTimeline, now: Date, taskHref: (id: string) => string): Html {
  if (t.kind === 'empty') return html`<p class="muted" id="timeline">No step has started yet.</p>`;
  const from = t.from.getTime();
  const span = Math.max(1, t.to.getTime() - from);
  const x = (d: Date) => ((d.getTime() - from) / span) * (W - 10);
  if (t.kind === 'steps') {
    const H = t.steps.length * ROW + 16;
    const bars = t.steps.map((s, i) => {
      const x1 = x(s.startedAt);
      const x2 = x(s.finishedAt ?? now);
      return html`<a href="${taskHref(s.taskId)}"><g class="span" data-step="${s.step}" data-state="${s.state}"><title>${s.step}: ${s.state}, started ${s.startedAt.toISOString()}${s.finishedAt ? `, ended ${s.finishedAt.toISOString()}` : ', still running'}</title><rect x="${x1.toFixed(1)}" y="${i * ROW}" width="${Math.max(2, x2 - x1).toFixed(1)}" height="${ROW - 3}" fill="${STATE_COLOURS[s.state]}" stroke="#555" stroke-width="0.5"/></g></a>`;
    });
    return html`<svg id="timeline" class="chart" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="when each step started and ended">${bars}
<text x="0" y="${H - 3}" class="axis">${clock(t.from)} UTC</text><text x="${W}" y="${H - 3}" class="axis" text-anchor="end">${clock(t.to)} UTC</text></svg>`;
  }
  const H = 120;
  const mid = H / 2;
  const n = t.buckets.length;
  const bw = W / n;
  const max = Math.max(1, ...t.buckets.map((b) => Math.max(b.started, b.succeeded + b.failed + b.other)));
  const scale = (v: number) => (v / max) * (mid - 12);
  const bucketMs = span / n;
  const bars = t.buckets.map((b, i) => {
    const at = new Date(from + i * bucketMs);
    const hs = scale(b.started);
    const hok = scale(b.succeeded);
    const hf = scale(b.failed);
    const ho = scale(b.other);
    const bx = (i * bw).toFixed(1);
    const w = Math.max(1, bw - 1).toFixed(1);
    return html`<g class="bucket" data-started="${b.started}" data-succeeded="${b.succeeded}" data-failed="${b.failed}"><title>${clock(at)} UTC: ${b.started} started, ${b.succeeded} succeeded, ${b.failed} failed${b.other ? `, ${b.other} ended otherwise` : ''}</title><rect x="${bx}" y="${(mid - hs).toFixed(1)}" width="${w}" height="${hs.toFixed(1)}" fill="${STATE_COLOURS.running}"/><rect x="${bx}" y="${mid}" width="${w}" height="${hok.toFixed(1)}" fill="${STATE_COLOURS.succeeded}"/><rect x="${bx}" y="${(mid + hok).toFixed(1)}" width="${w}" height="${hf.toFixed(1)}" fill="${STATE_COLOURS.failed}"/><rect x="${bx}" y="${(mid + hok + hf).toFixed(1)}" width="${w}" height="${ho.toFixed(1)}" fill="${STATE_COLOURS.skipped}"/></g>`;
  });
  return html`<svg id="timeline" class="chart" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H + 14}" viewBox="0 0 ${W} ${H + 14}" role="img" aria-label="steps started (above) and ended (below) over time">
<line x1="0" y1="${mid}" x2="${W}" y2="${mid}" stroke="#999"/>${bars}
<text x="0" y="${H + 12}" class="axis">${clock(t.from)} UTC</text><text x="${W}" y="${H + 12}" class="axis" text-anchor="end">${clock(t.to)} UTC</text><text x="4" y="10" class="axis">started (max ${max} per ${Math.max(1, Math.round(bucketMs / 1000))}s)</text><text x="4" y="${H - 2}" class="axis">ended</text></svg>`;
}

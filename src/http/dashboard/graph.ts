/**
 * A run's graph as an SVG: tasks in columns by dependency depth (a task sits
 * one column right of its deepest dependency), edges from each dependency to
 * the task waiting for it, boxes coloured by state. A column with many tasks
 * of one state shows the first few and folds the rest into one "+N more" box,
 * so a 10,000-page fan-out still draws as a handful of boxes. The run page
 * draws it only for small runs (run-page.ts), as its depth is found by
 * recursion.
 */
import type { ExplainedTask } from '../../admin/explain.js';
import type { TaskState } from '../../model/states.js';
import { html, type Html } from './html.js';

/** Fill colours of the task states (shared with the page's badges). */
export const STATE_COLOURS: Record<TaskState, string> = {
  pending: '#d9d9d9',
  running: '#8ec5ff',
  succeeded: '#8fd19e',
  failed: '#f28b82',
  cancelled: '#c7b7e8',
  skipped: '#f5d78e',
};

interface Node {
  key: string;
  label: string;
  state: TaskState;
  /** The task's id; null for a folded group. */
  taskId: string | null;
  depth: number;
  why: string;
  x: number;
  y: number;
}

/** Layout of a run's graph, before drawing. */
export interface GraphLayout {
  nodes: Node[];
  edges: [string, string][];
  width: number;
  height: number;
}

const BOX_W = 200;
const BOX_H = 28;
const GAP_X = 60;
const GAP_Y = 10;

/** Places a run's tasks in columns by depth, folding same-state siblings beyond `maxPerGroup`. */
export function layoutRun(
  tasks: readonly ExplainedTask[],
  deps: readonly { task: string; dependsOn: string }[],
  maxPerGroup = 8,
): GraphLayout {
  const byId = new Map(tasks.map((t) => [t.id, t]));
  const parents = new Map<string, string[]>();
  for (const e of deps) {
    if (!byId.has(e.dependsOn) || !byId.has(e.task)) continue;
    const ps = parents.get(e.task);
    if (ps) ps.push(e.dependsOn);
    else parents.set(e.task, [e.dependsOn]);
  }
  const depth = new Map<string, number>();
  const depthOf = (taskId: string, seen: Set<string> = new Set()): number => {
    const known = depth.get(taskId);
    if (known !== undefined) return known;
    if (seen.has(taskId)) return 0;
    seen.add(taskId);
    const d = Math.max(-1, ...(parents.get(taskId) ?? []).map((p) => depthOf(p, seen))) + 1;
    depth.set(taskId, d);
    return d;
  };
  // Columns, then within a column groups by state in the order a task lives.
  const columns = new Map<number, Map<TaskState, ExplainedTask[]>>();
  for (const t of tasks) {
    const d = depthOf(t.id);
    if (!columns.has(d)) columns.set(d, new Map());
    const col = columns.get(d)!;
    const group = col.get(t.state);
    if (group) group.push(t);
    else col.set(t.state, [t]);
  }
  const order: TaskState[] = ['failed', 'running', 'pending', 'skipped', 'cancelled', 'succeeded'];
  const nodes: Node[] = [];
  const nodeOf = new Map<string, string>();
  let height = 0;
  for (const d of [...columns.keys()].sort((a, b) => a - b)) {
    // Room above the boxes for edges that skip a column.
    let y = 26;
    const col = columns.get(d)!;
    for (const state of order) {
      const group = col.get(state) ?? [];
      const shown = group.length > maxPerGroup ? group.slice(0, maxPerGroup - 1) : group;
      for (const t of shown) {
        nodes.push({ key: t.id, label: t.step ?? t.name, state, taskId: t.id, depth: d, why: t.why, x: 10 + d * (BOX_W + GAP_X), y });
        nodeOf.set(t.id, t.id);
        y += BOX_H + GAP_Y;
      }
      if (shown.length < group.length) {
        const key = `group:${d}:${state}`;
        const rest = group.length - shown.length;
        nodes.push({ key, label: `+${rest} more ${state}`, state, taskId: null, depth: d, why: `${rest} more tasks ${state}`, x: 10 + d * (BOX_W + GAP_X), y });
        for (const t of group.slice(shown.length)) nodeOf.set(t.id, key);
        y += BOX_H + GAP_Y;
      }
    }
    height = Math.max(height, y);
  }
  const edgeSet = new Set<string>();
  const edges: [string, string][] = [];
  for (const [task, ps] of parents) {
    for (const p of ps) {
      const from = nodeOf.get(p)!;
      const to = nodeOf.get(task)!;
      const k = `${from}>${to}`;
      if (!edgeSet.has(k)) {
        edgeSet.add(k);
        edges.push([from, to]);
      }
    }
  }
  const width = 20 + Math.max(1, columns.size) * (BOX_W + GAP_X) - GAP_X;
  return { nodes, edges, width, height: Math.max(height, 50) };
}

// Keeps both ends: step names like `page:https://site/page/17` differ at the end.
function shorten(text: string, max: number): string {
  if (text.length <= max) return text;
  const head = Math.min(6, Math.floor(max / 3));
  return text.slice(0, head) + '…' + text.slice(text.length - (max - head - 1));
}

/** Draws a run's graph; each task box links to the task's page (`taskHref`). */
export function renderRunGraph(layout: GraphLayout, taskHref: (id: string) => string): Html {
  const at = new Map(layout.nodes.map((n) => [n.key, n]));
  const edges = layout.edges.map(([from, to]) => {
    const a = at.get(from)!;
    const b = at.get(to)!;
    const x1 = a.x + BOX_W;
    const y1 = a.y + BOX_H / 2;
    const x2 = b.x;
    const y2 = b.y + BOX_H / 2;
    const mid = (x1 + x2) / 2;
    if (b.depth - a.depth > 1) {
      // An edge that skips columns arcs above the boxes in between, rather than hiding behind them.
      const top = 8;
      return html`<path class="edge" d="M${x1},${y1} C${x1 + 40},${top} ${x2 - 40},${top} ${x2},${y2}" marker-end="url(#arrow)"/>`;
    }
    return html`<path class="edge" d="M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}" marker-end="url(#arrow)"/>`;
  });
  const nodes = layout.nodes.map((n) => {
    const box = html`<g class="node" data-state="${n.state}" data-step="${n.label}"${n.taskId ? html` data-task="${n.taskId}"` : ''}>
<title>${n.label}: ${n.why}</title>
<rect x="${n.x}" y="${n.y}" width="${BOX_W}" height="${BOX_H}" rx="5" fill="${STATE_COLOURS[n.state]}" stroke="#555" ${n.taskId ? '' : html`stroke-dasharray="4 3"`}/>
<text x="${n.x + 8}" y="${n.y + 18}">${shorten(n.label, n.taskId ? 17 : 28)}</text>
${n.taskId ? html`<text class="state" x="${n.x + BOX_W - 6}" y="${n.y + 18}" text-anchor="end">${n.state}</text>` : ''}</g>`;
    return n.taskId ? html`<a href="${taskHref(n.taskId)}">${box}</a>` : box;
  });
  return html`<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="${layout.width}" height="${layout.height}" viewBox="0 0 ${layout.width} ${layout.height}" role="img" aria-label="the run's tasks and what waits on what">
<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>
${edges}${nodes}</svg>`;
}

/** A small bar chart of tasks finished per minute (succeeded stacked under failed). */
export function renderThroughput(points: readonly { minute: Date; succeeded: number; failed: number }[]): Html {
  const W = 600;
  const H = 90;
  const max = Math.max(1, ...points.map((p) => p.succeeded + p.failed));
  const bw = W / Math.max(1, points.length);
  const bars = points.map((p, i) => {
    const hs = (p.succeeded / max) * (H - 12);
    const hf = (p.failed / max) * (H - 12);
    const x = i * bw;
    const label = `${p.minute.toISOString().slice(11, 16)} UTC: ${p.succeeded} succeeded, ${p.failed} failed`;
    return html`<g><title>${label}</title><rect x="${x.toFixed(1)}" y="${(H - hs).toFixed(1)}" width="${(bw - 1).toFixed(1)}" height="${hs.toFixed(1)}" fill="${STATE_COLOURS.succeeded}"/><rect x="${x.toFixed(1)}" y="${(H - hs - hf).toFixed(1)}" width="${(bw - 1).toFixed(1)}" height="${hf.toFixed(1)}" fill="${STATE_COLOURS.failed}"/></g>`;
  });
  return html`<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H + 14}" viewBox="0 0 ${W} ${H + 14}" role="img" aria-label="tasks finished per minute, last hour">
<line x1="0" y1="${H}" x2="${W}" y2="${H}" stroke="#999"/>${bars}
<text x="0" y="${H + 12}" class="axis">-60 min</text><text x="${W}" y="${H + 12}" class="axis" text-anchor="end">now</text><text x="4" y="10" class="axis">max ${max}/min</text></svg>`;
}

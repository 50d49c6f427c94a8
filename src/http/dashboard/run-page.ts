/**
 * A run's page, the same size for 10 steps as for 100,000: its steps grouped
 * by name with counts and each group's first error, a timeline, one page of
 * steps (searchable by the start of their names) with why each is where it
 * is, and the graph when the run is small enough to draw.
 */
import type { ExplainedTask, StepPage } from '../../admin/explain.js';
import type { RunGroups, RunTimeline } from '../../admin/run-view.js';
import { TASK_STATES } from '../../model/states.js';
import { html, type Html } from './html.js';
import { renderRunGraph, type GraphLayout } from './graph.js';
import { action, badge, layout, progress, when, type PageContext } from './pages.js';
import { renderTimeline } from './timeline.js';

/** Runs with at most this many tasks have their graph drawn. */
export const GRAPH_MAX_TASKS = 200;

/** What the run page shows. */
export interface RunPageData {
  run: RunGroups;
  timeline: RunTimeline;
  steps: StepPage;
  /** The step search (`?step=`) and the page's start (`?after=`). */
  search: { prefix: string; after: string };
  /** The graph, for a run of at most {@link GRAPH_MAX_TASKS} tasks. */
  graph: GraphLayout | null;
}

function n(x: number): string {
  return x.toLocaleString('en-US');
}

function groupRows(ctx: PageContext, run: RunGroups): Html {
  const href = (search: string) => `${ctx.basePath}/runs/${run.id}?step=${encodeURIComponent(search)}`;
  return html`<table id="step-groups"><thead><tr><th>steps</th><th>count</th><th>by state</th><th>first error</th></tr></thead><tbody>
${run.groups.map((g) => html`<tr data-prefix="${g.prefix}"><td><a href="${href(g.search)}">${g.prefix}</a></td><td class="total">${n(g.total)}</td>
<td class="states">${TASK_STATES.filter((s) => g.counts[s] > 0).map((s) => html`${n(g.counts[s])} ${badge(s)} `)}</td>
<td class="err">${g.firstError ? html`<a href="${ctx.basePath}/tasks/${g.firstError.taskId}">${g.firstError.step}</a>: ${g.firstError.error ?? 'unknown error'}` : ''}</td></tr>`)}
</tbody></table>
${run.moreGroups > 0 ? html`<p class="muted">and ${n(run.moreGroups)} smaller groups; search the steps by name below.</p>` : ''}`;
}

function stepRows(ctx: PageContext, steps: readonly ExplainedTask[]): Html {
  return html`<table id="run-tasks"><thead><tr><th>task</th><th>step</th><th>state</th><th>attempts</th><th>why</th></tr></thead><tbody>
${steps.map((t) => html`<tr data-task="${t.id}" data-state="${t.state}"><td><a href="${ctx.basePath}/tasks/${t.id}">#${t.id}</a></td><td>${t.step ?? t.name}</td><td>${badge(t.state)}</td><td>${t.attempts}/${t.maxAttempts}</td><td>${t.why}</td></tr>`)}
</tbody></table>`;
}

/** A run: its groups of steps, its timeline, a page of its steps and, when small, its graph. */
export function runPage(ctx: PageContext, data: RunPageData): string {
  const { run, steps, search } = data;
  const done = run.total - run.counts.pending - run.counts.running;
  const query = (params: Record<string, string>) => {
    const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== ''));
    const qs = String(q);
    return `${ctx.basePath}/runs/${run.id}${qs ? `?${qs}` : ''}`;
  };
  const body = html`<h1>Run #${run.id}: ${run.name} ${badge(run.state)}</h1>
<p>${progress(done, run.total)} · ${TASK_STATES.filter((st) => run.counts[st]).map((st) => html`${badge(st)} ${n(run.counts[st])} `)}
· started ${when(run.createdAt, ctx.now)}${run.finishedAt ? html` · finished ${when(run.finishedAt, ctx.now)}` : ''}</p>
${run.error ? html`<p class="err">Error: ${run.error}</p>` : ''}
<p>${run.state === 'running' ? action(ctx, `/runs/${run.id}/cancel`, 'Cancel run', 'cancel') : ''}
${run.state === 'failed' || run.state === 'cancelled' ? action(ctx, `/runs/${run.id}/retry`, 'Retry run', 'retry') : ''}</p>
<h2>Steps by name</h2>${groupRows(ctx, run)}
<h2>Timeline</h2><p class="muted">When steps started and ended${data.timeline.kind === 'buckets' ? ': above the line, steps started in each slice of time; below, steps that ended, by how' : ''}.</p>
<div class="graph-wrap">${renderTimeline(data.timeline, ctx.now, (id) => `${ctx.basePath}/tasks/${id}`)}</div>
${data.graph
    ? html`<h2>Graph</h2><p class="muted">Each box is a task, left to right by what it waits for; an arrow runs from a task to the one waiting on it. Hover for the reason.</p>
<div class="graph-wrap">${renderRunGraph(data.graph, (id) => `${ctx.basePath}/tasks/${id}`)}</div>`
    : html`<p class="muted">The graph is drawn for runs of at most ${GRAPH_MAX_TASKS} tasks; this one has ${n(run.total)}.</p>`}
<h2>Steps${search.prefix ? html` starting with <code>${search.prefix}</code>` : ''}</h2>
<form method="get" action="${ctx.basePath}/runs/${run.id}" class="step-search"><input name="step" value="${search.prefix}" placeholder="step name starts with" aria-label="step name starts with" maxlength="500"> <input type="hidden" name="refresh" value="0"><button type="submit">Search</button>${search.prefix || search.after ? html` <a href="${query({})}">all steps</a>` : ''}</form>
${steps.steps.length === 0 ? html`<p class="muted">No step${search.prefix ? ' starts with that' : ''}${search.after ? ' after that one' : ''}.</p>` : stepRows(ctx, steps.steps)}
<p class="pager">${search.after ? html`<a href="${query({ step: search.prefix })}" data-page="first">first page</a> ` : ''}${steps.next !== null ? html`<a href="${query({ step: search.prefix, after: steps.next })}" data-page="next">next ${steps.steps.length} steps →</a>` : ''}</p>`;
  return layout(ctx, `Run #${run.id}`, body);
}

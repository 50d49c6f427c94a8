/**
 * The dashboard's lists, a page at a time: tasks (filtered by state, name,
 * queue, key and creation time, searched by error text), runs, the queues
 * with their depth, lag and throughput, and the confirmation of a bulk retry
 * or cancel with the count of what it will change.
 */
import type { TaskPage, TaskQuery } from '../../admin/browse.js';
import type { BulkAction } from '../../admin/bulk.js';
import type { KeyState, QueueDepth, QueuePause, RunSummary } from '../../admin/queries.js';
import { keyWait } from '../../admin/queries.js';
import { RUN_STATES, TASK_STATES, type RunState, type TaskState } from '../../model/states.js';
import { html, type Html } from './html.js';
import { ago, badge, count, layout, runRows, when, type PageContext } from './pages.js';

/** The filter fields of a task list, as they travel in a URL or a form. */
const FIELDS = ['state', 'name', 'queue', 'key', 'from', 'to', 'q'] as const;

/** Reads a task filter from a URL's query (or a form); a string says what is wrong with it. */
export function taskQueryOf(params: URLSearchParams): TaskQuery | string {
  const text = (k: string) => {
    const v = (params.get(k) ?? '').trim();
    return v === '' ? undefined : v.slice(0, 500);
  };
  const state = text('state');
  if (state !== undefined && !(TASK_STATES as readonly string[]).includes(state)) return `state must be one of ${TASK_STATES.join(', ')}`;
  const time = (k: 'from' | 'to') => {
    const v = text(k);
    if (v === undefined) return undefined;
    // A datetime-local field sends no zone: read it as UTC, as the pages show times.
    const d = new Date(/[zZ]|[+-]\d\d:?\d\d$/.test(v) ? v : `${v}Z`);
    return Number.isNaN(d.getTime()) ? null : d;
  };
  const from = time('from');
  const to = time('to');
  if (from === null || to === null) return 'from and to are times, like 2026-12-03T14:00 (UTC)';
  return { state: state as TaskState | undefined, name: text('name'), queue: text('queue'), key: text('key'), from, to, error: text('q') };
}

/** The filter as URL parameters (only those set). */
export function queryParams(q: TaskQuery): URLSearchParams {
  const p = new URLSearchParams();
  const put = (k: string, v: string | undefined) => v !== undefined && v !== '' && p.set(k, v);
  put('state', q.state);
  put('name', q.name);
  put('queue', q.queue);
  put('key', q.key);
  put('from', q.from?.toISOString());
  put('to', q.to?.toISOString());
  put('q', q.error);
  return p;
}

function filterForm(ctx: PageContext, q: TaskQuery): Html {
  const input = (name: string, value: string | undefined, label: string, type = 'text') =>
    html`<label>${label} <input type="${type}" name="${name}" value="${value ?? ''}" maxlength="500"></label> `;
  return html`<form method="get" action="${ctx.basePath}/tasks" class="filters" id="task-filters">
<label>state <select name="state"><option value="">any</option>${TASK_STATES.map((s) => html`<option value="${s}"${q.state === s ? html` selected` : ''}>${s}</option>`)}</select></label>
${input('name', q.name, 'name')}${input('queue', q.queue, 'queue')}${input('key', q.key, 'key')}
${input('from', q.from?.toISOString().slice(0, 16), 'created from', 'datetime-local')}${input('to', q.to?.toISOString().slice(0, 16), 'to', 'datetime-local')}
${input('q', q.error, 'error contains')}<input type="hidden" name="refresh" value="0"><button type="submit">Filter</button> <a href="${ctx.basePath}/tasks">clear</a></form>`;
}

/** The task list: one page, its filters, the next page's link, and the bulk actions for what it matches. */
export function tasksPage(ctx: PageContext, q: TaskQuery, data: TaskPage & { before: string | null; window: number }): string {
  const params = queryParams(q);
  const link = (extra: Record<string, string>) => {
    const p = new URLSearchParams(params);
    for (const [k, v] of Object.entries(extra)) p.set(k, v);
    return `${ctx.basePath}/tasks?${p}`;
  };
  const body = html`<h1>Tasks</h1>
${filterForm(ctx, q)}
${data.tasks.length === 0
    ? html`<p class="muted" id="no-tasks">No task matches${data.windowEnded ? html` among the ${data.window.toLocaleString('en-US')} tasks read` : ''}.</p>`
    : html`<table id="tasks"><thead><tr><th>task</th><th>name</th><th>queue</th><th>state</th><th>attempts</th><th>run</th><th>created</th><th>finished</th><th>error</th></tr></thead><tbody>
${data.tasks.map((t) => html`<tr data-task="${t.id}" data-state="${t.state}"><td><a href="${ctx.basePath}/tasks/${t.id}">#${t.id}</a></td><td>${t.name}</td><td>${t.queue}</td><td>${badge(t.state)}</td><td>${t.attempts}/${t.maxAttempts}</td>
<td>${t.runId ? html`<a href="${ctx.basePath}/runs/${t.runId}">#${t.runId}</a> ${t.step ?? ''}` : '-'}</td><td>${when(t.createdAt, ctx.now)}</td><td>${when(t.finishedAt, ctx.now)}</td><td class="err">${t.lastError ?? ''}</td></tr>`)}
</tbody></table>`}
<p class="pager">${data.before ? html`<a href="${link({})}" data-page="first">newest</a> ` : ''}${data.next
    ? html`<a href="${link({ before: data.next })}" data-page="next">${data.windowEnded ? html`search older tasks (before #${data.next}) →` : 'older →'}</a>`
    : html`<span class="muted">the end of the list</span>`}
${data.windowEnded ? html`<span class="muted">A page reads at most ${data.window.toLocaleString('en-US')} tasks, newest first; these are all the matches among them.</span>` : ''}</p>
<h2>Bulk actions</h2>
<p>On every task this filter matches (not only this page); a page with the count comes first.
<a href="${ctx.basePath}/bulk?${String(new URLSearchParams([...params, ['action', 'retry']]))}" data-bulk="retry">Retry the failed and cancelled…</a> ·
<a href="${ctx.basePath}/bulk?${String(new URLSearchParams([...params, ['action', 'cancel']]))}" data-bulk="cancel">Cancel the pending and running…</a></p>`;
  return layout(ctx, 'Tasks', body);
}

/** The confirmation of a bulk action: what it matches, how many, and the button that runs it. */
export function bulkPage(ctx: PageContext, action: BulkAction, q: TaskQuery, n: { n: number; more: boolean }, max: number): string {
  const params = queryParams(q);
  const verb = action === 'retry' ? 'Retry' : 'Cancel';
  const what = action === 'retry' ? 'failed or cancelled' : 'pending or running';
  const filters = [...params].map(([k, v]) => `${k} = ${v}`).join(', ') || 'none';
  const body = html`<h1>${verb} tasks by filter</h1>
<p>Filter: <code id="bulk-filter">${filters}</code></p>
<p id="bulk-count" data-count="${n.n}" data-more="${n.more ? 'yes' : 'no'}"><b>${count(n.n, n.more)}</b> ${what} task${n.n === 1 && !n.more ? '' : 's'} match${action === 'cancel' ? ' (outside runs: a run is cancelled from its page)' : ' (a task of a run is retried with its run)'}.
${n.more ? html`This action changes the newest ${max.toLocaleString('en-US')}; run it again for the rest.` : ''}</p>
${n.n === 0
    ? html`<p><a href="${ctx.basePath}/tasks?${String(params)}">Back to the tasks</a></p>`
    : html`<form method="post" action="${ctx.basePath}/bulk" id="bulk-confirm"><input type="hidden" name="csrf" value="${ctx.csrf}"><input type="hidden" name="action" value="${action}">
${[...params].map(([k, v]) => html`<input type="hidden" name="${k}" value="${v}">`)}
<button type="submit" data-action="bulk-${action}">${verb} ${count(n.n, n.more)} tasks</button> <a href="${ctx.basePath}/tasks?${String(params)}">cancel, back to the tasks</a></form>
<p class="muted">Each task is changed by a guarded statement, in batches: a task that changed since this count is left as it is.</p>`}`;
  return layout(ctx, `${verb} tasks`, body);
}

/** The run list: one page, newest first, filtered by state and name. */
export function runsPage(ctx: PageContext, filter: { state?: RunState; name?: string }, runs: RunSummary[], next: string | null, before: string | null): string {
  const p = new URLSearchParams();
  if (filter.state) p.set('state', filter.state);
  if (filter.name) p.set('name', filter.name);
  const body = html`<h1>Runs</h1>
<form method="get" action="${ctx.basePath}/runs" class="filters"><label>state <select name="state"><option value="">any</option>${RUN_STATES.map((s) => html`<option value="${s}"${filter.state === s ? html` selected` : ''}>${s}</option>`)}</select></label>
<label>name <input name="name" value="${filter.name ?? ''}" maxlength="500"></label> <input type="hidden" name="refresh" value="0"><button type="submit">Filter</button></form>
${runRows(ctx, runs, 'No run matches.')}
<p class="pager">${before ? html`<a href="${ctx.basePath}/runs?${String(p)}" data-page="first">newest</a> ` : ''}${next ? html`<a href="${ctx.basePath}/runs?${String(new URLSearchParams([...p, ['before', next]]))}" data-page="next">older →</a>` : ''}</p>`;
  return layout(ctx, 'Runs', body);
}

/** What the queue view shows. */
export interface QueuesData {
  depths: QueueDepth[];
  /** Tasks finished per queue in the last hour, up to the cap. */
  finished: { queue: string; succeeded: number; failed: number; more: boolean }[];
  paused: QueuePause[];
  /** Parked waits ($wait steps) per queue. */
  waits: { queue: string; n: number; more: boolean }[];
  keys: KeyState[];
}

/** The queues: depth by state, lag, the last hour's throughput, pauses, waits, and the keys that hold tasks back. */
export function queuesPage(ctx: PageContext, d: QueuesData): string {
  const names = [...new Set([...d.depths.map((q) => q.queue), ...d.finished.map((q) => q.queue), ...d.paused.map((q) => q.queue)])].sort();
  const body = html`<h1>Queues</h1>
${names.length === 0
    ? html`<p class="muted">No queue has tasks pending, running or finished in the last hour.</p>`
    : html`<table id="queues"><thead><tr><th>queue</th><th>pending</th><th>running</th><th>lag</th><th>finished, last hour</th><th>waits parked</th><th>paused</th></tr></thead><tbody>
${names.map((name) => {
  const q = d.depths.find((x) => x.queue === name);
  const f = d.finished.find((x) => x.queue === name);
  const p = d.paused.find((x) => x.queue === name);
  const w = d.waits.find((x) => x.queue === name);
  const lag = q?.oldestReadyAt ? Math.max(0, Math.round((ctx.now.getTime() - q.oldestReadyAt.getTime()) / 1000)) : null;
  return html`<tr data-queue="${name}"><td><a href="${ctx.basePath}/tasks?queue=${encodeURIComponent(name)}">${name}</a></td>
<td class="pending">${count(q?.pending ?? 0, q?.pendingMore)}</td><td class="running">${count(q?.running ?? 0, q?.runningMore)}</td>
<td class="lag">${lag === null ? '-' : `${lag}s`}</td>
<td class="finished">${f ? html`${count(f.succeeded, f.more)} ${badge('succeeded')} ${count(f.failed, f.more)} ${badge('failed')} <span class="muted">(${count(Math.round((f.succeeded + f.failed) / 60), f.more)}/min)</span>` : '-'}</td>
<td class="waits">${w ? count(w.n, w.more) : '-'}</td>
<td class="paused">${p ? html`paused${p.reason ? `: ${p.reason}` : ''} (since ${ago(p.pausedAt, ctx.now)})` : '-'}</td></tr>`;
})}
</tbody></table>`}
<p class="muted">Lag: how long the oldest ready task (due, waiting on nothing) has been due. Counts stop at 10,000 ("10000+").</p>
<h2>Keys holding tasks back</h2>
${d.keys.length === 0
    ? html`<p class="muted">No key holds tasks back.</p>`
    : html`<table id="queue-keys"><thead><tr><th>key</th><th>running</th><th>waiting</th><th>why</th></tr></thead><tbody>
${d.keys.map((k) => html`<tr data-key="${k.key}"><td>${k.key}</td><td>${k.running}${k.concurrency === null ? '' : ` of ${k.concurrency}`}</td><td>${k.waitingMore ? `${k.waiting}+` : k.waiting}</td><td>${keyWait(k)?.text ?? ''}</td></tr>`)}
</tbody></table>`}
<p class="muted"><a href="${ctx.basePath}/limits">Limits and pauses</a></p>`;
  return layout(ctx, 'Queues', body);
}

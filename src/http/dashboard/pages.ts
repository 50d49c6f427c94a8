/**
 * The dashboard's pages, rendered on the server: the overview (counts, the
 * last hour, runs, failures, schedules, what flow control holds back), a
 * task (input, output, error history) and the limits (keys, their windows and pauses, paused queues,
 * with buttons to pause and resume). Every value from the rows goes through
 * {@link html}, which escapes it. A run's page is in run-page.ts, the lists
 * in list-pages.ts.
 */
import { formatPeriod, keyWait, progressText, roomText } from '../../admin/queries.js';
import type { KeyState, QueuePause, StatusReport, RunSummary, TaskSummary, TaskDetail, ScheduleSummary } from '../../admin/queries.js';
import { RUN_STATES, TASK_STATES } from '../../model/states.js';
import { html, raw, type Html } from './html.js';
import { renderThroughput, STATE_COLOURS } from './graph.js';

/** What every page needs to link and post back. */
export interface PageContext {
  basePath: string;
  csrf: string;
  /** Seconds between automatic refreshes; 0 for none. */
  refreshSeconds: number;
  now: Date;
  flash?: string | null;
}

const STYLE = raw(`
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#222;background:#f7f7f8}
header{background:#1f2933;color:#fff;padding:10px 20px;display:flex;gap:20px;align-items:baseline}
header a{color:#fff;text-decoration:none;font-weight:600}header .muted{color:#aab}
main{padding:16px 20px;max-width:1400px}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:22px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e4e4e7;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td.err,p.err{color:#a31515;max-width:520px;overflow-wrap:anywhere}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;border:1px solid #0002}
.cards{display:flex;flex-wrap:wrap;gap:8px}.card{background:#fff;border:1px solid #e4e4e7;border-radius:6px;padding:8px 12px;min-width:86px}
.card b{display:block;font-size:20px}.muted{color:#667}
.bar{display:inline-block;width:120px;height:10px;background:#e4e4e7;border-radius:5px;overflow:hidden;vertical-align:middle}
.bar span{display:block;height:100%;background:#4caf50}
form.inline{display:inline}button{font:inherit;padding:2px 10px;cursor:pointer}
pre{background:#fff;border:1px solid #e4e4e7;padding:8px;overflow:auto;max-height:300px}
.graph-wrap{overflow:auto;background:#fff;border:1px solid #e4e4e7;max-height:640px}
svg.graph text{font:12px system-ui,sans-serif}svg.graph text.state{font-size:10px;fill:#333}
svg.graph .edge{fill:none;stroke:#888;stroke-width:1.2}svg.chart .axis{font:10px system-ui,sans-serif;fill:#667}
form.pause input[name=reason]{width:11em}select{font:inherit}
form.filters,form.step-search{margin:6px 0 10px}form.filters label{margin-right:8px}.pager{margin:8px 0}
.flash{background:#fff8c5;border:1px solid #e5d38a;padding:6px 10px;margin-bottom:10px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 14px;background:#fff;padding:10px;border:1px solid #e4e4e7}dt{color:#667}dd{margin:0}
`);

/** A state as a coloured badge. */
export function badge(state: string): Html {
  const colour = (STATE_COLOURS as Record<string, string>)[state] ?? '#ddd';
  return html`<span class="badge state-${state}" style="background:${colour}">${state}</span>`;
}

/** "3m ago", "in 2h". */
export function ago(d: Date | null, now: Date): string {
  if (!d) return '-';
  const s = Math.round((now.getTime() - d.getTime()) / 1000);
  const a = Math.abs(s);
  const text = a < 60 ? `${a}s` : a < 3600 ? `${Math.floor(a / 60)}m` : a < 86400 ? `${Math.floor(a / 3600)}h` : `${Math.floor(a / 86400)}d`;
  return s >= 0 ? `${text} ago` : `in ${text}`;
}

/** A time as "3m ago", its instant in the tooltip. */
export function when(d: Date | null, now: Date): Html {
  if (!d) return html`-`;
  return html`<time datetime="${d.toISOString()}" title="${d.toISOString()}">${ago(d, now)}</time>`;
}

/** A button that posts to `path` with the page's CSRF value. */
export function action(ctx: PageContext, path: string, label: string, name: string): Html {
  return html`<form class="inline" method="post" action="${ctx.basePath}${path}"><input type="hidden" name="csrf" value="${ctx.csrf}"><button type="submit" name="action" value="${name}" data-action="${name}">${label}</button></form>`;
}

/** A bar and "done of total". */
export function progress(done: number, total: number): Html {
  const pct = total === 0 ? 0 : Math.round((done / total) * 100);
  return html`<span class="bar" title="${pct}%"><span style="width:${pct}%"></span></span> <span class="progress">${done} of ${total}</span>`;
}

/** Wraps a page's body in the document, with its refresh. */
export function layout(ctx: PageContext, title: string, body: Html): string {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
${ctx.refreshSeconds > 0 ? html`<meta http-equiv="refresh" content="${ctx.refreshSeconds}">` : ''}
<title>${title} · outlive</title><style>${STYLE}</style></head>
<body><header><a href="${ctx.basePath}/">outlive</a><a href="${ctx.basePath}/tasks">tasks</a><a href="${ctx.basePath}/runs">runs</a><a href="${ctx.basePath}/queues">queues</a><a href="${ctx.basePath}/limits">limits</a><span class="muted">${title}</span><span class="muted" style="margin-left:auto">${ctx.refreshSeconds > 0 ? `refreshes every ${ctx.refreshSeconds}s` : 'not refreshing'} · ${ctx.now.toISOString().slice(0, 19).replace('T', ' ')} UTC</span></header>
<main>${ctx.flash ? html`<div class="flash" role="status">${ctx.flash}</div>` : ''}${body}</main></body></html>`.value;
}

/** A table of runs (the overview's, the runs list's); `empty` when there is none. */
export function runRows(ctx: PageContext, runs: readonly RunSummary[], empty = 'No runs yet.'): Html {
  if (runs.length === 0) return html`<p class="muted">${empty}</p>`;
  return html`<table id="runs"><thead><tr><th>run</th><th>name</th><th>state</th><th>progress</th><th>failed</th><th>started</th><th>finished</th></tr></thead><tbody>
${runs.map((r) => html`<tr data-run="${r.id}"><td><a href="${ctx.basePath}/runs/${r.id}">#${r.id}</a></td><td>${r.name}</td><td>${badge(r.state)}</td><td>${runProgress(r)}</td><td>${r.failed ? `${r.failed}${r.capped ? '+' : ''}` : ''}</td><td>${when(r.createdAt, ctx.now)}</td><td>${when(r.finishedAt, ctx.now)}</td></tr>`)}
</tbody></table>`;
}

/** A run's progress; for one counted only up to the cap, what is left (exact, from its row) of how many at least. */
function runProgress(r: RunSummary): Html {
  if (!r.capped) return progress(r.done, r.total);
  return html`<span class="progress" title="its run page has the counts">${r.unfinished.toLocaleString('en-US')} left of over ${r.total.toLocaleString('en-US')}</span>`;
}

function failureRows(ctx: PageContext, failures: readonly TaskSummary[]): Html {
  if (failures.length === 0) return html`<p class="muted">No failures.</p>`;
  return html`<table id="failures"><thead><tr><th>task</th><th>name</th><th>run</th><th>attempts</th><th>failed</th><th>error</th><th></th></tr></thead><tbody>
${failures.map((t) => html`<tr data-task="${t.id}"><td><a href="${ctx.basePath}/tasks/${t.id}">#${t.id}</a></td><td>${t.name}</td><td>${t.runId ? html`<a href="${ctx.basePath}/runs/${t.runId}">#${t.runId}</a> ${t.step ?? ''}` : '-'}</td><td>${t.attempts}/${t.maxAttempts}</td><td>${when(t.finishedAt, ctx.now)}</td><td class="err">${t.lastError ?? ''}</td><td>${action(ctx, `/tasks/${t.id}/retry`, 'Retry', 'retry')}</td></tr>`)}
</tbody></table>`;
}

/** A count, "10000+" when it stopped at its cap. */
export function count(n: number, more = false): string {
  return more ? `${n}+` : String(n);
}

/** The front page. */
export function overviewPage(
  ctx: PageContext,
  data: { status: StatusReport; throughput: { minute: Date; succeeded: number; failed: number }[]; runs: RunSummary[]; failures: TaskSummary[]; schedules: ScheduleSummary[] },
): string {
  const s = data.status;
  const body = html`<h1>Overview</h1>
<h2>Tasks by state</h2>
<div class="cards" id="task-counts">${TASK_STATES.map((st) => html`<div class="card" data-state="${st}">${badge(st)}<b>${count(s.tasks[st], s.more?.tasks.includes(st))}</b></div>`)}
<div class="card"><span class="muted">oldest ready</span><b>${s.oldestReadyMs === null ? '-' : `${Math.round(s.oldestReadyMs / 1000)}s`}</b></div>
<div class="card"><span class="muted">failed, last hour</span><b id="failed-hour">${s.failedLastHour}</b></div></div>
${s.unrunnable.length === 0 ? '' : html`<h2>Ready, but no pass knows them</h2>
<table id="unrunnable"><thead><tr><th>task</th><th>ready</th><th>why</th></tr></thead><tbody>
${s.unrunnable.map((u) => html`<tr data-name="${u.name}"><td>${u.name}</td><td>${u.ready}</td><td>${u.why}</td></tr>`)}
</tbody></table>`}
${flowControl(ctx, s)}
<h2>Runs by state</h2>
<div class="cards" id="run-counts">${RUN_STATES.map((st) => html`<div class="card" data-state="${st}">${badge(st)}<b>${count(s.runs[st], s.more?.runs.includes(st))}</b></div>`)}</div>
<h2>Tasks finished per minute, last hour</h2>
${renderThroughput(data.throughput)}
<div class="muted">${badge('succeeded')} ${badge('failed')}${s.queues.length > 1 ? html` · <a href="${ctx.basePath}/queues">queues</a>: ${s.queues.map((q) => `${q.queue} (${q.counts.pending} pending, ${q.counts.running} running)`).join(', ')}` : ''}</div>
<h2>Runs</h2>${runRows(ctx, data.runs)}
<h2>Failures, newest first</h2>${failureRows(ctx, data.failures)}
<h2>Schedules</h2>
${data.schedules.length === 0
    ? html`<p class="muted">No schedules registered.</p>`
    : html`<table id="schedules"><thead><tr><th>name</th><th>cron</th><th>task</th><th>last firing</th><th>next firing</th></tr></thead><tbody>
${data.schedules.map((sc) => html`<tr><td>${sc.name}</td><td><code>${sc.cron}</code> ${sc.timezone}</td><td>${sc.task}</td><td>${sc.lastSlot ? html`${sc.lastSlot.toISOString()} (${when(sc.lastFiredAt, ctx.now)})` : '-'}</td><td>${sc.nextSlot.toISOString()} (${ago(sc.nextSlot, ctx.now)})</td></tr>`)}
</tbody></table>`}`;
  return layout(ctx, 'Overview', body);
}

/** "12 tasks", "1 task", "10000+ tasks". */
function tasks(n: number, more: boolean): string {
  return more ? `${n}+ tasks` : n === 1 ? '1 task' : `${n} tasks`;
}

/** What flow control holds back, on the overview: keys tasks wait for or paused, and paused queues. */
function flowControl(ctx: PageContext, s: StatusReport): Html {
  if (s.waits.length === 0 && s.pausedQueues.length === 0) return html``;
  return html`<h2>Held back by flow control</h2>
<table id="held-back"><thead><tr><th>what</th><th>waiting</th><th>why</th></tr></thead><tbody>
${s.waits.map((w) => html`<tr data-key="${w.key}"><td>key ${w.key}</td><td>${w.waiting || w.waitingMore ? tasks(w.waiting, w.waitingMore) : '-'}</td><td>${w.wait?.text ?? roomText(w.state)}</td></tr>`)}
${s.pausedQueues.map((q) => html`<tr data-queue="${q.queue}"><td>queue ${q.queue}</td><td>${tasks(s.queues.find((x) => x.queue === q.queue)?.counts.pending ?? 0, false)} pending</td><td>queue ${q.queue} is paused${q.reason ? `: ${q.reason}` : ''} (since ${ago(q.pausedAt, ctx.now)})</td></tr>`)}
</tbody></table>
<p class="muted"><a href="${ctx.basePath}/limits">Limits, pauses and queues</a></p>`;
}

function json(value: unknown): string {
  return value === null || value === undefined ? '-' : JSON.stringify(value, null, 2);
}

/** A task: everything its row knows, and its error history. */
export function taskPage(ctx: PageContext, t: TaskDetail): string {
  const canRetry = t.state === 'failed' || t.state === 'cancelled' || (t.runId !== null && t.state === 'skipped');
  const body = html`<h1>Task #${t.id}: ${t.name} ${badge(t.state)}</h1>
<p>${canRetry ? action(ctx, `/tasks/${t.id}/retry`, t.runId ? 'Retry (with its run)' : 'Retry', 'retry') : ''}</p>
<dl>
<dt>queue</dt><dd>${t.queue} (priority ${t.priority})</dd>
<dt>attempts</dt><dd>${t.attempts} of ${t.maxAttempts}${t.interruptions > 0 ? `, ${t.interruptions} interrupted (not counted)` : ''}, timeout ${t.timeoutMs} ms</dd>
${t.progress ? html`<dt>progress</dt><dd class="progress">${progressText(t.progress) ?? '-'} <span class="muted">${when(new Date(t.progress.at), ctx.now)}</span></dd>` : ''}
${t.waiting ? html`<dt>waiting</dt><dd>${t.waiting}</dd>` : ''}
${t.runId ? html`<dt>run</dt><dd><a href="${ctx.basePath}/runs/${t.runId}">#${t.runId}</a>, step ${t.step ?? '-'}</dd>` : ''}
${t.dependsOn.length ? html`<dt>waits for</dt><dd>${t.dependsOn.map((d) => html`<a href="${ctx.basePath}/tasks/${d.id}">${d.step ?? `#${d.id}`}</a> ${badge(d.state)} `)}</dd>` : ''}
${t.key ? html`<dt>key</dt><dd>${t.key}</dd>` : ''}
<dt>created</dt><dd>${t.createdAt.toISOString()} (${ago(t.createdAt, ctx.now)})</dd>
<dt>runs at</dt><dd>${t.runAt.toISOString()} (${ago(t.runAt, ctx.now)})</dd>
<dt>started</dt><dd>${t.startedAt ? t.startedAt.toISOString() : '-'}</dd>
<dt>finished</dt><dd>${t.finishedAt ? t.finishedAt.toISOString() : '-'}</dd>
${t.leaseOwner ? html`<dt>lease</dt><dd>${t.leaseOwner} until ${t.leaseExpiresAt?.toISOString() ?? '-'}</dd>` : ''}
</dl>
<h2>Input</h2><pre id="input">${json(t.input)}</pre>
<h2>Output</h2><pre id="output">${json(t.output)}</pre>
<h2>Errors</h2>
${t.errors.length === 0
    ? html`<p class="muted">No failed attempts.</p>`
    : html`<table id="errors"><thead><tr><th>attempt</th><th>at</th><th>error</th></tr></thead><tbody>
${[...t.errors].reverse().map((e) => html`<tr><td>${e.attempt}</td><td>${e.at}</td><td class="err">${e.name}: ${e.message}</td></tr>`)}
</tbody></table>`}`;
  return layout(ctx, `Task #${t.id}`, body);
}

/** A form that posts back with the page's CSRF value, its fields hidden. */
function postForm(ctx: PageContext, path: string, fields: Record<string, string>, inner: Html, cls = 'inline'): Html {
  return html`<form class="${cls}" method="post" action="${ctx.basePath}${path}"><input type="hidden" name="csrf" value="${ctx.csrf}">${Object.entries(fields).map(([k, v]) => html`<input type="hidden" name="${k}" value="${v}">`)}${inner}</form>`;
}

/** How long a pause from the dashboard lasts: until resumed, or one of these. */
const PAUSE_FOR: [string, string][] = [['', 'until resumed'], ['300000', 'for 5 min'], ['900000', 'for 15 min'], ['3600000', 'for 1 hour'], ['86400000', 'for 1 day']];

function keyActions(ctx: PageContext, k: KeyState): Html {
  if (k.pause) return postForm(ctx, '/limits/resume', { key: k.key }, html`<button type="submit" data-action="resume-key">Resume</button>`);
  return postForm(
    ctx,
    '/limits/pause',
    { key: k.key },
    html`<select name="for" aria-label="how long">${PAUSE_FOR.map(([v, label]) => html`<option value="${v}">${label}</option>`)}</select>
<input name="reason" placeholder="reason" maxlength="500" aria-label="reason"> <button type="submit" data-action="pause-key">Pause</button>`,
    'inline pause',
  );
}

function windowUse(k: KeyState, now: Date): Html {
  if (!k.rate || k.windowUsed === null) return html`-`;
  const used = Math.round(k.windowUsed * 1000) / 1000;
  const pct = Math.min(100, Math.round((k.windowUsed / k.rate.limit) * 100));
  return html`<span class="bar" title="${pct}%"><span style="width:${pct}%"></span></span> <span class="window">${used} of ${k.rate.limit}</span>${k.nextStartAt && keyWait({ ...k, pause: null, concurrency: null }) ? html` <span class="muted next-start">next start ${when(k.nextStartAt, now)}</span>` : ''}`;
}

/** A key's pause: who paused it (as far as the row tells), until when, why. */
function pauseCell(k: KeyState, now: Date): Html {
  if (!k.pause) return html`-`;
  const by = k.pause.by === 'rate-limited' ? 'after a 429 ' : k.pause.by === 'hand' ? 'by hand ' : '';
  const reason = k.pause.reason && k.pause.reason !== 'paused by hand' ? `: ${k.pause.reason}` : '';
  const until = k.pause.until;
  return html`paused ${by}${until ? html`until <time datetime="${until.toISOString()}">${until.toISOString().slice(0, 19).replace('T', ' ')} UTC</time> (${ago(until, now)})` : 'until resumed'}${reason}`;
}

/** The limits: each key with its slots, its rate's window and its pause; the paused queues; buttons to pause and resume. */
export function limitsPage(ctx: PageContext, data: { keys: KeyState[]; total: number; queues: QueuePause[] }): string {
  const body = html`<h1>Limits</h1>
<p class="muted">Limits, pauses and weights live in rows: what is changed here (or with <code>outlive limit</code>, <code>outlive queue</code>) the next claim obeys.${ctx.refreshSeconds > 0 ? html` <a href="?refresh=0">Stop refreshing</a> to type a reason.` : ''}</p>
<h2>Keys</h2>
${data.keys.length === 0
    ? html`<p class="muted">No keys yet: a key appears when a claim first looks at a task that declares it, or when it is set or paused.</p>`
    : html`<table id="limits"><thead><tr><th>key</th><th>running</th><th>rate</th><th>window</th><th>paused</th><th>waiting</th><th>why</th><th></th></tr></thead><tbody>
${data.keys.map((k) => {
  const wait = keyWait(k);
  return html`<tr data-key="${k.key}" data-paused="${k.pause ? 'yes' : 'no'}"><td>${k.key}</td>
<td class="running">${k.concurrency === null ? html`${k.running} <span class="muted">(no limit)</span>` : html`${k.running} of ${k.concurrency}${k.concurrencySet ? html` <span class="muted">(set)</span>` : ''}`}</td>
<td>${k.rate ? html`${k.rate.limit} per ${formatPeriod(k.rate.periodMs)}${k.rate.burst === undefined ? '' : `, burst ${k.rate.burst}`}${k.rateSet ? html` <span class="muted">(set)</span>` : ''}` : '-'}</td>
<td>${windowUse(k, ctx.now)}</td>
<td class="paused">${pauseCell(k, ctx.now)}</td>
<td class="waiting">${k.waitingMore ? `${k.waiting}+` : k.waiting}</td>
<td class="why">${k.waiting === 0 ? '' : wait ? wait.text : roomText(k)}</td>
<td>${keyActions(ctx, k)}</td></tr>`;
})}
</tbody></table>
${data.total > data.keys.length ? html`<p class="muted">${data.keys.length} of ${data.total} keys shown: those paused, with tasks waiting or running first (all of them with <code>outlive limits --limit ${data.total}</code>).</p>` : ''}`}
<h2>Paused queues</h2>
${data.queues.length === 0
    ? html`<p class="muted">No queue is paused.</p>`
    : html`<table id="paused-queues"><thead><tr><th>queue</th><th>reason</th><th>since</th><th></th></tr></thead><tbody>
${data.queues.map((q) => html`<tr data-queue="${q.queue}"><td>${q.queue}</td><td>${q.reason ?? '-'}</td><td>${when(q.pausedAt, ctx.now)}</td><td>${postForm(ctx, '/queues/resume', { queue: q.queue }, html`<button type="submit" data-action="resume-queue">Resume</button>`)}</td></tr>`)}
</tbody></table>`}
<h3>Pause a queue</h3>
${postForm(ctx, '/queues/pause', {}, html`<input name="queue" placeholder="queue" required maxlength="200" aria-label="queue"> <input name="reason" placeholder="reason" maxlength="500" aria-label="reason"> <button type="submit" data-action="pause-queue">Pause queue</button>`, 'pause-queue')}
<p class="muted">No pass claims a paused queue's tasks; running tasks run on.</p>`;
  return layout(ctx, 'Limits', body);
}

/** A short page for errors and refusals (nothing from the database on it). */
export function messagePage(title: string, message: string): string {
  return html`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${title} · outlive</title><style>${STYLE}</style></head><body><header><span>outlive</span></header><main><h1>${title}</h1><p>${message}</p></main></body></html>`.value;
}

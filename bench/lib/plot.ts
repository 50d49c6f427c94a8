/**
 * Plots as hand-written SVG (no plotting dependency), and PNG copies made by
 * screenshotting the SVG with headless Chromium when it is installed.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import type { SystemName } from '../systems/protocol.ts';

/** One colour per system (Okabe-Ito: tellable apart with any colour vision). */
export const COLOURS: Record<SystemName, string> = {
  outlive: '#0072B2',
  // outlive's blue, lighter: the same engine, deleting succeeded rows.
  'outlive-drop': '#56B4E9',
  'graphile-worker': '#E69F00',
  'pg-boss': '#009E73',
};

const FONT = `font-family="DejaVu Sans, Helvetica, Arial, sans-serif"`;

function esc(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function num(n: number): string {
  if (n >= 10_000) return `${(n / 1000).toFixed(n >= 100_000 ? 0 : 1)}k`;
  if (n >= 100) return Math.round(n).toLocaleString('en-US');
  if (n >= 10) return n.toFixed(1);
  return n.toFixed(2);
}

/** A tick label: whole numbers when the step is whole. */
function tick(v: number, step: number): string {
  return step >= 1 && v < 10_000 ? Math.round(v).toLocaleString('en-US') : num(v);
}

/** A "nice" axis maximum and tick step at or above `max`. */
function niceScale(max: number, ticks = 5): { top: number; step: number } {
  if (!(max > 0)) return { top: 1, step: 0.2 };
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw)!;
  return { top: Math.ceil(max / step) * step, step };
}

/** One bar: a system's median over rounds, with the min-max range as a whisker. */
export interface Bar {
  system: SystemName;
  median: number;
  min: number;
  max: number;
}

/** One panel of bars sharing an axis. */
export interface Panel {
  title: string;
  unit: string;
  bars: Bar[];
}

/**
 * Horizontal bar charts, one panel per phase (phases differ by orders of
 * magnitude, so each gets its own axis), medians as bars and min-max as
 * whiskers.
 */
export function barPanels(title: string, subtitle: string, panels: Panel[]): string {
  const width = 760;
  const left = 140;
  const right = 70;
  const barH = 18;
  const gap = 6;
  const panelHead = 26;
  const axisH = 22;
  const top = 58;
  let y = top;
  const parts: string[] = [];
  for (const panel of panels) {
    const h = panelHead + panel.bars.length * (barH + gap) + axisH;
    const { top: axisMax, step } = niceScale(Math.max(...panel.bars.map((b) => b.max), 0));
    const x = (v: number) => left + ((width - left - right) * v) / axisMax;
    parts.push(`<text x="${left}" y="${y + 16}" font-size="13" font-weight="bold" ${FONT}>${esc(panel.title)} <tspan font-weight="normal" fill="#555">(${esc(panel.unit)})</tspan></text>`);
    const barsTop = y + panelHead;
    const barsBottom = barsTop + panel.bars.length * (barH + gap) - gap;
    for (let t = 0; t <= axisMax + step / 2; t += step) {
      parts.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${barsTop - 4}" y2="${barsBottom + 4}" stroke="#e3e3e3"/>`);
      parts.push(`<text x="${x(t)}" y="${barsBottom + 17}" font-size="10" text-anchor="middle" fill="#666" ${FONT}>${tick(t, step)}</text>`);
    }
    panel.bars.forEach((b, k) => {
      const by = barsTop + k * (barH + gap);
      parts.push(`<text x="${left - 8}" y="${by + barH / 2 + 4}" font-size="12" text-anchor="end" ${FONT}>${esc(b.system)}</text>`);
      parts.push(`<rect x="${left}" y="${by}" width="${Math.max(0.5, x(b.median) - left)}" height="${barH}" fill="${COLOURS[b.system]}"/>`);
      const wy = by + barH / 2;
      parts.push(`<line x1="${x(b.min)}" x2="${x(b.max)}" y1="${wy}" y2="${wy}" stroke="#222" stroke-width="1.2"/>`);
      parts.push(`<line x1="${x(b.min)}" x2="${x(b.min)}" y1="${wy - 5}" y2="${wy + 5}" stroke="#222" stroke-width="1.2"/>`);
      parts.push(`<line x1="${x(b.max)}" x2="${x(b.max)}" y1="${wy - 5}" y2="${wy + 5}" stroke="#222" stroke-width="1.2"/>`);
      parts.push(`<text x="${x(b.max) + 6}" y="${wy + 4}" font-size="11" ${FONT}>${num(b.median)}</text>`);
    });
    y += h + 10;
  }
  const height = y + 4;
  return svg(width, height, title, subtitle, parts);
}

/** Latency samples of one system (all rounds together). */
export interface Distribution {
  system: SystemName;
  samples: number[];
}

/**
 * The cumulative distribution of enqueue-to-start latency per system: for a
 * time on the x axis, the share of jobs that had started by then. The axis
 * stops a little past the largest p99, so one outlier does not squash it.
 */
export function latencyCdf(title: string, subtitle: string, dists: Distribution[]): string {
  const width = 760;
  const height = 420;
  const left = 60;
  const right = 150;
  const top = 58;
  const bottom = 50;
  const sorted = dists.map((d) => ({ system: d.system, s: [...d.samples].sort((a, b) => a - b) }));
  const p99 = (s: number[]) => s[Math.min(s.length - 1, Math.floor(s.length * 0.99))] ?? 0;
  const { top: xMax, step } = niceScale(Math.max(...sorted.map((d) => p99(d.s)), 1) * 1.15, 6);
  const x = (v: number) => left + ((width - left - right) * Math.min(v, xMax)) / xMax;
  const y = (f: number) => height - bottom - (height - top - bottom) * f;
  const parts: string[] = [];
  for (let t = 0; t <= xMax + step / 2; t += step) {
    parts.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${y(0)}" y2="${y(1)}" stroke="#e3e3e3"/>`);
    parts.push(`<text x="${x(t)}" y="${y(0) + 16}" font-size="10" text-anchor="middle" fill="#666" ${FONT}>${tick(t, step)}</text>`);
  }
  for (const f of [0, 0.25, 0.5, 0.75, 0.9, 1]) {
    parts.push(`<line x1="${left}" x2="${width - right}" y1="${y(f)}" y2="${y(f)}" stroke="${f === 0.5 ? '#cfcfcf' : '#eeeeee'}"/>`);
    parts.push(`<text x="${left - 6}" y="${y(f) + 4}" font-size="10" text-anchor="end" fill="#666" ${FONT}>${Math.round(f * 100)}%</text>`);
  }
  parts.push(`<text x="${(left + width - right) / 2}" y="${height - 12}" font-size="12" text-anchor="middle" ${FONT}>ms from the enqueue call to the handler's start (axis cut a little past the largest p99)</text>`);
  // Systems without samples (a failed run) get no line, and leave no gap in the legend.
  sorted.filter((d) => d.s.length > 0).forEach((d, k) => {
    const pts: string[] = [`${x(0)},${y(0)}`];
    d.s.forEach((v, i) => {
      pts.push(`${x(v).toFixed(1)},${y(i / d.s.length).toFixed(1)}`);
      pts.push(`${x(v).toFixed(1)},${y((i + 1) / d.s.length).toFixed(1)}`);
    });
    parts.push(`<polyline points="${pts.join(' ')}" fill="none" stroke="${COLOURS[d.system]}" stroke-width="2"/>`);
    const median = d.s[Math.floor(d.s.length / 2)]!;
    const ly = top + 14 + k * 40;
    parts.push(`<rect x="${width - right + 14}" y="${ly - 9}" width="12" height="12" fill="${COLOURS[d.system]}"/>`);
    parts.push(`<text x="${width - right + 32}" y="${ly + 1}" font-size="12" ${FONT}>${esc(d.system)}</text>`);
    parts.push(`<text x="${width - right + 32}" y="${ly + 16}" font-size="10" fill="#555" ${FONT}>p50 ${num(median)} · p99 ${num(p99(d.s))} ms</text>`);
  });
  return svg(width, height, title, subtitle, parts);
}

function svg(width: number, height: number, title: string, subtitle: string, parts: string[]): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">`,
    `<rect width="100%" height="100%" fill="#ffffff"/>`,
    `<text x="16" y="24" font-size="16" font-weight="bold" ${FONT}>${esc(title)}</text>`,
    `<text x="16" y="42" font-size="11" fill="#555" ${FONT}>${esc(subtitle)}</text>`,
    ...parts,
    `</svg>`,
    '',
  ].join('\n');
}

/** The Chromium to screenshot with: CHROMIUM if set, else a usual install path; null if none. */
export function findChromium(): string | null {
  const candidates = [process.env.CHROMIUM, '/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'];
  return candidates.find((c): c is string => !!c && existsSync(c)) ?? null;
}

/** Renders `svgPath` to `pngPath` at twice its size with headless Chromium. */
export function svgToPng(chromium: string, svgPath: string, pngPath: string, width: number, height: number): void {
  execFileSync(
    chromium,
    [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--hide-scrollbars',
      '--force-device-scale-factor=2',
      `--window-size=${width},${height}`,
      `--screenshot=${pngPath}`,
      `file://${svgPath}`,
    ],
    { stdio: 'ignore', timeout: 60_000 },
  );
}

/** The width and height an SVG made here declares. */
export function svgSize(svgText: string): { width: number; height: number } {
  const m = /width="(\d+)" height="(\d+)"/.exec(svgText);
  return { width: Number(m?.[1] ?? 800), height: Number(m?.[2] ?? 600) };
}

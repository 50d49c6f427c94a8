/**
 * CPU time the server spends for one database: the run time of the server
 * processes connected to it, read from /proc/<pid>/schedstat (nanoseconds on
 * a CPU; /proc/<pid>/stat only has 10 ms ticks).
 *
 * Only backends of the database under test count. The server is shared (with
 * other databases, and on this machine with other people's tests), so its
 * background processes (WAL writer, checkpointer, background writer) are left
 * out: their work for us cannot be told apart from their work for others.
 * WAL flushes on commit are done by the committing backend itself, so they
 * are counted.
 */
import { readFileSync } from 'node:fs';
import type { Admin } from './postgres.ts';

function cpuNs(pid: number): number | null {
  try {
    return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);
  } catch {
    return null;
  }
}

/** Samples the backends of one database until stopped; backends that come and go in between are caught by the sampling. */
export class BackendCpu {
  private readonly admin: Admin;
  private readonly db: string;
  private readonly exclude: number[];
  private readonly first = new Map<number, number>();
  private readonly last = new Map<number, number>();
  private timer: ReturnType<typeof setInterval> | null = null;
  private sampling: Promise<void> = Promise.resolve();
  /** Whether /proc can be read for the server's processes (same machine, enough privilege). */
  available = true;

  private constructor(admin: Admin, db: string, exclude: number[]) {
    this.admin = admin;
    this.db = db;
    this.exclude = exclude;
  }

  /**
   * Starts sampling. Backends present now count from their current CPU time;
   * backends that appear later count from zero (their start-up included).
   */
  static async start(admin: Admin, db: string, exclude: number[], everyMs = 200): Promise<BackendCpu> {
    const meter = new BackendCpu(admin, db, exclude);
    for (const pid of await admin.backends(db, exclude)) {
      const ns = cpuNs(pid);
      if (ns === null) meter.available = false;
      else {
        meter.first.set(pid, ns);
        meter.last.set(pid, ns);
      }
    }
    meter.timer = setInterval(() => {
      meter.sampling = meter.sampling.then(() => meter.sample()).catch(() => undefined);
    }, everyMs);
    return meter;
  }

  private async sample(): Promise<void> {
    for (const pid of await this.admin.backends(this.db, this.exclude)) {
      const ns = cpuNs(pid);
      if (ns === null) continue;
      if (!this.first.has(pid)) this.first.set(pid, 0);
      this.last.set(pid, ns);
    }
  }

  /** Takes a last sample (call it while the workers' connections are still open) and returns the CPU ms used. */
  async stop(): Promise<number | null> {
    if (this.timer) clearInterval(this.timer);
    await this.sampling;
    await this.sample();
    if (!this.available) return null;
    let ns = 0;
    for (const [pid, last] of this.last) ns += last - (this.first.get(pid) ?? 0);
    return ns / 1e6;
  }
}

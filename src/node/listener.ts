/**
 * The worker's LISTEN connection: one node-postgres client outside the pool,
 * LISTENing on `outlive`, whose notifications (one per committed enqueue, with
 * the queue as payload) wake the worker's passes. Lost, it reconnects with
 * exponential backoff and jitter while the worker polls meanwhile.
 */
import pg from 'pg';
import { backoffDelay, type BackoffOptions } from '../model/backoff.js';
import { toError } from '../model/errors.js';

/** What the listener needs from the worker that owns it. */
export interface ListenerOptions {
  /** The connection settings of the LISTEN client. */
  config: () => pg.ClientConfig;
  /** Only notifications of these queues wake it; all when undefined. */
  queues?: readonly string[];
  reconnectBaseMs: number;
  reconnectMaxMs: number;
  /** How often the worker polls while the listener is down, for the log line. */
  pollIntervalMs: number;
  log: { info(m: string): void; warn(m: string): void };
  /** A notification for one of its queues arrived, or the connection came back: work may be ready. */
  wake: () => void;
  /** Counts what happened, into the worker's stats. */
  count: (event: 'notifications' | 'disconnects' | 'reconnects') => void;
  /**
   * Sends a notification from another session than the listener's (the
   * worker's pool), as an enqueue does. The listener's own session will not
   * do: through a transaction pooler its NOTIFY may run on the very server
   * connection that holds its LISTEN, and be delivered while no other
   * session's ever is (seen with PgBouncer 1.18).
   */
  notify: (channel: string, payload: string) => Promise<unknown>;
  /** How long the connection may take to receive the probe notification after LISTEN. Default 2,000 ms. */
  probeMs?: number;
}

/** The channel a new LISTEN connection proves itself on. */
const PROBE_CHANNEL = 'outlive_probe';

/** The LISTEN connection of one worker. */
export class Listener {
  private client: pg.Client | null = null;
  private warned = false;
  /** False once a connection failed to receive its own probe: notifications do not reach it. */
  receives = true;
  private reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  private running = false;

  private readonly backoff: BackoffOptions;

  constructor(private readonly options: ListenerOptions) {
    this.backoff = { baseMs: options.reconnectBaseMs, maxMs: options.reconnectMaxMs, factor: 2 };
  }

  /** Connects and LISTENs; rejects (leaving nothing open) when it cannot. */
  async start(): Promise<void> {
    this.running = true;
    try {
      await this.connect();
    } catch (err) {
      this.running = false;
      throw err;
    }
  }

  /** Closes the connection and stops reconnecting. */
  async stop(): Promise<void> {
    this.running = false;
    clearTimeout(this.reconnectTimer);
    const c = this.client;
    this.client = null;
    if (c) {
      c.removeAllListeners('end');
      c.removeAllListeners('error').on('error', () => undefined);
      await c.end().catch(() => undefined);
    }
  }

  private async connect(): Promise<void> {
    const client = new pg.Client(this.options.config());
    const { queues } = this.options;
    let probed: ((payload: string | undefined) => void) | null = null;
    client.on('notification', (msg) => {
      if (msg.channel === PROBE_CHANNEL) return probed?.(msg.payload);
      this.options.count('notifications');
      if (msg.channel !== 'outlive') return;
      if (queues && msg.payload !== undefined && !queues.includes(msg.payload)) return;
      this.options.wake();
    });
    client.on('error', (err) => this.lost(client, err));
    client.on('end', () => this.lost(client, new Error('connection closed')));
    try {
      await client.connect();
      // Prove that notifications from other sessions reach this
      // connection: through a transaction pooler (PgBouncer in transaction
      // mode, a provider's pooled URL) LISTEN is accepted and nothing ever
      // arrives. Before LISTEN outlive, so that no wake-up arrives while
      // the probe runs.
      const nonce = globalThis.crypto.randomUUID();
      const arrived = new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), this.options.probeMs ?? 2_000);
        probed = (payload) => {
          if (payload !== nonce) return;
          clearTimeout(timer);
          resolve(true);
        };
      });
      await client.query(`LISTEN ${PROBE_CHANNEL}`);
      await this.options.notify(PROBE_CHANNEL, nonce);
      this.receives = await arrived;
      probed = null;
      await client.query(`UNLISTEN ${PROBE_CHANNEL}`);
      await client.query('LISTEN outlive');
      if (!this.receives && !this.warned) {
        this.warned = true;
        this.options.log.warn(
          `outlive worker: the LISTEN connection did not receive the notification the worker sent it within ${this.options.probeMs ?? 2_000} ms, ` +
            'so enqueues cannot wake this worker: a transaction pooler (PgBouncer in transaction mode, a pooled connection string) does not ' +
            `deliver LISTEN/NOTIFY. Give the worker a direct connection string for its listener (listenConnectionString; --listen-database-url or LISTEN_DATABASE_URL for \`outlive worker\`). Polling every ${this.options.pollIntervalMs} ms.`,
        );
      }
    } catch (err) {
      client.removeAllListeners('end');
      // Keep an error listener: a late socket error must not crash the process.
      client.removeAllListeners('error').on('error', () => undefined);
      await client.end().catch(() => undefined);
      throw err;
    }
    this.client = client;
  }

  private lost(client: pg.Client, err: Error): void {
    // Only the current connection's loss matters; a closing or failed one's events are noise.
    if (client !== this.client) return;
    this.client = null;
    client.removeAllListeners('end');
    client.removeAllListeners('error').on('error', () => undefined);
    void client.end().catch(() => undefined);
    if (!this.running) return;
    this.options.count('disconnects');
    this.options.log.warn(`outlive worker: LISTEN connection lost (${err.message}); reconnecting, polling every ${this.options.pollIntervalMs} ms meanwhile`);
    this.scheduleReconnect(0);
  }

  private scheduleReconnect(attempt: number): void {
    if (!this.running) return;
    const { log } = this.options;
    // Exponential backoff with equal jitter (the tasks' own rule), so many
    // workers losing the server at once do not reconnect in lockstep.
    const delay = Math.round(backoffDelay(this.backoff, attempt + 1));
    this.reconnectTimer = setTimeout(() => {
      this.connect().then(
        () => {
          if (!this.running) {
            void this.stop();
            return;
          }
          this.options.count('reconnects');
          log.info(`outlive worker: LISTEN connection re-established after ${attempt + 1} attempt(s)`);
          // Anything enqueued while nobody listened gets a pass now.
          this.options.wake();
        },
        (err: unknown) => {
          if (!this.running) return;
          const next = backoffDelay({ ...this.backoff, jitter: 'none' }, attempt + 2);
          log.warn(`outlive worker: reconnecting the LISTEN connection failed (${toError(err).message}); retrying in about ${next} ms`);
          this.scheduleReconnect(attempt + 1);
        },
      );
    }, delay);
  }
}

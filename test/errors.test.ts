/**
 * Anything thrown becomes an Error that says what happened: an Event's
 * message (the Neon driver throws an ErrorEvent on Node 22+), a driver's
 * code, a plain object's JSON; never a dump of a client object, which
 * carries the backend's cancel key.
 */
import { describe, expect, it } from 'vitest';
import { toError } from '../src/model/errors.js';

/** What the Neon driver throws on Node 22+ when its WebSocket fails: an Event, its message on the prototype. */
class FakeErrorEvent extends Event {
  readonly #message: string;
  readonly #error: unknown;
  constructor(message: string, error?: unknown) {
    super('error');
    this.#message = message;
    this.#error = error;
  }
  get message() {
    return this.#message;
  }
  get error() {
    return this.#error;
  }
}
Object.defineProperty(FakeErrorEvent, 'name', { value: 'ErrorEvent' });

/** A driver client in the shape whose JSON a log once carried: connection secrets in its fields. */
class FakeClient {
  processID = 4242;
  secretKey = 987654321;
  password = 'hunter2-password';
  connectionParameters = { password: 'hunter2-password' };
}

describe('toError', () => {
  it('keeps an Error as it is', () => {
    const err = new TypeError('boom');
    expect(toError(err)).toBe(err);
  });

  it("keeps an ErrorEvent's message, naming the event, with its error as the cause", () => {
    const inner = new Error('connect ECONNREFUSED 127.0.0.1:1');
    const err = toError(new FakeErrorEvent('Received network error or non-101 status code.', inner));
    expect(err.message).toBe('ErrorEvent: Received network error or non-101 status code.');
    expect(err.cause).toBe(inner);
  });

  it("takes an error event's Error when the event has no message of its own", () => {
    const inner = new Error('socket hang up');
    expect(toError(new FakeErrorEvent('', inner)).message).toBe('ErrorEvent: socket hang up');
  });

  it("keeps a driver's code beside its message", () => {
    const err = toError({ message: 'terminating connection due to administrator command', code: '57P01' }) as Error & { code?: unknown };
    expect(err.message).toBe('terminating connection due to administrator command');
    expect(err.code).toBe('57P01');
    expect(toError({ code: 'ECONNRESET' }).message).toBe('non-Error thrown: {"code":"ECONNRESET"}');
  });

  it('writes a plain object as JSON, and nothing else about an object that is not plain', () => {
    expect(toError({ code: 7 }).message).toBe('non-Error thrown: {"code":7}');
    const client = toError(new FakeClient());
    expect(client.message).toBe('non-Error thrown: a FakeClient');
    expect(client.message).not.toMatch(/secretKey|processID|hunter2|987654321/);
  });

  it('bounds what a plain object can write', () => {
    const err = toError({ big: 'x'.repeat(10_000) });
    expect(err.message.length).toBeLessThanOrEqual(600);
    expect(err.message).toMatch(/…$/);
  });

  it('handles strings, null, undefined, numbers and objects that cannot be written as JSON', () => {
    expect(toError('plain string').message).toBe('plain string');
    expect(toError(null).message).toBe('non-Error thrown: null');
    expect(toError(undefined).message).toBe('non-Error thrown: undefined');
    expect(toError(42).message).toBe('non-Error thrown: 42');
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(toError(cyclic).message).toBe('non-Error thrown: [object Object]');
    expect(toError({ n: 1n }).message).toBe('non-Error thrown: [object Object]');
  });
});

/**
 * What a task's `input` may be: any Standard Schema (v1), the interface zod
 * 4, valibot and ArkType each implement (`schema['~standard'].validate`). The
 * core reads schemas only through it, so an app pays for the validation
 * library it chose and no other: the README's Worker is 677 KiB minified
 * with a zod schema, 444 KiB of it zod's, and 236 KiB with a valibot one
 * (docs/deploy.md, scripts/bundle-size.ts).
 */
import type { StandardSchemaV1 } from '@standard-schema/spec';

/** A task's input schema: anything implementing Standard Schema v1. */
export type InputSchema = StandardSchemaV1;

/** One issue a schema reports: a message and, when not about the whole value, a path. */
export type InputIssue = StandardSchemaV1.Issue;

/** The result of a validation: `{ value }` (the parsed output) or `{ issues }`. */
export type Validation = StandardSchemaV1.Result<unknown>;

/** What every refusal of a non-schema says to do. */
export const SCHEMA_FIX = 'pass a Standard Schema such as a zod, valibot or ArkType schema as `input` (z.object({...}), v.object({...}), type({...}))';

/**
 * Why a value is not a Standard Schema v1 outlive can use, or null when it
 * is one. An ArkType type is a function, so functions are looked into too.
 */
export function notASchema(value: unknown): string | null {
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) return `got ${value === null ? 'null' : typeof value}`;
  const props = (value as Partial<InputSchema>)['~standard'];
  if (props === null || typeof props !== 'object') return 'it has no `~standard` property';
  if (props.version !== 1) return `it implements Standard Schema version ${String(props.version)}, and outlive reads version 1`;
  if (typeof props.validate !== 'function') return 'its `~standard.validate` is not a function';
  return null;
}

/** True for a Standard Schema v1. */
export function isInputSchema(value: unknown): value is InputSchema {
  return notASchema(value) === null;
}

/** What {@link validateNow} returns for a schema whose validate returned a Promise. */
export const ASYNC_SCHEMA = Symbol('outlive.asyncSchema');

/**
 * Validates a value synchronously, for the doors that must decide before they
 * return (enqueue builds its statement synchronously, for `db.batch`; a
 * schedule is checked at startup). A schema with asynchronous parts returns a
 * Promise: that is answered with {@link ASYNC_SCHEMA}, and the Promise's
 * eventual rejection is swallowed, since nobody waits for it.
 */
export function validateNow(schema: InputSchema, value: unknown): Validation | typeof ASYNC_SCHEMA {
  const result = schema['~standard'].validate(value);
  if (isThenable(result)) {
    result.then(undefined, () => undefined);
    return ASYNC_SCHEMA;
  }
  return result;
}

/**
 * Validates a value, awaiting the schema only when it returned a Promise: a
 * synchronous schema, the common case, costs the pass no promise.
 */
export function validate(schema: InputSchema, value: unknown): Validation | Promise<Validation> {
  return schema['~standard'].validate(value);
}

/** What an asynchronous schema at a synchronous door is told. */
export const ASYNC_SCHEMA_FIX =
  'its input schema\'s validate returned a Promise (an async refinement, check or transform; zod does so too when a check throws), and enqueue checks inputs synchronously, before the row is written in your transaction: make the schema synchronous and do asynchronous checks in the task\'s handler';

/** True for a Promise or any thenable. */
export function isThenable(value: unknown): value is PromiseLike<unknown> {
  return value !== null && (typeof value === 'object' || typeof value === 'function') && typeof (value as { then?: unknown }).then === 'function';
}

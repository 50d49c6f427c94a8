/** JSON size checks that work on Node, Workers and every other runtime (no Buffer). */

const encoder = new TextEncoder();

/** Bytes of `text` as UTF-8, exact when it could be within `limit` (a longer text is over it uncounted). */
export function utf8Bytes(text: string, limit: number): number {
  // A UTF-16 code unit is at most 3 bytes of UTF-8: short strings skip the encode.
  if (text.length * 3 <= limit || text.length > limit) return text.length;
  return encoder.encode(text).length;
}

/**
 * A lower bound of the bytes of `value`'s JSON, counted without writing it:
 * the lengths of its strings (quoted) and keys, and a byte for each other
 * value, stopping as soon as it passes `limit`: a huge input is refused
 * before `JSON.stringify` copies it (docs/benchmarks.md, "Refusing an
 * oversized input").
 */
export function jsonBytesAtLeast(value: unknown, limit: number): number {
  let bytes = 0;
  const seen = new Set<object>();
  const stack: unknown[] = [value];
  while (stack.length > 0 && bytes <= limit) {
    const v = stack.pop();
    bytes += typeof v === 'string' ? v.length + 2 : 1;
    if (typeof v === 'string') continue;
    if (v !== null && typeof v === 'object' && !seen.has(v)) {
      // Each object once: a cycle is JSON.stringify's to report, and a shared one still counts for a lower bound.
      seen.add(v);
      if (Array.isArray(v)) for (const item of v) stack.push(item);
      else if (typeof (v as { toJSON?: unknown }).toJSON !== 'function') {
        for (const key in v) {
          const item = (v as Record<string, unknown>)[key];
          // JSON leaves out a key whose value it cannot write.
          if (!Object.prototype.hasOwnProperty.call(v, key) || item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
          bytes += key.length;
          stack.push(item);
        }
      }
    }
  }
  return bytes;
}

/**
 * A value as the JSON text PostgreSQL will store, or why it cannot be (a
 * phrase to follow the value's name). A value plainly over `limit` is
 * refused before its JSON is written, unless the caller `measured` it.
 */
export function storableJson(value: unknown, limit: number, measured = false): { json: string | undefined; why?: undefined } | { why: string } {
  const least = measured ? 0 : jsonBytesAtLeast(value, limit);
  if (least > limit) return { why: `is at least ${least} bytes of JSON, over the limit of ${limit}` };
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (err) {
    return { why: `does not serialise to JSON (${err instanceof Error ? err.message : String(err)})` };
  }
  if (json === undefined) return { json };
  const bytes = utf8Bytes(json, limit);
  if (bytes > limit) return { why: `is ${bytes} bytes of JSON, over the limit of ${limit}` };
  const unstorable = unstorableJson(json);
  if (unstorable) return { why: `cannot be stored: ${unstorable}` };
  return { json };
}

// In JSON text: a \u0000 escape, or a surrogate escape that is not half of a
// pair, not itself escaped (preceded by an even number of backslashes).
const UNSTORABLE = /(?<!\\)(?:\\\\)*\\u(?:0000|d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|(?<!\\ud[89ab][0-9a-f]{2})d[c-f][0-9a-f]{2})/i;

/**
 * Why PostgreSQL would refuse this JSON text as jsonb, or null. JSON.stringify
 * writes U+0000 and unpaired surrogates as escapes that are valid JSON but
 * that jsonb rejects; catching them here turns a database error (which
 * aborts the caller's whole transaction) into a clear one before any write.
 */
export function unstorableJson(json: string): string | null {
  if (!json.includes('\\u')) return null;
  const m = UNSTORABLE.exec(json);
  if (!m) return null;
  return /u0000$/i.test(m[0]) ? 'it contains a NUL character (\\u0000), which PostgreSQL cannot store' : 'it contains an unpaired UTF-16 surrogate, which PostgreSQL cannot store';
}

/** Text as PostgreSQL can store it: NUL characters shown as \0, unpaired surrogates replaced. */
export function storableText(text: string): string {
  const wellFormed = (text as string & { toWellFormed?: () => string }).toWellFormed?.() ?? text;
  return wellFormed.includes('\u0000') ? wellFormed.replaceAll('\u0000', '\\0') : wellFormed;
}

/** Largest serialised output a task may store, and so the largest signal payload: 1 MiB. */
export const MAX_OUTPUT_BYTES = 1_048_576;

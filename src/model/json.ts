/** JSON size checks that work on Node, Workers and every other runtime (no Buffer). */

const encoder = new TextEncoder();

/** Bytes of `text` as UTF-8, computed only when it could be over `limit`. */
export function utf8Bytes(text: string, limit: number): number {
  // A UTF-16 code unit is at most 3 bytes of UTF-8: short strings skip the encode.
  if (text.length * 3 <= limit) return text.length;
  return encoder.encode(text).length;
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

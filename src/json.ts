/** JSON size checks that work on Node, Workers and every other runtime (no Buffer). */

const encoder = new TextEncoder();

/** Bytes of `text` as UTF-8, computed only when it could be over `limit`. */
export function utf8Bytes(text: string, limit: number): number {
  // A UTF-16 code unit is at most 3 bytes of UTF-8: short strings skip the encode.
  if (text.length * 3 <= limit) return text.length;
  return encoder.encode(text).length;
}

/**
 * Text from rows and sessions, made safe to print. A task's name, its queue,
 * an error message, a lease owner, a role's or a session's name are chosen by
 * whoever wrote them, which in a shared database may be another role: printed
 * as they are, a newline forges a line of the log, and an escape sequence
 * rewrites the operator's terminal (clears it, retitles it, hides what
 * follows). Every line outlive prints from such text goes through here.
 */

// C0 and C1 controls (ESC, CSI, newline, carriage return, backspace, DEL),
// the line and paragraph separators, and the bidirectional overrides and
// isolates that reorder what a terminal or editor shows ("Trojan Source").
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

const SHORT: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t', '\b': '\\b', '\f': '\\f' };

function escape(c: string): string {
  return SHORT[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
}

/**
 * The text with every control character and bidirectional override written
 * as a JSON escape (`\n`, `\u001b`), and nothing else changed: for a line
 * whose pieces are already delimited (a table cell, a log line).
 */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, escape);
}

/**
 * The text in double quotes, JSON-style: quotes and backslashes escaped as
 * well, so where the name ends is never in doubt. The result is valid JSON
 * for the same string.
 */
export function quoted(text: string): string {
  return `"${text.replace(/["\\]/g, (c) => `\\${c}`).replace(UNPRINTABLE, escape)}"`;
}

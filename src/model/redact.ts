/**
 * Secrets blanked out of text before it is logged or stored. A handler's
 * error may quote the connection string it failed with, or a token from the
 * environment; written into a row as it is, anyone who can read the task page
 * (or a role sharing the database) reads the secret. One redactor, built from
 * what the deployment holds, serves the log lines and the rows alike.
 */

/** Text a secret is replaced by. */
export const REDACTED = '[redacted]';

/** Shortest value treated as a secret: blanking every "a" would make text unreadable and hide nothing. */
const MIN_SECRET = 4;

/** Blanks out secrets in a text. */
export type Redact = (text: string) => string;

/**
 * The secrets a connection string carries: itself, and its password on its
 * own in the forms a driver's error may quote (as written in the URL,
 * decoded, and encoded).
 */
export function connectionSecrets(url: unknown): string[] {
  if (typeof url !== 'string' || url === '') return [];
  const secrets = [url];
  try {
    const raw = new URL(url).password;
    const password = decodeURIComponent(raw);
    secrets.push(raw, password, encodeURIComponent(password));
  } catch {
    // Not a URL: the whole value is listed.
  }
  return secrets;
}

/**
 * A redactor for these secrets: each occurrence becomes `[redacted]`, the
 * longest first (so a secret containing another is blanked whole). Values
 * shorter than 4 characters are ignored.
 */
export function redactor(secrets: readonly unknown[]): Redact {
  const list = [...new Set(secrets.filter((s): s is string => typeof s === 'string' && s.length >= MIN_SECRET))].sort((a, b) => b.length - a.length);
  if (list.length === 0) return (text) => text;
  return (text) => {
    let out = text;
    for (const s of list) if (out.includes(s)) out = out.split(s).join(REDACTED);
    return out;
  };
}

/**
 * An endpoint of your own for calls your app signs with `nudge()`: a webhook
 * that rebuilds a page, say. `verifyNudge` checks the signature over the
 * method, the endpoint and the exact body bytes, its age, and spends its
 * nonce in the database (so a replay is refused), with the same database
 * handle the rest of outlive takes: a pg Pool, Neon's Pool, a drizzle database.
 */
import { SIGNATURE_HEADER, verifyNudge, type Transactional } from '../src/index.js';

/** The URL the sender signs for: configured, never read from the request's Host header. */
export const REBUILD_URL = 'https://jobs.example.com/hooks/rebuild';

export async function rebuildHook(request: Request, db: Transactional, secret: string): Promise<Response> {
  const body = new Uint8Array(await request.arrayBuffer());
  const verified = await verifyNudge(db, secret, request.headers.get(SIGNATURE_HEADER), {
    method: request.method,
    endpoints: [REBUILD_URL],
    body,
  });
  if (!verified.ok) return new Response(verified.reason, { status: verified.reason === 'replayed' ? 403 : 401 });
  const { page } = JSON.parse(new TextDecoder().decode(body)) as { page: string };
  return new Response(`rebuilding ${page}`);
}

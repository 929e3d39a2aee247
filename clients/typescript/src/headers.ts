import type { PglimitResult, RateLimitHeaders } from "./types.js";

/**
 * The `RateLimit`, `RateLimit-Policy` and `Retry-After` headers of a result,
 * to forward on your own 429 (or 200): a plain object that `new Headers()`,
 * `new Response(body, { headers })` and `res.writeHead(status, headers)` all take.
 * Only the headers the service sent are present; a "deny" fallback has
 * `Retry-After` only.
 */
export function rateLimitHeaders(result: Pick<PglimitResult, "headers">): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of ["RateLimit-Policy", "RateLimit", "Retry-After"] as const satisfies (keyof RateLimitHeaders)[]) {
    const value = result.headers[name];
    if (value !== undefined) out[name] = value;
  }
  return out;
}

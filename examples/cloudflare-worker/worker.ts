// A Cloudflare Worker: POST /login limited by pglimit's `login` policy.
// Bindings (wrangler.toml [vars] / secrets): PGLIMIT_URL, PGLIMIT_TOKEN.
import { Pglimit, rateLimitHeaders } from "@pglimit/client";

export interface Env {
  PGLIMIT_URL: string;
  PGLIMIT_TOKEN?: string;
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const url = new URL(request.url);
    if (request.method !== "POST" || url.pathname !== "/login") return Response.json({ error: "not found" }, { status: 404 });
    const body = (await request.json().catch(() => ({}))) as { email?: unknown };
    if (typeof body.email !== "string") return Response.json({ error: "email is required" }, { status: 400 });
    // Set by Cloudflare's edge; a client cannot forge it.
    const ip = request.headers.get("cf-connecting-ip") ?? "0.0.0.0";

    // Bindings arrive with the request, so the client is made per request:
    // it is a few fields, no connection pool.
    const pglimit = new Pglimit({
      url: env.PGLIMIT_URL,
      ...(env.PGLIMIT_TOKEN ? { token: env.PGLIMIT_TOKEN } : {}),
      timeoutMs: 1000,
      onError: "allow",
    });
    const limit = await pglimit.check({ policy: "login", identifiers: { email: body.email, ip } });
    if (!limit.allowed) {
      return Response.json({ error: "too many attempts", retryAfter: limit.retryAfter }, { status: 429, headers: rateLimitHeaders(limit) });
    }
    // Verify the password here; after a success (without delaying the answer):
    //   ctx.waitUntil(pglimit.reset({ policy: "login", identifiers: { email, ip }, buckets: ["email_ip"] }));
    return Response.json({ ok: true, remaining: limit.remaining }, { headers: rateLimitHeaders(limit) });
  },
};

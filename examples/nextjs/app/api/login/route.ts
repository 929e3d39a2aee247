// Next.js App Router route handler for POST /api/login, limited by pglimit's
// `login` policy. Route handlers take a Web Request and return a Web
// Response, which is all this file uses, so it runs on the Node.js and the
// Edge runtime alike.
import { Pglimit, rateLimitHeaders } from "@pglimit/client";

export const runtime = "edge"; // or "nodejs": the client needs only fetch

const pglimit = new Pglimit({
  url: process.env.PGLIMIT_URL ?? "http://127.0.0.1:8080",
  ...(process.env.PGLIMIT_TOKEN ? { token: process.env.PGLIMIT_TOKEN } : {}),
  timeoutMs: 1000,
  onError: "allow",
});

export async function POST(request: Request): Promise<Response> {
  const body = (await request.json().catch(() => ({}))) as { email?: unknown };
  if (typeof body.email !== "string") return Response.json({ error: "email is required" }, { status: 400 });
  const ip = clientIp(request);

  const limit = await pglimit.check({ policy: "login", identifiers: { email: body.email, ip } });
  if (!limit.allowed) {
    return Response.json({ error: "too many attempts", retryAfter: limit.retryAfter }, { status: 429, headers: rateLimitHeaders(limit) });
  }
  // Verify the password here; after a success:
  //   await pglimit.reset({ policy: "login", identifiers: { email: body.email, ip }, buckets: ["email_ip"] });
  return Response.json({ ok: true }, { headers: rateLimitHeaders(limit) });
}

// On Vercel, x-real-ip is set by the platform; elsewhere take the rightmost
// X-Forwarded-For entry added by your own proxy (the left ones are the client's).
function clientIp(request: Request): string {
  return request.headers.get("x-real-ip") ?? request.headers.get("x-forwarded-for")?.split(",").at(-1)?.trim() ?? "0.0.0.0";
}

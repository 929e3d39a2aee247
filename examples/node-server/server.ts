// A plain node:http server whose POST /login is limited by pglimit's `login`
// policy (5 tries a minute per email and IP, 20 per IP, 50 per email in 15
// minutes). Run: PGLIMIT_URL=http://127.0.0.1:8080 node dist/server.js
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { Pglimit, PglimitProblemError, rateLimitHeaders } from "@pglimit/client";

// One client for the process: it keeps nothing but its options.
const pglimit = new Pglimit({
  url: process.env.PGLIMIT_URL ?? "http://127.0.0.1:8080",
  ...(process.env.PGLIMIT_TOKEN ? { token: process.env.PGLIMIT_TOKEN } : {}),
  timeoutMs: 1000,
  onError: "allow", // an outage of pglimit must not lock everyone out of logging in
});

async function login(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const body = JSON.parse(await readBody(req)) as { email?: unknown; password?: unknown };
  if (typeof body.email !== "string") return send(res, 400, { error: "email is required" });
  const identifiers = { email: body.email, ip: clientIp(req) };

  const limit = await pglimit.check({ policy: "login", identifiers });
  if (!limit.allowed) {
    return send(res, 429, { error: "too many attempts", retryAfter: limit.retryAfter }, rateLimitHeaders(limit));
  }
  // Verify the password here. After a success, forgive this user's typos so
  // they do not count against the next session (the ip and email buckets go
  // on counting an attacker spraying accounts):
  //   await pglimit.reset({ policy: "login", identifiers, buckets: ["email_ip"] });
  send(res, 200, { ok: true, remaining: limit.remaining }, rateLimitHeaders(limit));
}

// Behind your own proxy, take the rightmost X-Forwarded-For entry it added
// (entries further left are the client's and can be forged).
function clientIp(req: IncomingMessage): string {
  const forwarded = process.env.TRUST_PROXY ? String(req.headers["x-forwarded-for"] ?? "") : "";
  const fromProxy = forwarded.split(",").at(-1)?.trim();
  return fromProxy || (req.socket.remoteAddress ?? "0.0.0.0");
}

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}

async function readBody(req: IncomingMessage): Promise<string> {
  let body = "";
  for await (const chunk of req) body += String(chunk);
  return body;
}

const server = createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/login") return send(res, 404, { error: "not found" });
  login(req, res).catch((error: unknown) => {
    // A PglimitProblemError is a bug in this code (e.g. a malformed IP), not
    // the user's: log it and answer 500 rather than guessing.
    console.error(error instanceof PglimitProblemError ? `pglimit refused the check: ${error.message}` : error);
    if (!res.headersSent) send(res, error instanceof SyntaxError ? 400 : 500, { error: "login failed" });
  });
});

server.listen(Number(process.env.PORT ?? 3000), process.env.HOST ?? "127.0.0.1", () => {
  const address = server.address();
  if (address && typeof address === "object") console.log(`listening on http://${address.address}:${address.port}`);
});
// Stop on SIGTERM like any well-behaved server (and so tests can stop it).
process.once("SIGTERM", () => server.close());

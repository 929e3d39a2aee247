// Answers a healthy pglimit does not give on demand (5xx, a store outage
// under a fail-closed policy, a garbled body), served by a local HTTP server.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Pglimit, PglimitProblemError, PglimitUnavailableError, rateLimitHeaders } from "@pglimit/client";

type Answer = { status: number; type?: string; headers?: Record<string, string>; body: string };
let next: Answer = { status: 500, body: "" };
const seen: { url: string; authorization: string | undefined; body: string }[] = [];

const server = createServer((req, res) => {
  let body = "";
  req.on("data", (chunk: Buffer) => (body += chunk.toString()));
  req.on("end", () => {
    seen.push({ url: req.url ?? "", authorization: req.headers.authorization, body });
    res.writeHead(next.status, { "content-type": next.type ?? "application/problem+json", ...next.headers });
    res.end(next.body);
  });
});
await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
after(() => new Promise((done) => server.close(done)));
const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/prefix`;
const request = { policy: "login", identifiers: { email: "a@example.com", ip: "203.0.113.7" } };

function problem(status: number, kind: string): string {
  return JSON.stringify({ type: `urn:pglimit:problem:${kind}`, title: "t", status, detail: "d" });
}

test("requests go to the URL's path prefix, with the token and the body", async () => {
  next = { status: 500, body: problem(500, "internal") };
  seen.length = 0;
  const client = new Pglimit({ url, token: "tok" });
  await client.check(request);
  await client.peek(request);
  await client.reset({ ...request, buckets: ["email_ip"] });
  assert.deepEqual(seen.map((s) => s.url), ["/prefix/check", "/prefix/check", "/prefix/reset"]);
  assert.deepEqual(seen.map((s) => s.authorization), ["Bearer tok", "Bearer tok", "Bearer tok"]);
  assert.deepEqual(seen.map((s) => JSON.parse(s.body)), [
    request,
    { ...request, cost: 0 },
    { ...request, buckets: ["email_ip"] },
  ]);
  await new Pglimit({ url }).check(request);
  assert.equal(seen.at(-1)?.authorization, undefined, "no token configured, none sent");
});

test("a 5xx is an outage: the onError outcome, the problem as the cause", async () => {
  for (const [status, kind] of [[500, "internal"], [503, "request-timeout"], [502, "bad-gateway"]] as const) {
    next = { status, body: problem(status, kind), headers: { "retry-after": "1" } };
    const allowed = await new Pglimit({ url, onError: "allow" }).check(request);
    assert.equal(allowed.allowed, true);
    assert.equal(allowed.reason, "error");
    assert.ok(allowed.error instanceof PglimitProblemError);
    assert.equal(allowed.error.status, status);
    const denied = await new Pglimit({ url, onError: "deny" }).check(request);
    assert.equal(denied.allowed, false);
    assert.equal(denied.reason, "error");
    await assert.rejects(new Pglimit({ url, onError: "throw" }).check(request), (error: unknown) => {
      assert.ok(error instanceof PglimitUnavailableError);
      assert.ok(error.cause instanceof PglimitProblemError);
      assert.equal(error.cause.type, `urn:pglimit:problem:${kind}`);
      return true;
    });
  }
});

test("a fail-closed policy's store-unavailable 503 is a denial, even with onError allow", async () => {
  next = { status: 503, body: problem(503, "store-unavailable"), headers: { "retry-after": "1" } };
  for (const onError of ["allow", "deny", "throw"] as const) {
    const r = await new Pglimit({ url, onError }).check(request);
    assert.equal(r.allowed, false, onError);
    assert.equal(r.reason, "checked");
    assert.equal(r.store, "none");
    assert.equal(r.retryAfter, 1);
    assert.deepEqual(rateLimitHeaders(r), { "Retry-After": "1" });
  }
});

test("a 200 that is not a decision (e.g. a proxy's page) is an outage, not a crash", async () => {
  next = { status: 200, type: "text/html", body: "<html>hello</html>" };
  const r = await new Pglimit({ url, onError: "deny" }).check(request);
  assert.equal(r.allowed, false);
  assert.equal(r.reason, "error");
});

test("a 4xx that is not a problem document still throws a PglimitProblemError", async () => {
  next = { status: 404, type: "text/plain", body: "no such route" };
  await assert.rejects(new Pglimit({ url }).check(request), (error: unknown) => {
    assert.ok(error instanceof PglimitProblemError);
    assert.equal(error.status, 404);
    assert.equal(error.detail, "no such route");
    return true;
  });
});

test("the caller's abort signal rejects with its reason, not an onError outcome", async () => {
  const controller = new AbortController();
  controller.abort(new Error("caller gave up"));
  await assert.rejects(new Pglimit({ url }).check(request, { signal: controller.signal }), /caller gave up/);
});

test("bad options are refused at construction", () => {
  assert.throws(() => new Pglimit({ url, timeoutMs: 0 }), RangeError);
  // @ts-expect-error: not an onError value
  assert.throws(() => new Pglimit({ url, onError: "ignore" }), RangeError);
});

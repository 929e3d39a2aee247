// The client's test cases, runtime-neutral: Node runs them in
// client.test.ts, workerd (through Miniflare) in workerd.test.ts via
// worker.ts. Each takes the URLs of the real pglimit and of the helpers, and
// an id that makes its identifiers its own.
import {
  Pglimit,
  PglimitProblemError,
  PglimitUnavailableError,
  rateLimitHeaders,
  type BucketResult,
  type PglimitResult,
} from "@pglimit/client";
import { deepEqual, equal, ok, rejects } from "./assert.js";

export interface CaseEnv {
  /** The real pglimit. */
  url: string;
  /** A TCP server that accepts and never answers. */
  hangUrl: string;
  /** A loopback port nothing listens on. */
  closedUrl: string;
  /** Unique per run of a case, 16 hex digits: identifiers are built from it. */
  id: string;
}

/** The identifiers a case uses for the `login` policy; the workerd test peeks them from Node. */
export function loginOf(id: string) {
  // An IPv6 address of the case's own /64 (the service counts IPv6 by /64),
  // so no case shares the `ip` bucket (20 a minute) with another.
  return { email: `${id}@example.com`, ip: `2001:db8:${id.slice(0, 4)}:${id.slice(4, 8)}::1` };
}

/** 16 random hex digits (Web Crypto: Node, workerd). */
export function newId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const TIMEOUT_MS = 200;
// The bound: the timeout outcome within timeoutMs + 50 ms.
const TIMEOUT_SLACK_MS = 50;

export const cases = {
  async "five allowed, then denied with retryAfter"(env: CaseEnv) {
    const client = new Pglimit({ url: env.url });
    const login = { policy: "login", identifiers: loginOf(env.id) };
    for (let i = 1; i <= 5; i++) {
      const r = await client.check(login);
      equal(r.allowed, true, `check ${i} allowed`);
      equal(r.reason, "checked", `check ${i} reason`);
      equal(r.remaining, 5 - i, `check ${i} remaining`);
      equal(r.retryAfter, 0, `check ${i} retryAfter`);
      equal(r.store, "postgres", `check ${i} store`);
      equal(r.degraded, false, `check ${i} degraded`);
      ok(typeof r.requestId === "string" && r.requestId.length > 0, "x-request-id read");
      equal(rateLimitHeaders(r)["Retry-After"], undefined, "no Retry-After when allowed");
    }
    const denied = await client.check(login);
    equal(denied.allowed, false, "6th denied");
    equal(denied.reason, "checked", "6th reason");
    equal(denied.remaining, 0, "6th remaining");
    ok(denied.retryAfter > 0 && denied.retryAfter <= 60, `retryAfter in 1..60, got ${denied.retryAfter}`);
    ok(denied.resetAt instanceof Date && denied.resetAt.getTime() > Date.now(), "resetAt is a future Date");
    const headers = rateLimitHeaders(denied);
    deepEqual(Object.keys(headers).sort(), ["RateLimit", "RateLimit-Policy", "Retry-After"], "forwarded headers");
    equal(headers["Retry-After"], String(denied.retryAfter), "Retry-After matches retryAfter");
    ok(headers["RateLimit-Policy"]?.includes('"email_ip";q=5;w=60'), `RateLimit-Policy: ${headers["RateLimit-Policy"]}`);
    // The plain object is Headers-compatible.
    equal(new Headers(headers).get("retry-after"), String(denied.retryAfter), "new Headers(helper)");
  },

  async "a peek consumes nothing"(env: CaseEnv) {
    const client = new Pglimit({ url: env.url });
    const login = { policy: "login", identifiers: loginOf(env.id) };
    equal((await client.check(login)).remaining, 4, "first check");
    for (let i = 0; i < 3; i++) {
      const peek = await client.peek(login);
      equal(peek.allowed, true, "peek allowed");
      equal(peek.remaining, 4, `peek ${i} remaining`);
      deepEqual(peek.buckets.map((b) => b.remaining), [4, 19, 49], `peek ${i} buckets`);
    }
    equal((await client.check(login)).remaining, 3, "check after peeks");
  },

  async "the multi-bucket login answer, bucket by bucket"(env: CaseEnv) {
    const client = new Pglimit({ url: env.url });
    const r: PglimitResult = await client.check({ policy: "login", identifiers: loginOf(env.id) });
    const byName = new Map<string, BucketResult>(r.buckets.map((b) => [b.name, b]));
    deepEqual(r.buckets.map((b) => b.name), ["email_ip", "ip", "email"], "bucket names");
    const expected = { email_ip: [5, 4, 60], ip: [20, 19, 60], email: [50, 49, 900] } as const;
    for (const [name, [limit, remaining, windowS]] of Object.entries(expected)) {
      const b = byName.get(name);
      ok(b, `bucket ${name}`);
      equal(b.limit, limit, `${name} limit`);
      equal(b.remaining, remaining, `${name} remaining`);
      equal(b.allowed, true, `${name} allowed`);
      equal(b.algorithm, "fixed_window", `${name} algorithm`);
      ok(b.resetAt instanceof Date, `${name} resetAt is a Date`);
      const inS = (b.resetAt.getTime() - Date.now()) / 1000;
      ok(inS > 0 && inS <= windowS + 1, `${name} resets within its window (${inS} s)`);
    }
    // Top-level figures are the bucket with least remaining.
    equal(r.limit, 5, "top-level limit");
    equal(r.remaining, 4, "top-level remaining");
  },

  async "reset brings email_ip back"(env: CaseEnv) {
    const client = new Pglimit({ url: env.url });
    const login = { policy: "login", identifiers: loginOf(env.id) };
    for (let i = 0; i < 5; i++) await client.check(login);
    equal((await client.check(login)).allowed, false, "denied before reset");
    const reset = await client.reset({ ...login, buckets: ["email_ip"] });
    equal(reset.allowed, true, "reset answers allowed");
    deepEqual(reset.buckets.map((b) => [b.name, b.remaining]), [["email_ip", 5], ["ip", 15], ["email", 45]], "after reset");
    equal((await client.check(login)).remaining, 4, "check after reset");
  },

  async "an ad hoc key"(env: CaseEnv) {
    const client = new Pglimit({ url: env.url });
    const key = { key: `adhoc:${env.id}`, limit: 2, window: "1m", algorithm: "sliding_window" } as const;
    equal((await client.check(key)).remaining, 1, "first");
    equal((await client.check(key)).remaining, 0, "second");
    const denied = await client.check(key);
    equal(denied.allowed, false, "third denied");
    deepEqual(denied.buckets.map((b) => [b.name, b.algorithm]), [["default", "sliding_window"]], "one default bucket");
  },

  async "a lease is released and renewed, and withLease releases in finally"(env: CaseEnv) {
    const client = new Pglimit({ url: env.url });
    const exports = { key: `export:${env.id}`, limit: 1, algorithm: "concurrency" as const, lease: "30s" };
    const held = await client.check(exports);
    equal(held.allowed, true, "first check admitted");
    ok(held.lease !== undefined && /^lease_[0-9a-f]{32}$/.test(held.lease.id), "a lease id");
    ok(held.lease.expiresAt.getTime() > Date.now(), "expiresAt is a future Date");
    equal((await client.check(exports)).allowed, false, "the one slot is held");
    const renewed = await client.renew(held.lease.id);
    equal(renewed.id, held.lease.id, "renew keeps the id");
    ok(renewed.expiresAt.getTime() >= held.lease.expiresAt.getTime(), "renew extends");
    equal(await client.release(held.lease.id), true, "release frees");
    equal(await client.release(held.lease.id), false, "a second release is false");
    const gone = await rejects(client.renew(held.lease.id), "renew of a released lease");
    ok(gone instanceof PglimitProblemError && gone.status === 404 && gone.field === "lease", `404 lease, got ${String(gone)}`);

    const done = await client.withLease(exports, () => "exported");
    deepEqual([done.allowed, done.allowed && done.value], [true, "exported"], "withLease runs fn");
    const failing = await rejects(
      client.withLease(exports, () => {
        throw new Error("export failed");
      }),
      "withLease passes fn's error on",
    );
    ok(failing instanceof Error && failing.message === "export failed", "fn's own error");
    equal((await client.check(exports)).allowed, true, "both withLease calls released their slot");
  },

  async "a 400 becomes PglimitProblemError with its field, whatever onError says"(env: CaseEnv) {
    for (const onError of ["allow", "deny", "throw"] as const) {
      const client = new Pglimit({ url: env.url, onError });
      const error = await rejects(
        client.check({ policy: "login", identifiers: { email: "a@example.com", ip: "not-an-ip" } }),
        `invalid ip (${onError})`,
      );
      ok(error instanceof PglimitProblemError, `a PglimitProblemError, got ${String(error)}`);
      equal(error.status, 400, "status");
      equal(error.type, "urn:pglimit:problem:invalid-field", "type");
      equal(error.field, "identifiers.ip", "field");
      ok(error.detail.length > 0, "detail");
      equal(error.title, "Bad Request", "title");
    }
    const unknown = await rejects(new Pglimit({ url: env.url }).check({ policy: "nope", identifiers: {} }), "unknown policy");
    ok(unknown instanceof PglimitProblemError, "unknown policy: a PglimitProblemError");
    equal(unknown.type, "urn:pglimit:problem:unknown-policy", "unknown policy type");
  },

  async "no answer within timeoutMs gives reason timeout, in time"(env: CaseEnv) {
    for (const onError of ["allow", "deny", "throw"] as const) {
      const client = new Pglimit({ url: env.hangUrl, timeoutMs: TIMEOUT_MS, onError });
      const started = performance.now();
      const outcome = await client.check({ key: `t:${env.id}`, limit: 1, window: "1m" }).catch((e: unknown) => e);
      const elapsed = performance.now() - started;
      ok(elapsed < TIMEOUT_MS + TIMEOUT_SLACK_MS, `${onError}: answered in ${elapsed.toFixed(1)} ms`);
      if (onError === "throw") {
        ok(outcome instanceof PglimitUnavailableError, `throw: PglimitUnavailableError, got ${String(outcome)}`);
        equal(outcome.reason, "timeout", "throw: reason");
      } else {
        const r = outcome as PglimitResult;
        equal(r.reason, "timeout", `${onError}: reason`);
        equal(r.allowed, onError === "allow", `${onError}: allowed`);
        equal(r.store, "none", `${onError}: store`);
      }
    }
  },

  async "an unreachable pglimit gives reason error and the onError outcome"(env: CaseEnv) {
    await expectUnreachable(env.closedUrl, env.id);
  },
} satisfies Record<string, (env: CaseEnv) => Promise<void>>;

export type CaseName = keyof typeof cases;

/** allow / deny / throw against a URL where nothing answers. Also used on a SIGTERMed pglimit. */
export async function expectUnreachable(url: string, id: string): Promise<void> {
  const request = { policy: "login", identifiers: loginOf(id) };

  const allowed = await new Pglimit({ url, onError: "allow" }).check(request);
  equal(allowed.allowed, true, "allow: allowed");
  equal(allowed.reason, "error", "allow: reason");
  equal(allowed.store, "none", "allow: store");
  equal(allowed.retryAfter, 0, "allow: retryAfter");
  deepEqual(rateLimitHeaders(allowed), {}, "allow: no headers");
  ok(allowed.error !== undefined, "allow: error kept");

  const denied = await new Pglimit({ url, onError: "deny" }).check(request);
  equal(denied.allowed, false, "deny: allowed");
  equal(denied.reason, "error", "deny: reason");
  equal(denied.store, "none", "deny: store");
  equal(denied.retryAfter, 1, "deny: retryAfter");
  deepEqual(rateLimitHeaders(denied), { "Retry-After": "1" }, "deny: headers");

  const thrown = await rejects(new Pglimit({ url, onError: "throw" }).check(request), "throw");
  ok(thrown instanceof PglimitUnavailableError, `throw: PglimitUnavailableError, got ${String(thrown)}`);
  equal(thrown.reason, "error", "throw: reason");
  ok(thrown.cause !== undefined, "throw: carries its cause");
}

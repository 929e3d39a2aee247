// explain() against a pglimit of its own with API and admin tokens: what a
// check would answer and why (allowed, denied, blocked, each algorithm's
// state), counting nothing; the admin token, not the API token, opens it.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { Pglimit, PglimitProblemError, PglimitUnavailableError, type ExplainedBucket } from "@pglimit/client";
import { startPglimit } from "#pglimit-process";
import { loginOf, newId } from "./cases.js";
import { closedUrl } from "./support.js";

const TOKEN = "explain-api-token-0123";
const ADMIN_TOKEN = "explain-admin-token-4567";
const pglimit = await startPglimit({ env: { PGLIMIT_API_TOKENS: TOKEN, PGLIMIT_ADMIN_TOKENS: ADMIN_TOKEN } });
after(() => pglimit.stop());
const unreachable = await closedUrl();

const client = new Pglimit({ url: pglimit.url, token: TOKEN, adminToken: ADMIN_TOKEN, onError: "throw" });
const login = () => ({ policy: "login", identifiers: loginOf(newId()) });

function bucket(buckets: ExplainedBucket[], name: string): ExplainedBucket {
  const found = buckets.find((b) => b.name === name);
  assert.ok(found, `bucket ${name} in ${buckets.map((b) => b.name).join(", ")}`);
  return found;
}

/** POST /admin/blocks with the admin token: the client has no call for it. */
async function block(body: object): Promise<void> {
  const response = await fetch(`${pglimit.url}/admin/blocks`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN_TOKEN}` },
    body: JSON.stringify(body),
  });
  assert.equal(response.status, 200, await response.text());
}

test("an identity with room is explained as allowed, bucket by bucket, and counts nothing", async () => {
  const request = login();
  const told = await client.explain(request);
  assert.equal(told.policy, "login");
  assert.equal(told.cost, 1);
  assert.equal(told.allowed, true);
  assert.equal(told.reason, "allowed");
  assert.match(told.why, /^Allowed/);
  assert.equal(told.rule, null);
  assert.equal(told.store, "postgres");
  assert.equal(told.degraded, false);
  assert.equal(told.shadow, undefined);
  assert.equal(told.rememberedDenialUntil, undefined);
  assert.ok(told.checkedAt instanceof Date && Math.abs(told.checkedAt.getTime() - Date.now()) < 60_000);
  assert.ok(typeof told.requestId === "string" && told.requestId.length > 0, "x-request-id read");
  assert.deepEqual(
    told.buckets.map((b) => [b.name, b.algorithm, b.limit, b.windowSeconds, b.remaining, b.state]),
    [
      ["email_ip", "fixed_window", 5, 60, 5, null],
      ["ip", "fixed_window", 20, 60, 20, null],
      ["email", "fixed_window", 50, 900, 50, null],
    ],
  );
  for (const b of told.buckets) {
    assert.match(b.key, /^[0-9a-f]{16}$/);
    assert.deepEqual([b.allowed, b.retryAfter, b.block, b.waiters], [true, 0, null, 0], b.name);
    assert.ok(b.resetAt instanceof Date && b.resetAt.getTime() > Date.now(), `${b.name} resetAt`);
    assert.match(b.why, /^room for a cost of 1/);
  }
  const text = JSON.stringify(told);
  assert.ok(!text.includes(request.identifiers.email), "the identifiers are never shown");

  assert.equal((await client.check(request)).remaining, 4, "the explanation counted nothing");
  const later = await client.explain(request);
  const state = bucket(later.buckets, "email_ip").state;
  assert.ok(state?.algorithm === "fixed_window", `a fixed window's state: ${JSON.stringify(state)}`);
  assert.equal(state.count, 1);
  assert.ok(state.windowEndsAt instanceof Date && state.windowEndsAt.getTime() > Date.now());
  assert.equal(bucket(later.buckets, "email_ip").remaining, 4);
});

test("a login that used up email_ip is explained as denied by that bucket", async () => {
  const request = login();
  for (let i = 0; i < 5; i++) assert.equal((await client.check(request)).allowed, true);
  const told = await client.explain(request);
  assert.equal(told.allowed, false);
  assert.equal(told.reason, "denied");
  assert.match(told.why, /"email_ip" has no room for a cost of 1/);
  const emailIp = bucket(told.buckets, "email_ip");
  assert.deepEqual([emailIp.allowed, emailIp.remaining, emailIp.block], [false, 0, null]);
  assert.ok(emailIp.retryAfter >= 1 && emailIp.retryAfter <= 60, `retryAfter ${emailIp.retryAfter}`);
  assert.ok(emailIp.state?.algorithm === "fixed_window" && emailIp.state.count === 5, JSON.stringify(emailIp.state));
  assert.deepEqual([bucket(told.buckets, "ip").allowed, bucket(told.buckets, "ip").remaining], [true, 15]);

  // A denied check is remembered by the instance that denied it, and explain says so.
  assert.equal((await client.check(request)).allowed, false);
  const remembered = await client.explain(request);
  assert.equal(remembered.reason, "denied");
  assert.ok(remembered.rememberedDenialUntil instanceof Date, "rememberedDenialUntil is a Date");
  assert.ok(remembered.rememberedDenialUntil.getTime() > Date.now());
});

test("a key denied three times is explained with three denials in the top list, the others with none", async () => {
  const request = login();
  for (let i = 0; i < 5; i++) assert.equal((await client.check(request)).allowed, true);
  for (let i = 0; i < 3; i++) assert.equal((await client.check(request)).allowed, false);
  // The instance that answers writes its own counts before it reads them.
  const told = await client.explain(request);
  const denials = bucket(told.buckets, "email_ip").denials;
  assert.ok(denials !== null, "the top list is on");
  assert.equal(denials.count, 3);
  assert.ok(denials.last instanceof Date, "last is a Date");
  assert.ok(denials.last.getTime() <= Date.now() && denials.last.getTime() > Date.now() - 5 * 60_000, `last ${denials.last.toISOString()}`);
  assert.ok(denials.since instanceof Date, "since is a Date");
  // Over the retention, 7 days, from the start of its oldest minute.
  const back = told.checkedAt.getTime() - 7 * 24 * 3600_000;
  assert.equal(denials.since.getTime(), back - (back % 60_000), "counted over the retention, 7 days");
  for (const name of ["ip", "email"]) {
    const other = bucket(told.buckets, name).denials;
    assert.ok(other !== null && other.count === 0 && other.last === null, `${name}: ${JSON.stringify(other)}`);
  }
});

test("an email an operator blocked is explained as blocked, with the block's reason and end", async () => {
  const request = login();
  await block({ policy: "login", identifiers: { email: request.identifiers.email }, for: "15m", reason: "ticket 42" });
  const told = await client.explain(request);
  assert.equal(told.allowed, false);
  assert.equal(told.reason, "blocked");
  assert.match(told.why, /ticket 42/);
  const email = bucket(told.buckets, "email");
  assert.ok(email.block !== null, "the email bucket is blocked");
  assert.deepEqual([email.block.kind, email.block.reason, email.allowed, email.remaining], ["admin", "ticket 42", false, 0]);
  const inS = (email.block.until.getTime() - Date.now()) / 1000;
  assert.ok(inS > 14 * 60 && inS <= 15 * 60, `the block ends in 15 minutes (${inS} s)`);
  assert.ok(email.block.since instanceof Date && email.block.since.getTime() <= Date.now() + 1000);
  assert.ok(email.retryAfter > 14 * 60 && email.retryAfter <= 15 * 60, `retryAfter ${email.retryAfter}`);
  assert.deepEqual([bucket(told.buckets, "email_ip").block, bucket(told.buckets, "ip").block], [null, null]);
  assert.equal((await client.check(request)).allowed, false, "check agrees");
});

test("each algorithm's state is told in its own terms, for an ad hoc key", async () => {
  const id = newId();
  const requests = [
    { key: `fw:${id}`, limit: 3, window: "1h" },
    { key: `sw:${id}`, limit: 3, window: "1h", algorithm: "sliding_window" },
    { key: `sl:${id}`, limit: 3, window: "1h", algorithm: "sliding_log" },
    { key: `tb:${id}`, limit: 3, window: "1h", algorithm: "token_bucket" },
    { key: `cc:${id}`, limit: 3, lease: "1h", algorithm: "concurrency" },
  ] as const;
  for (const request of requests) {
    assert.equal((await client.check(request)).allowed, true);
    const told = await client.explain(request);
    assert.equal(told.policy, null);
    assert.equal(told.reason, "allowed");
    const [only] = told.buckets;
    assert.ok(only !== undefined && only.name === "default" && only.remaining === 2, JSON.stringify(only));
    assert.equal(only.windowSeconds, 3600);
    const state = only.state;
    assert.ok(state !== null, `${only.algorithm}: a state`);
    assert.equal(state.algorithm, only.algorithm);
    switch (state.algorithm) {
      case "fixed_window":
        assert.equal(state.count, 1);
        assert.ok(state.windowEndsAt instanceof Date);
        break;
      case "sliding_window":
        assert.deepEqual([state.count, state.previousWindowCount], [1, 0]);
        assert.ok(state.windowStartedAt.getTime() <= Date.now());
        break;
      case "sliding_log":
        assert.equal(state.entries.length, 1);
        assert.ok(state.entries[0] instanceof Date);
        break;
      case "token_bucket":
        assert.ok(state.theoreticalArrivalTime.getTime() > Date.now());
        break;
      case "concurrency":
        assert.equal(state.slotsHeld, 1);
        assert.ok(state.earliestLeaseEnd.getTime() > Date.now());
        break;
    }
  }
});

test("a wrong or missing admin token is a PglimitProblemError 401, and the API token does not open explain", async () => {
  const clients = [
    new Pglimit({ url: pglimit.url, token: TOKEN, adminToken: "wrong" }),
    new Pglimit({ url: pglimit.url, token: TOKEN }),
    new Pglimit({ url: pglimit.url, token: TOKEN, adminToken: TOKEN }),
  ];
  for (const [i, other] of clients.entries()) {
    await assert.rejects(other.explain(login()), (error: unknown) => {
      assert.ok(error instanceof PglimitProblemError, `client ${i}: ${String(error)}`);
      assert.equal(error.status, 401);
      assert.equal(error.type, "urn:pglimit:problem:unauthorized");
      return true;
    });
  }
  // The same client still checks with its API token.
  assert.equal((await clients[0]!.check(login())).allowed, true);
});

test("an unknown policy or a malformed identifier is a PglimitProblemError 400 naming the field", async () => {
  await assert.rejects(client.explain({ policy: "nope", identifiers: {} }), (error: unknown) => {
    assert.ok(error instanceof PglimitProblemError);
    assert.deepEqual([error.status, error.type, error.field], [400, "urn:pglimit:problem:unknown-policy", "policy"]);
    return true;
  });
  await assert.rejects(
    client.explain({ policy: "login", identifiers: { email: "a@example.com", ip: "300.1.1.1" } }),
    (error: unknown) => error instanceof PglimitProblemError && error.status === 400 && error.field === "identifiers.ip",
  );
});

test("an unreachable pglimit makes explain throw PglimitUnavailableError, whatever onError says", async () => {
  for (const onError of ["allow", "deny", "throw"] as const) {
    const away = new Pglimit({ url: unreachable, adminToken: ADMIN_TOKEN, onError });
    await assert.rejects(away.explain(login()), (error: unknown) => {
      assert.ok(error instanceof PglimitUnavailableError, `${onError}: ${String(error)}`);
      assert.equal(error.reason, "error");
      return true;
    });
  }
});

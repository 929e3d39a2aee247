// maxWait against the real pglimit: a check that would be denied is held
// until admitted, and the call's timeout is extended by maxWait.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Pglimit, PglimitProblemError } from "@pglimit/client";
import { newId } from "./cases.js";
import { sharedPglimit } from "./support.js";

const url = await sharedPglimit();
// One token a window: the held check is admitted when it refills.
const WINDOW_MS = 1000;
const MAX_WAIT_MS = 3 * WINDOW_MS;
// Shorter than the wait: only the extended timeout lets the answer arrive.
const client = new Pglimit({ url, timeoutMs: WINDOW_MS / 2, onError: "throw" });
const bucket = (key: string) => ({ key, limit: 1, window: `${WINDOW_MS}ms`, algorithm: "token_bucket" as const });

test("a held check is admitted when the bucket refills, with waitedMs", async () => {
  const request = bucket(`wait-${newId()}`);
  const first = await client.check(request);
  assert.equal(first.allowed, true);
  assert.equal(first.waitedMs, undefined, "no waitedMs without maxWait");
  const held = await client.check(request, { maxWait: MAX_WAIT_MS });
  assert.equal(held.allowed, true);
  assert.equal(held.reason, "checked");
  assert.ok(held.waitedMs !== undefined && held.waitedMs > 0 && held.waitedMs <= MAX_WAIT_MS, `${held.waitedMs}`);
});

test("maxWait may be written as the service writes it; a later refill answers at once", async () => {
  const request = { ...bucket(`later-${newId()}`), window: "10s" };
  await client.check(request);
  const denied = await client.check(request, { maxWait: "3s" });
  assert.equal(denied.allowed, false);
  assert.equal(denied.waitedMs, 0);
  assert.ok(denied.retryAfter > 3);
});

test("a malformed maxWait is the service's 400 naming max_wait", async () => {
  await assert.rejects(
    client.check(bucket(`bad-${newId()}`), { maxWait: "soon" }),
    (e: unknown) => e instanceof PglimitProblemError && e.field === "max_wait" && e.status === 400,
  );
});

// @ts-check
// What every example must do with six logins of one email from one IP:
// 200 five times, then 429 with Retry-After and the RateLimit headers.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";

/** An email no other run has used, so the login policy's buckets start full. */
export function freshEmail() {
  return `${randomBytes(8).toString("hex")}@example.com`;
}

/**
 * @param {() => Promise<{ status: number, headers: Record<string, string | undefined>, body: any }>} attempt
 *   one login; header names lower-case
 */
export async function expectFiveThen429(attempt) {
  for (let i = 1; i <= 5; i++) {
    const r = await attempt();
    assert.equal(r.status, 200, `login ${i}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.remaining, 5 - i, `login ${i} remaining`);
    assert.match(r.headers["ratelimit"] ?? "", /"email_ip";r=\d+;t=\d+/, `login ${i} RateLimit`);
    assert.equal(r.headers["retry-after"], undefined, `login ${i}: no Retry-After`);
  }
  const denied = await attempt();
  assert.equal(denied.status, 429, `login 6: ${JSON.stringify(denied.body)}`);
  const retryAfter = Number(denied.headers["retry-after"]);
  assert.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After ${denied.headers["retry-after"]}`);
  assert.equal(denied.body.retryAfter, retryAfter, "body retryAfter matches the header");
  assert.match(denied.headers["ratelimit-policy"] ?? "", /"email_ip";q=5;w=60/);
  assert.match(denied.headers["ratelimit"] ?? "", /"email_ip";r=0;/);
}

/** @param {string} name */
export function pglimitUrl(name) {
  const url = process.env.PGLIMIT_URL;
  if (!url) throw new Error(`${name}: PGLIMIT_URL is not set (run examples/run-tests, which starts pglimit)`);
  return url;
}

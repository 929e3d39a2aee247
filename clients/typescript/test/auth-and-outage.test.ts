// A pglimit of its own, with API tokens: the token is sent and a 401 is a
// typed error; then that pglimit is stopped with SIGTERM and every onError
// outcome is checked against it.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { Pglimit, PglimitProblemError } from "@pglimit/client";
import { startPglimit } from "#pglimit-process";
import { expectUnreachable, loginOf, newId } from "./cases.js";

const TOKEN = "test-token-0123456789";
const pglimit = await startPglimit({ env: { PGLIMIT_API_TOKENS: `other-token,${TOKEN}` } });
after(() => pglimit.stop());

test("the configured token is sent and accepted", async () => {
  const r = await new Pglimit({ url: pglimit.url, token: TOKEN }).check({ policy: "login", identifiers: loginOf(newId()) });
  assert.equal(r.reason, "checked");
  assert.equal(r.allowed, true);
  assert.equal(r.remaining, 4);
});

test("a missing or wrong token is a PglimitProblemError 401, whatever onError says", async () => {
  for (const token of [undefined, "wrong"]) {
    for (const onError of ["allow", "deny", "throw"] as const) {
      const client = new Pglimit({ url: pglimit.url, onError, ...(token ? { token } : {}) });
      await assert.rejects(client.check({ policy: "login", identifiers: loginOf(newId()) }), (error: unknown) => {
        assert.ok(error instanceof PglimitProblemError);
        assert.equal(error.status, 401);
        assert.equal(error.type, "urn:pglimit:problem:unauthorized");
        return true;
      });
    }
  }
});

test("a pglimit stopped with SIGTERM gives reason error and the onError outcome", async () => {
  await pglimit.stop();
  assert.equal(await pglimit.exited, 0, "pglimit exits cleanly on SIGTERM");
  await expectUnreachable(pglimit.url, newId());
});

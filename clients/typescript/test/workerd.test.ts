// The cases of cases.ts again, inside workerd (Cloudflare's runtime) through
// Miniflare, fetching the real pglimit on loopback. Miniflare's default
// outbound service is a workerd `network` service that allows "public" and
// "private" addresses ("private" includes loopback), so the Worker's own
// global fetch reaches 127.0.0.1 with no mock and no outboundService.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { Miniflare } from "miniflare";
import { Pglimit } from "@pglimit/client";
import { cases, loginOf, newId } from "./cases.js";
import { closedUrl, hangingServer, sharedPglimit } from "./support.js";

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url));
const pglimitUrl = await sharedPglimit();

// The Worker bundle: test/worker.ts + cases + the client as built in dist/
// (what npm pack ships), for the browser-like platform workerd is.
const bundle = await build({
  entryPoints: [here("../../test/worker.ts")],
  bundle: true,
  format: "esm",
  platform: "neutral",
  target: "es2022",
  write: false,
  alias: { "@pglimit/client": here("../../dist/index.js") },
  logLevel: "silent",
});

const mf = new Miniflare({
  modules: true,
  script: bundle.outputFiles[0]!.text,
  compatibilityDate: "2025-01-01",
  bindings: { PGLIMIT_URL: pglimitUrl, HANG_URL: await hangingServer(), CLOSED_URL: await closedUrl() },
});
after(() => mf.dispose());

async function runInWorker(name: string, id: string): Promise<{ ok: boolean; error?: string; runtime?: string }> {
  const res = await mf.dispatchFetch(`http://worker/?case=${encodeURIComponent(name)}&id=${id}`);
  return (await res.json()) as { ok: boolean; error?: string; runtime?: string };
}

for (const name of Object.keys(cases)) {
  test(`workerd: ${name}`, async () => {
    const outcome = await runInWorker(name, newId());
    assert.ok(outcome.ok, outcome.error);
    assert.equal(outcome.runtime, "Cloudflare-Workers", "ran in workerd");
  });
}

test("workerd: the Worker's checks reached the real pglimit (seen from Node)", async () => {
  const id = newId();
  const outcome = await runInWorker("five allowed, then denied with retryAfter", id);
  assert.ok(outcome.ok, outcome.error);
  const peek = await new Pglimit({ url: pglimitUrl }).peek({ policy: "login", identifiers: loginOf(id) });
  assert.equal(peek.reason, "checked");
  assert.deepEqual(peek.buckets.map((b) => [b.name, b.remaining]), [["email_ip", 0], ["ip", 15], ["email", 45]]);
});

// @ts-check
// Bundles cloudflare-worker/worker.ts and runs it in workerd via Miniflare;
// its fetch reaches the real pglimit on loopback (Miniflare's default
// outbound network service allows private addresses, loopback included).
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { Miniflare } from "miniflare";
import { expectFiveThen429, freshEmail, pglimitUrl } from "./logins.mjs";

const bundle = await build({
  entryPoints: [fileURLToPath(new URL("../cloudflare-worker/worker.ts", import.meta.url))],
  bundle: true,
  format: "esm",
  platform: "neutral",
  target: "es2022",
  write: false,
  logLevel: "silent",
});
const mf = new Miniflare({
  modules: true,
  script: bundle.outputFiles[0].text,
  compatibilityDate: "2025-01-01",
  bindings: { PGLIMIT_URL: pglimitUrl("cloudflare-worker") },
});
after(() => mf.dispose());

test("cloudflare-worker: five logins, then 429 with the forwarded headers", async () => {
  const email = freshEmail();
  await expectFiveThen429(async () => {
    const res = await mf.dispatchFetch("http://worker/login", {
      method: "POST",
      headers: { "content-type": "application/json", "cf-connecting-ip": "198.51.100.77" },
      body: JSON.stringify({ email, password: "x" }),
    });
    return { status: res.status, headers: Object.fromEntries(res.headers), body: await res.json() };
  });
});

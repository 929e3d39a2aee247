// @ts-check
// Imports @pglimit/client as installed from the `npm pack` tarball into the
// project at argv[2]: the exports resolve, the classes are there, the types
// are shipped.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const consumer = process.argv[2];
if (!consumer) throw new Error("usage: node scripts/check-pack.mjs CONSUMER_DIR");
const entry = createRequire(join(consumer, "package.json")).resolve("@pglimit/client");
if (!entry.startsWith(join(consumer, "node_modules"))) throw new Error(`resolved outside the consumer: ${entry}`);
const client = await import(entry);
for (const name of ["Pglimit", "rateLimitHeaders", "PglimitProblemError", "PglimitUnavailableError"]) {
  if (typeof client[name] !== "function") throw new Error(`the tarball does not export ${name}`);
}
const types = entry.replace(/index\.js$/, "index.d.ts");
if (!existsSync(types)) throw new Error(`the tarball has no types at ${types}`);
new client.Pglimit({ url: "http://127.0.0.1:9" }); // constructs without touching the network
console.log(`npm pack: the tarball installs, imports and ships its types (${entry.slice(consumer.length + 1)})`);

// @ts-check
// Runs node-server/dist/server.js as its own process on a free port.
import { after, test } from "node:test";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { expectFiveThen429, freshEmail, pglimitUrl } from "./logins.mjs";

const server = spawn(process.execPath, [fileURLToPath(new URL("../node-server/dist/server.js", import.meta.url))], {
  env: { ...process.env, PGLIMIT_URL: pglimitUrl("node-server"), PORT: "0" },
  stdio: ["ignore", "pipe", "inherit"],
});
after(async () => {
  if (server.exitCode === null && server.signalCode === null) {
    server.kill("SIGTERM");
    await once(server, "exit");
  }
});
const base = await new Promise((found, fail) => {
  server.once("exit", (code) => fail(new Error(`node-server exited (${code}) before listening`)));
  createInterface({ input: /** @type {import("node:stream").Readable} */ (server.stdout) }).on("line", (line) => {
    const match = /^listening on (http:\/\/\S+)$/.exec(line);
    if (match) found(match[1]);
  });
});

test("node-server: five logins, then 429 with the forwarded headers", async () => {
  const email = freshEmail();
  await expectFiveThen429(async () => {
    const res = await fetch(`${base}/login`, { method: "POST", body: JSON.stringify({ email, password: "x" }) });
    return { status: res.status, headers: Object.fromEntries(res.headers), body: await res.json() };
  });
});

// `npm test` without a pglimit binary: one line naming what to run, exit 1
// (it used to exit 13 with nothing said: a spawn that failed left a
// promise that never settled).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const helper = fileURLToPath(new URL("../../scripts/pglimit.mjs", import.meta.url));

test("without a pglimit binary the test runner says in one line what to run and exits 1", () => {
  for (const bin of ["/nonexistent/pglimit", "/tmp"]) {
    const run = spawnSync(process.execPath, [helper, "run", "--", "true"], {
      env: { ...process.env, PGLIMIT_BIN: bin },
      encoding: "utf8",
    });
    assert.equal(run.status, 1, run.stderr);
    assert.equal(
      run.stderr,
      `scripts/pglimit.mjs: no pglimit binary at ${bin}: run \`cargo build\` in the repository's root, or set PGLIMIT_BIN\n`,
    );
  }
});

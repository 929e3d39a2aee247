// @ts-check
// Starts a real pglimit for the tests, the examples and the bench, and stops
// it. The binary comes from PGLIMIT_BIN (default: the workspace's debug
// build). With no DATABASE_URL the service starts a private PostgreSQL in a
// fresh temporary data dir and stops it on SIGTERM, so a stop here always
// sends SIGTERM and waits for the exit.
//
// As a command: `node scripts/pglimit.mjs run -- CMD ARGS...` runs CMD with
// PGLIMIT_URL set to a pglimit started for it, then stops pglimit and exits
// with CMD's status.
import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access, chmod, mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));

/** The pglimit binary: PGLIMIT_BIN, else ../../target/debug/pglimit from the package. */
export function pglimitBin() {
  return process.env.PGLIMIT_BIN
    ? resolve(process.env.PGLIMIT_BIN)
    : resolve(PACKAGE_DIR, "../../target/debug/pglimit");
}

/**
 * What to run, in one line, when there is no pglimit binary to start; else undefined.
 * @returns {Promise<string | undefined>}
 */
export async function missingBinary() {
  const bin = pglimitBin();
  const runnable = await access(bin, constants.X_OK)
    .then(() => stat(bin))
    .then((found) => found.isFile())
    .catch(() => false);
  if (runnable) return undefined;
  return `no pglimit binary at ${bin}: run \`cargo build\` in the repository's root, or set PGLIMIT_BIN`;
}

/** @type {Set<() => Promise<void>>} */
const running = new Set();
let signalsHooked = false;

// An interrupted test run must still stop every cluster it started.
function hookSignals() {
  if (signalsHooked) return;
  signalsHooked = true;
  for (const signal of /** @type {const} */ (["SIGINT", "SIGTERM"])) {
    process.once(signal, () => {
      void Promise.allSettled([...running].map((stop) => stop())).then(() => process.exit(130));
    });
  }
}

/**
 * @param {{ env?: Record<string, string> }} [options] extra environment for the service
 * @returns {Promise<{ url: string, pid: number, stop: () => Promise<void>, exited: Promise<number | null> }>}
 */
export async function startPglimit(options = {}) {
  const missing = await missingBinary();
  if (missing) throw new Error(missing);
  hookSignals();
  const dataDir = await mkdtemp(join(tmpdir(), "pglimit-ts-"));
  // Run as root, the service runs its cluster as `postgres`, which must be
  // able to enter the dir (mkdtemp makes it 0700).
  await chmod(dataDir, 0o755);
  const child = spawn(pglimitBin(), [], {
    env: {
      ...process.env,
      PGLIMIT_BIND: "127.0.0.1:0",
      PGLIMIT_LOG_FORMAT: "json",
      PGLIMIT_DATA_DIR: dataDir,
      RUST_LOG: process.env.RUST_LOG ?? "info,sqlx=warn",
      ...options.env,
    },
    stdio: ["ignore", "ignore", "pipe"],
  });
  // A child that failed to spawn emits "error" and never "exit": either
  // ends it, or stop() would wait forever (and Node exit 13, silently).
  /** @type {Promise<number | null>} */
  const exited = new Promise((done) => {
    child.once("exit", (code) => done(code));
    child.once("error", () => done(null));
  });
  const spawnFailed = new Promise((_, fail) => child.once("error", fail));

  let stopping;
  const stop = () => {
    stopping ??= (async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
      running.delete(stop);
      await rm(dataDir, { recursive: true, force: true });
    })();
    return stopping;
  };
  running.add(stop);

  /** @type {string[]} */
  const log = [];
  const lines = createInterface({ input: /** @type {import("node:stream").Readable} */ (child.stderr) });
  /** @type {Promise<string>} */
  const listening = new Promise((found) => {
    lines.on("line", (line) => {
      if (log.length < 200) log.push(line);
      if (process.env.PGLIMIT_TEST_LOG) process.stderr.write(`[pglimit] ${line}\n`);
      const addr = listeningAddr(line);
      if (addr) found(addr);
    });
  });
  try {
    const addr = await Promise.race([
      listening,
      spawnFailed,
      exited.then((code) => {
        throw new Error(`pglimit exited (${code}) before listening:\n${log.join("\n")}`);
      }),
    ]);
    return { url: `http://${addr}`, pid: /** @type {number} */ (child.pid), stop, exited };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** @param {string} line */
function listeningAddr(line) {
  try {
    const entry = JSON.parse(line);
    return entry?.fields?.message === "listening" ? String(entry.fields.addr) : undefined;
  } catch {
    return undefined;
  }
}

async function runCommand(/** @type {string[]} */ argv) {
  if (argv.length === 0) throw new Error("usage: node scripts/pglimit.mjs run -- CMD ARGS...");
  const missing = await missingBinary();
  if (missing) {
    console.error(`scripts/pglimit.mjs: ${missing}`);
    process.exit(1);
  }
  const pglimit = await startPglimit();
  const child = spawn(/** @type {string} */ (argv[0]), argv.slice(1), {
    stdio: "inherit",
    env: { ...process.env, PGLIMIT_URL: pglimit.url },
  });
  // A signal to this wrapper reaches CMD too (hookSignals stops pglimit).
  for (const signal of /** @type {const} */ (["SIGINT", "SIGTERM"])) {
    process.once(signal, () => child.kill(signal));
  }
  const code = await new Promise((done) => {
    child.once("error", (error) => {
      console.error(error);
      done(127);
    });
    child.once("exit", (status, signal) => done(status ?? (signal ? 128 : 1)));
  });
  await pglimit.stop();
  process.exit(code);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [command, ...rest] = process.argv.slice(2);
  if (command !== "run") {
    console.error("usage: node scripts/pglimit.mjs run -- CMD ARGS...");
    process.exit(2);
  }
  await runCommand(rest[0] === "--" ? rest.slice(1) : rest);
}

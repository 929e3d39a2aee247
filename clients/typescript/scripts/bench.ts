// Micro-bench: what the client adds over a bare fetch of the same body to the
// same pglimit. N sequential checks each way, interleaved in blocks so that
// drift (cache, JIT, the database) hits both sides alike. Prints p50 and p99
// of each and the p50 difference (issue 13's target: under 0.2 ms).
import { Pglimit } from "@pglimit/client";
import { startPglimit } from "#pglimit-process";

const N = Number(process.env.BENCH_N ?? 2000);
const BLOCK = Number(process.env.BENCH_BLOCK ?? 10);
const WARMUP = 200;

const own = process.env.PGLIMIT_URL ? undefined : await startPglimit();
const url = process.env.PGLIMIT_URL ?? own!.url;
try {
  // A limit no run reaches, so every check is an allowed, consuming one.
  const body = { key: `bench:${Date.now()}`, limit: 1_000_000_000, window: "1h" };
  const client = new Pglimit({ url, timeoutMs: 5000, onError: "throw" });
  const bare = async () => {
    const res = await fetch(`${url}/check`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const decision = (await res.json()) as { allowed: boolean };
    if (!decision.allowed) throw new Error("bare fetch denied");
  };
  const viaClient = async () => {
    const r = await client.check(body);
    if (!r.allowed || r.reason !== "checked") throw new Error("client check not allowed");
  };

  for (let i = 0; i < WARMUP; i++) {
    await viaClient();
    await bare();
  }
  const times = { client: [] as number[], fetch: [] as number[] };
  for (let done = 0; done < N; done += BLOCK) {
    const n = Math.min(BLOCK, N - done);
    // Alternate which side goes first in each pair of blocks.
    const order = (done / BLOCK) % 2 === 0 ? (["client", "fetch"] as const) : (["fetch", "client"] as const);
    for (const side of order) {
      const run = side === "client" ? viaClient : bare;
      for (let i = 0; i < n; i++) {
        const t0 = performance.now();
        await run();
        times[side].push(performance.now() - t0);
      }
    }
  }
  const stats = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
    return { p50: at(0.5), p99: at(0.99) };
  };
  const c = stats(times.client);
  const f = stats(times.fetch);
  const ms = (x: number) => x.toFixed(3);
  console.log(`pglimit client micro-bench: N=${N} sequential checks each way, blocks of ${BLOCK}, ${url}`);
  console.log(`bare fetch   p50 ${ms(f.p50)} ms  p99 ${ms(f.p99)} ms`);
  console.log(`client check p50 ${ms(c.p50)} ms  p99 ${ms(c.p99)} ms`);
  console.log(`client overhead at p50: ${ms(c.p50 - f.p50)} ms (target < 0.2 ms)`);
} finally {
  await own?.stop();
}

// Turns the measurements of bench/run into one Markdown table.
//
//   node bench/report.js RESULTS_DIR META_FILE OUT.md
//
// RESULTS_DIR holds one directory per measurement (meta, kind, statements,
// and pgbench.out + txlog.* or wrk.out + probe.*). Prints the report, writes
// it to OUT.md, and exits 1 if a measurement produced no numbers or answered
// with the wrong status (nothing is asserted about speed).
'use strict';

const fs = require('fs');
const path = require('path');

const [resultsDir, metaFile, outFile] = process.argv.slice(2);
if (!outFile) {
  console.error('usage: node bench/report.js RESULTS_DIR META_FILE OUT.md');
  process.exit(2);
}

function keyValues(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const i = line.indexOf('=');
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1);
  }
  return out;
}

const read = (dir, name) => {
  const file = path.join(dir, name);
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
};

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

function pgbenchRecord(dir) {
  const out = read(dir, 'pgbench.out');
  const num = (re) => {
    const m = re.exec(out);
    return m ? Number(m[1]) : NaN;
  };
  const latencies = [];
  for (const name of fs.readdirSync(dir).filter((f) => f.startsWith('txlog'))) {
    for (const line of fs.readFileSync(path.join(dir, name), 'utf8').split('\n')) {
      const fields = line.split(' ');
      if (fields.length >= 6) latencies.push(Number(fields[2]));
    }
  }
  latencies.sort((a, b) => a - b);
  const failed = num(/number of failed transactions: (\d+)/);
  return {
    requests: num(/number of transactions actually processed: (\d+)/),
    rps: num(/tps = ([0-9.]+) \(without initial connection time\)/),
    p50_us: percentile(latencies, 50),
    p99_us: percentile(latencies, 99),
    problems: Number.isFinite(failed) && failed > 0 ? [`${failed} failed transactions`] : [],
  };
}

function wrkRecord(dir, system, scenario) {
  const line = read(dir, 'wrk.out').split('\n').find((l) => l.startsWith('WRKJSON '));
  if (!line) return { requests: NaN, rps: NaN, p50_us: NaN, p99_us: NaN, problems: ['no wrk summary'] };
  const w = JSON.parse(line.slice('WRKJSON '.length));
  const problems = [];
  const expect = read(dir, 'expect').trim();
  const deny = expect === '429';
  const unexpected = deny ? w.requests - w.status_errors : w.status_errors;
  if (unexpected > 0.01 * w.requests) {
    problems.push(`${unexpected} answers were ${deny ? '2xx/3xx' : '4xx/5xx'}`);
  }
  const socket = w.connect_errors + w.read_errors + w.write_errors + w.timeouts;
  if (socket > 0) problems.push(`${socket} socket errors or timeouts`);
  const probe = read(dir, 'probe.status').trim();
  if (probe !== expect) problems.push(`probe answered ${probe || 'nothing'}, expected ${expect}`);
  if (system === 'pglimit' && !/"store":"postgres"/.test(read(dir, 'probe.body'))) {
    problems.push('probe not decided by Postgres');
  }
  return {
    requests: w.requests,
    rps: w.requests / (w.duration_us / 1e6),
    p50_us: w.lat_p50_us,
    p99_us: w.lat_p99_us,
    problems,
  };
}

const meta = keyValues(fs.readFileSync(metaFile, 'utf8'));

// "service · Postgres · rest" in µs of CPU per request, and the machine's
// idle share, from the tick counts bench/run sampled around the run.
function cpuPerRequest(text, requests) {
  const [server, pg, busy, idle] = text.trim().split(/\s+/).map(Number);
  if (![server, pg, busy, idle].every(Number.isFinite) || !(requests > 0)) return '';
  const us = (ticks) => Math.round((ticks * 1e6) / Number(meta.clk_tck || 100) / requests);
  const idleShare = Math.round((100 * idle) / (busy + idle));
  return `${us(server)} · ${us(pg)} · ${us(busy - server - pg)}; ${idleShare}% idle`;
}
const records = [];
for (const name of fs.readdirSync(resultsDir).sort()) {
  const dir = path.join(resultsDir, name);
  const m = keyValues(read(dir, 'meta'));
  const kind = read(dir, 'kind').trim();
  const base = { system: m.system, scenario: m.scenario, concurrency: Number(m.concurrency) };
  let rec;
  if (kind === 'pgbench') rec = pgbenchRecord(dir);
  else if (kind === 'wrk') rec = wrkRecord(dir, m.system, m.scenario);
  else rec = { requests: NaN, rps: NaN, p50_us: NaN, p99_us: NaN, problems: ['did not finish'] };
  const [statements, execMs] = (read(dir, 'statements').trim() || 'NaN NaN').split(/\s+/).map(Number);
  rec.statements = statements;
  rec.perDecision = rec.requests > 0 ? statements / rec.requests : NaN;
  rec.execMsPerStatement = statements > 0 ? execMs / statements : NaN;
  rec.cpu = cpuPerRequest(read(dir, 'cpu'), rec.requests);
  records.push({ ...base, ...rec });
}

// Every step must have produced numbers.
for (const r of records) {
  for (const field of ['requests', 'rps', 'p50_us', 'p99_us', 'statements']) {
    if (!Number.isFinite(r[field]) || (field !== 'statements' && !(r[field] > 0))) {
      r.problems.push(`no ${field}`);
    }
  }
}

const find = (system, scenario, concurrency) =>
  records.find((r) => r.system === system && r.scenario === scenario && r.concurrency === concurrency);
const ratio = (a, b) => (a && b && a.rps > 0 && b.rps > 0 ? (a.rps / b.rps).toFixed(2) : '');

const SCENARIOS = {
  'allow-random': 'allow, random keys (10,000)',
  'allow-hot': 'allow, one hot key',
  deny: 'deny, 100 keys over limit',
  'deny-inmemory-block': 'deny, `inMemoryBlockOnConsumed`',
};
const SYSTEMS = {
  'raw-pg': 'raw Postgres (pgbench upsert)',
  ceiling: 'HTTP ceiling (axum, no store)',
  pglimit: '**pglimit**',
  rlflex: 'rate-limiter-flexible (Node, pg)',
  runlimit: 'runlimit-postgres (Rust, sqlx)',
};
const scenarioOrder = ['allow-random', 'allow-hot', 'deny', 'deny-inmemory-block'];
const systemOrder = ['raw-pg', 'ceiling', 'pglimit', 'rlflex', 'runlimit'];
const group = (s) => (s.startsWith('deny') ? 2 : scenarioOrder.indexOf(s));
records.sort((a, b) => group(a.scenario) - group(b.scenario) || a.concurrency - b.concurrency
  || systemOrder.indexOf(a.system) - systemOrder.indexOf(b.system)
  || scenarioOrder.indexOf(a.scenario) - scenarioOrder.indexOf(b.scenario));

const ms = (us) => (Number.isFinite(us) ? (us / 1000).toFixed(2) : '');
const int = (n) => (Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '');
const rows = [];
rows.push('| system | scenario | clients | requests/s | p50 ms | p99 ms | statements / decision '
  + '| Postgres ms / statement | × raw Postgres | × HTTP ceiling | × rate-limiter-flexible '
  + '| × runlimit-postgres | CPU µs / request: service · Postgres · rest | check |');
rows.push('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|');
for (const r of records) {
  const http = r.system === 'pglimit' || r.system === 'rlflex' || r.system === 'runlimit';
  const rawShape = r.scenario === 'allow-random' || r.scenario === 'allow-hot';
  const vsRaw = http && rawShape ? ratio(r, find('raw-pg', r.scenario, r.concurrency)) : '';
  const vsCeiling = http ? ratio(r, find('ceiling', 'allow-random', r.concurrency)) : '';
  const vsRunlimit = r.system === 'pglimit' ? ratio(r, find('runlimit', r.scenario, r.concurrency)) : '';
  let vsPeer = '';
  if (r.system === 'pglimit') {
    vsPeer = ratio(r, find('rlflex', r.scenario, r.concurrency));
    if (r.scenario === 'deny') {
      const block = ratio(r, find('rlflex', 'deny-inmemory-block', r.concurrency));
      if (block) vsPeer += ` (${block} vs block)`;
    }
  }
  const perDecision = r.system === 'ceiling' ? (r.statements === 0 ? '0' : String(r.statements))
    : (Number.isFinite(r.perDecision) ? r.perDecision.toFixed(3) : '');
  rows.push(`| ${SYSTEMS[r.system] || r.system} | ${SCENARIOS[r.scenario] || r.scenario} | ${r.concurrency} `
    + `| ${int(r.rps)} | ${ms(r.p50_us)} | ${ms(r.p99_us)} | ${perDecision} `
    + `| ${Number.isFinite(r.execMsPerStatement) ? r.execMsPerStatement.toFixed(3) : ''} `
    + `| ${vsRaw} | ${vsCeiling} | ${vsPeer} | ${vsRunlimit} | ${r.cpu || ''} | ${r.problems.length ? r.problems.join('; ') : 'ok'} |`);
}
const table = rows.join('\n');

const mib = (kib) => (Number(kib) > 0 ? `${(Number(kib) / 1024).toFixed(1)} MiB` : 'unknown');
const report = `# pglimit throughput, ${meta.date}${meta.smoke === '1' ? ' (smoke run: too short to quote)' : ''}

- Command: \`${meta.command}\` (${meta.seconds} s per measurement after ${meta.warmup} s of warm-up; \
wrk and pgbench with ${meta.threads} threads)
- Machine: ${meta.nproc} CPUs, ${meta.cpu}, ${meta.memory}; ${meta.os}, ${meta.kernel}
- PostgreSQL ${meta.postgres}: throwaway cluster on 127.0.0.1, fsync on, synchronous_commit on, \
logged tables, otherwise default settings
- pglimit ${meta.commit}, ${meta.rustc}, release build, default settings (4 lanes: one main, three spares; cleanup rate 0.01)
- rate-limiter-flexible ${meta.rlflex} (RateLimiterPostgres, pg ${meta.pg_npm}, pool of 16), Node ${meta.node}, one process
- runlimit-postgres ${meta.runlimit} (PostgresLimiter, its migrations in a database of its own, default \
PostgresConfig, SQLx ${meta.runlimit_sqlx} pool of 16) behind axum, release build (\`bench/peer-runlimit/\`)
- Load: wrk ${meta.wrk} with \`bench/check.lua\`, load generator, server and Postgres on the same machine

${table}

- Peak RSS (VmHWM) of pglimit over all its measurements: ${mib(meta.pglimit_rss_kib)}; \
of the rate-limiter-flexible server: ${mib(meta.rlflex_rss_kib)}; \
of the runlimit-postgres server: ${mib(meta.runlimit_rss_kib)}.
- pglimit logged ${meta.pglimit_warnings || 0} warning or error lines; /readyz at the end: \`${meta.pglimit_readyz}\`.

How to read it:
- *requests/s* is decisions per second (pgbench: transactions per second, each one upsert). \
p50 and p99 come from wrk's latency histogram, or from pgbench's per-transaction log.
- *statements / decision*: top-level statements the system's database executed (\`bench\`; \
\`runlimit\` for the runlimit-postgres peer; pg_stat_statements, \
reset before each measurement) divided by the requests the client counted; checks still in flight \
when the client stopped, pglimit's sampled cleanups and the runlimit peer's cleanup every 10 s make \
it slightly above the true figure. \
*Postgres ms / statement*: their mean execution time inside the server (pg_stat_statements \
total_exec_time; excludes parsing, the network and the commit's WAL flush).
- *× raw Postgres*: requests/s over pgbench's for the same key shape and client count; no raw \
figure exists for the deny path. *× HTTP ceiling*: over the axum server that parses the same JSON \
and answers a fixed body. *× rate-limiter-flexible*: pglimit over the peer in the same scenario \
(for the deny path, also over the peer with \`inMemoryBlockOnConsumed\`, which answers repeat \
offenders from memory). *× runlimit-postgres*: pglimit over the runlimit-postgres peer in the \
same scenario.
- *CPU µs / request* (HTTP measurements): CPU time per request of the server process, of the \
PostgreSQL cluster's processes, and of everything else (the load generator, kernel threads, \
interrupts), from /proc over the measured run; then the machine's idle share. This is the \
profile behind the figures: with all systems on one machine, requests/s is bounded by the sum.
- Deny path: limit 1 on 100 keys, each already used once, so every measured check is denied.
- *check*: \`ok\` when every answer had the expected status (200 allow, 429 deny), no socket errors, \
and a probe after the run answered as expected (for pglimit, decided by Postgres).
`;

fs.writeFileSync(outFile, report);
process.stdout.write(report);
const failed = records.filter((r) => r.problems.length > 0);
const expected = 5 * 1 + 1; // at least one measurement per system
if (records.length < expected || failed.length > 0) {
  console.error(`bench/run: ${failed.length} measurement(s) with problems (see the check column)`);
  process.exit(1);
}

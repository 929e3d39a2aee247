# bench/limitador's report, in Markdown: jq -n -r -f bench/limitador.jq with
# $rows (one object per measurement, from bench/limitador's measure), $exact
# ("<system> <admitted>" lines) and the run's $date, $commit, $machine,
# $setup, $skipped, $exact_n and $exact_limit.

def systems: ["pglimit", "pglimit-async", "pglimit-unlogged", "limitador-redis", "limitador-redis_cached", "limitador-memory"];
def pglimits: systems | map(select(startswith("pglimit")));
def scenarios: ["allow-random", "allow-hot", "deny"];

# A number with n decimals (jq has no printf).
def dec(n):
  ((. * pow(10; n)) | round) as $i
  | (if $i < 0 then -$i else $i end | tostring) as $d
  | (if ($d | length) <= n then ("0" * (n + 1 - ($d | length))) + $d else $d end) as $p
  | (if $i < 0 then "-" else "" end) + (if n == 0 then $p else $p[0:-n] + "." + $p[-n:] end);
# An integer with thousands separated by commas.
def thousands:
  round | tostring | [while(length > 0; .[:-3]) | .[-3:]] | reverse | join(",");
def ms: . / 1000 | dec(2);
def count: if . == null then "—" else thousands end;
def ratio(a; b): if a == null or b == null or b == 0 then "—" else (a / b | dec(2)) + " ×" end;

def find(s; p; sc; c):
  [$rows[] | select(.system == s and .proto == p and .scenario == sc and .conc == c)][0];
def clients: [$rows[].conc] | unique;
def measured: systems - (systems - [$rows[].system]);
# Each system's admitted checks, round by round: "50 · 50 · 51".
def admitted:
  [$exact | split("\n")[] | select(length > 0) | split(" ") | {key: .[0], value: (.[1:] | join(" · "))}]
  | from_entries;

def promise:
  {
    "pglimit": "exact: each check is one transaction on its key's row in PostgreSQL (fsync on), shared by every instance",
    "pglimit-async": "exact and shared as pglimit; its database set to `synchronous_commit = off`, so a commit does not wait for its flush: a crash of PostgreSQL loses the counts of its last moments (at most 3 × `wal_writer_delay`, 600 ms by default), which are then admitted again",
    "pglimit-unlogged": "exact and shared as pglimit; `PGLIMIT_UNLOGGED=true`: no write-ahead log, so a crash or failover of PostgreSQL empties every counter, as a restart of Redis without persistence does",
    "limitador-redis": "not exact under concurrency: \"this implementation does not guarantee exact limits\" (`limitador/src/storage/redis/redis_async.rs`): it reads the counter (`MGET`), then increments it in a second round trip; shared by every instance, in a Redis without persistence",
    "limitador-redis_cached": "over the limit between flushes: \"We can go over limits\" (`redis_cached.rs`): each instance counts in its memory, a counter not yet cached as 0, and flushes to Redis every 1 s",
    "limitador-memory": "per instance: counters in the process, no shared store (n instances admit n × the limit); a read, then an add (`in_memory.rs`)"
  }[.];

# The outcome column: answers other than 200 / OK; on the deny path, "all"
# when every one was, else "all but" the admitted ones (keys already used up).
def outcome:
  (if .scenario != "deny" then .non_ok | thousands
   elif .non_ok == .requests then "all"
   else "all but \(.requests - .non_ok | thousands)" end)
  + (if .failed > 0 then " (\(.failed | thousands) failed)" else "" end);

def table(p; name):
  "## \(name)\n",
  "| scenario | clients | system | checks/s | pglimit ÷ this | p50 (ms) | p99 (ms) | \(if p == "http" then "non-2xx" else "not OK" end) | CPU µs per check: service + store + rest |",
  "|---|---:|---|---:|---:|---:|---:|---:|---|",
  (scenarios[] as $sc | clients[] as $c | find("pglimit"; p; $sc; $c) as $pg
   | measured[] as $s | find($s; p; $sc; $c) | select(. != null)
   | "| \($sc) | \($c) | \($s)\(if .other != "" then " †" else "" end) | \(.rps | thousands) | \(if $s == "pglimit" then "" else ratio($pg.rps; .rps) end) | \(.p50_us | ms) | \(.p99_us | ms) | \(outcome) | \(.svc_us | dec(1)) + \(if $s == "limitador-memory" then "—" else .store_us | dec(1) end) + \(.rest_us | dec(1)) |"),
  (if any($rows[] | select(.proto == p); .other != "") then
     "\n† another build or load generator (\([$rows[] | select(.proto == p) | .other | select(. != "") | split(",")[]] | unique | join(", "))) was running at the end of this measurement and of its retry: its figures do not compare."
   else empty end),
  "";

"# bench/run --limitador, \($date), commit \($commit)",
"",
"\($machine); \($setup). pglimit on a throwaway PostgreSQL (fsync and synchronous_commit on, but for pglimit-async); limitador 2981b2b (`vendor/limitador/`) with Redis from Debian on loopback, no persistence. The same limit and fixed window of 1 h on both: allow-random on keys k1..k10000 with a limit that never denies, allow-hot on one key, deny on deny1..deny100 at limit 1, each used up beforehand. HTTP: wrk with `bench/check.lua` (pglimit's `POST /check` ad hoc form; limitador's `POST /check_and_report`); gRPC: `bench/grpc_load.rs`, `ShouldRateLimit` with one descriptor `[{key}]` (pglimit: a policy with one bucket on `key`; limitador: `descriptors[0].key`). CPU from `/proc`: the service, its store (the postgres processes or redis-server) and the rest of the machine (load generators, kernel).",
"",
(if $skipped != "" then "**\($skipped)**\n" else empty end),
"## pglimit ÷ limitador on Redis",
"",
"Checks/s above 1: pglimit serves more; p99 below 1: pglimit's is lower. pglimit as shipped, then at the durability of limitador's Redis (see Exactness).",
"",
"| scenario | clients | pglimit | HTTP checks/s | HTTP p99 | gRPC checks/s | gRPC p99 |",
"|---|---:|---|---:|---:|---:|---:|",
(scenarios[] as $sc | clients[] as $c | pglimits[] as $s
 | [find($s; "http"; $sc; $c), find("limitador-redis"; "http"; $sc; $c),
    find($s; "grpc"; $sc; $c), find("limitador-redis"; "grpc"; $sc; $c)] as [$ph, $lh, $pg, $lg]
 | select($ph != null or $pg != null)
 | "| \($sc) | \($c) | \($s) | \(ratio($ph.rps; $lh.rps)) | \(ratio($ph.p99_us; $lh.p99_us)) | \(ratio($pg.rps; $lg.rps)) | \(ratio($pg.p99_us; $lg.p99_us)) |"),
"",
"## Exactness",
"",
"\($exact_n) checks sent at once over HTTP (curl --parallel, one connection each) on a fresh key at limit \($exact_limit), \($rounds) rounds (a key each): how many each round admitted, beside allow-random's checks/s at \(clients | max) clients.",
"",
"| system | admitted of \($exact_n) at limit \($exact_limit) | HTTP checks/s | gRPC checks/s | what it promises |",
"|---|---:|---:|---:|---|",
(admitted as $a | clients | max as $c | measured[] as $s
 | "| \($s) | \($a[$s] // "—") | \(find($s; "http"; "allow-random"; $c).rps | count) | \(find($s; "grpc"; "allow-random"; $c).rps | count) | \($s | promise) |"),
"",
table("http"; "HTTP"),
table("grpc"; "gRPC (Envoy's rate limit service)")

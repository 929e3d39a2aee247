-- wrk script for bench/run: POST /check with pglimit's ad hoc request form,
-- or (BENCH_MODE=policy) its policy form, or (BENCH_MODE=auth) forward-auth's
-- GET /auth/<policy> with the same identifiers in request headers.
--
-- Environment:
--   BENCH_MODE   random (default): key "k<1..BENCH_KEYS>" at random
--                hot:    always key "hot"
--                deny:   key "deny<1..BENCH_KEYS>" at random (limit BENCH_LIMIT,
--                        pre-filled by bench/run so that every check is denied)
--                reset:  POST /reset (the path wrk was given is ignored) of key
--                        "reset<1..BENCH_KEYS>" at random: bench/run's stream of
--                        resets beside its deny-resets scenario
--                policy: {"policy":BENCH_POLICY,"identifiers":{"email":
--                        "u<N>@example.com","ip":"198.51.100.<M>"}}, N at random
--                        of 1..BENCH_KEYS, M = 1 + (N - 1) % 254 (so 254
--                        addresses, each shared by about BENCH_KEYS / 254
--                        emails); BENCH_LIMIT and BENCH_WINDOW unused (the
--                        policy file has the limits)
--                auth:   GET /auth/BENCH_POLICY (the path wrk was given is
--                        ignored) with X-User-Email: u<N>@example.com and
--                        X-Forwarded-For: 198.51.100.<M>, N and M as in
--                        policy mode, no body: what nginx's auth_request
--                        sends for the policy's [forward_auth] table
--                login:  {"policy":"login","identifiers":{"email":"u<E>@example.org",
--                        "ip":"198.<18 + I / 65536>.<I / 256 % 256>.<I % 256>"}},
--                        E at random of 1..BENCH_EMAILS, I of 0..BENCH_IPS - 1
--                        (BENCH_IPS = 131072: all of 198.18.0.0/15, the range
--                        kept for benchmarks), each pair drawn on its own
--                contact: {"policy":"contact_confirmation","identifiers":
--                        {"recipient":"r<R>@example.net"}}, R at random of
--                        1..BENCH_RECIPIENTS
--                mixed:  each request at random: 40% login and 15% contact (as
--                        above), 30% ad hoc one-off keys (limit 100, window 1m;
--                        the four algorithms in turn), 15% ad hoc hot keys
--                        (hot1..hot10, limit 1000000000, window 1h)
--   BENCH_KEYS   number of distinct keys (default 10000)
--   BENCH_LIMIT  limit sent with every check (default 1000000000)
--   BENCH_WINDOW window sent with every check (default 1h)
--   BENCH_ALGORITHM  random mode: the "algorithm" sent with every check
--                (default: none, so the fixed window); "concurrency" sends
--                BENCH_WINDOW as the lease
--   BENCH_POLICY the policy named in policy and auth modes (default "bench",
--                bench/policies.toml); with BENCH_FORM=limitador, the namespace
--   BENCH_FORM   pglimit (default), or limitador: random, hot and deny modes
--                send limitador's POST /check_and_report,
--                {"namespace":BENCH_POLICY,"values":{"key":KEY},"delta":1}
--                (its limits file has the limit and window), for bench/limitador
--   BENCH_POOL   login, contact and mixed modes: requests pre-rendered per
--                thread, each drawn at random, then sent in order (default
--                100000), so that none repeats while a thread sends fewer
--   BENCH_EMAILS, BENCH_IPS, BENCH_RECIPIENTS  the identity spaces of those
--                modes (defaults 1000000, 131072, 4000000; bench/run says why)
--
-- done() prints one JSON line, prefixed "WRKJSON ", that bench/run parses.

local mode = os.getenv("BENCH_MODE") or "random"
local nkeys = tonumber(os.getenv("BENCH_KEYS") or "10000")
local limit = os.getenv("BENCH_LIMIT") or "1000000000"
local window = os.getenv("BENCH_WINDOW") or "1h"
local policy = os.getenv("BENCH_POLICY") or "bench"
local algorithm = os.getenv("BENCH_ALGORITHM") or ""
local limitador = os.getenv("BENCH_FORM") == "limitador"
local pool_size = tonumber(os.getenv("BENCH_POOL") or "100000")
local emails = tonumber(os.getenv("BENCH_EMAILS") or "1000000")
local ips = tonumber(os.getenv("BENCH_IPS") or "131072")
local recipients = tonumber(os.getenv("BENCH_RECIPIENTS") or "4000000")
local pooled = mode == "login" or mode == "contact" or mode == "mixed"

local headers = { ["Content-Type"] = "application/json" }
local prefixes = { deny = "deny", reset = "reset" }
local prefix = prefixes[mode] or "k"
local path = (mode == "reset") and "/reset" or (limitador and "/check_and_report" or "/check")

-- Pre-render every request once: the request() hook then only picks one,
-- so the generator costs the same for every server measured.
local requests = {}

local function body_for(key)
  if limitador then
    return string.format('{"namespace":"%s","values":{"key":"%s"},"delta":1}', policy, key)
  end
  if algorithm == "concurrency" then
    -- A slot held for BENCH_WINDOW (a lease, never released here): the
    -- check's cost with the lease row it writes.
    return string.format('{"key":"%s","limit":%s,"lease":"%s","algorithm":"concurrency"}', key, limit, window)
  end
  if algorithm ~= "" then
    return string.format('{"key":"%s","limit":%s,"window":"%s","algorithm":"%s"}', key, limit, window, algorithm)
  end
  return string.format('{"key":"%s","limit":%s,"window":"%s"}', key, limit, window)
end

-- Policy mode: the identifiers of key number n (bench/run's probe sends n = 1).
local function policy_body_for(n)
  return string.format('{"policy":"%s","identifiers":{"email":"u%d@example.com","ip":"198.51.100.%d"}}',
    policy, n, 1 + (n - 1) % 254)
end

-- Auth mode: the same identifiers as policy_body_for(n), as headers.
local function auth_request_for(n)
  local auth_headers = {
    ["X-User-Email"] = string.format("u%d@example.com", n),
    ["X-Forwarded-For"] = string.format("198.51.100.%d", 1 + (n - 1) % 254),
  }
  return wrk.format("GET", "/auth/" .. policy, auth_headers, nil)
end

-- Login mode: a random email and a random address of their spaces.
local function login_body()
  local i = math.random(0, ips - 1)
  return string.format('{"policy":"login","identifiers":{"email":"u%d@example.org","ip":"198.%d.%d.%d"}}',
    math.random(emails), 18 + math.floor(i / 65536), math.floor(i / 256) % 256, i % 256)
end

local function contact_body()
  return string.format('{"policy":"contact_confirmation","identifiers":{"recipient":"r%d@example.net"}}',
    math.random(recipients))
end

local algorithms = { "fixed_window", "sliding_window", "sliding_log", "token_bucket" }
local one_off = 0

-- Mixed mode: one request of the mix; one-off keys carry the thread's tag so
-- that no other thread or run sends them.
local function mixed_body(tag)
  local r = math.random()
  if r < 0.40 then
    return login_body()
  elseif r < 0.55 then
    return contact_body()
  elseif r < 0.85 then
    one_off = one_off + 1
    return string.format('{"key":"once-%s-%d","limit":100,"window":"1m","algorithm":"%s"}',
      tag, one_off, algorithms[one_off % 4 + 1])
  end
  return string.format('{"key":"hot%d","limit":1000000000,"window":"1h"}', math.random(10))
end

-- A seed from the kernel: two runs started in the same second must not
-- draw the same identities.
local function urandom_seed()
  local f = io.open("/dev/urandom", "rb")
  local bytes = f:read(4)
  f:close()
  local b1, b2, b3, b4 = bytes:byte(1, 4)
  return ((b1 * 256 + b2) * 256 + b3) * 256 + b4
end

local pool_bodies = { login = login_body, contact = contact_body, mixed = mixed_body }

local function fill_pool()
  local seed = urandom_seed()
  math.randomseed(seed)
  local tag = string.format("%08x", seed)
  local body = pool_bodies[mode]
  for i = 1, pool_size do
    requests[i] = wrk.format("POST", "/check", headers, body(tag))
  end
end

local next_id = 0
function setup(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
end

function init(args)
  math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919)
  if pooled then
    fill_pool()
  elseif mode == "hot" then
    requests[1] = wrk.format("POST", path, headers, body_for("hot"))
  elseif mode == "policy" then
    for i = 1, nkeys do
      requests[i] = wrk.format("POST", "/check", headers, policy_body_for(i))
    end
  elseif mode == "auth" then
    for i = 1, nkeys do
      requests[i] = auth_request_for(i)
    end
  else
    for i = 1, nkeys do
      requests[i] = wrk.format("POST", path, headers, body_for(prefix .. i))
    end
  end
end

local cursor = 0

function request()
  if mode == "hot" then
    return requests[1]
  end
  if pooled then
    cursor = cursor % pool_size + 1
    return requests[cursor]
  end
  return requests[math.random(nkeys)]
end

function done(summary, latency, requests_)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"lat_mean_us":%.1f,"lat_p50_us":%d,' ..
    '"lat_p90_us":%d,"lat_p99_us":%d,"lat_max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end

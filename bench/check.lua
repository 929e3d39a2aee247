-- wrk script for bench/run: POST /check with pglimit's ad hoc request form,
-- or (BENCH_MODE=policy) its policy form, or (BENCH_MODE=auth) forward-auth's
-- GET /auth/<policy> with the same identifiers in request headers.
--
-- Environment:
--   BENCH_MODE   random (default): key "k<1..BENCH_KEYS>" at random
--                hot:    always key "hot"
--                deny:   key "deny<1..BENCH_KEYS>" at random (limit BENCH_LIMIT,
--                        pre-filled by bench/run so that every check is denied)
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
--   BENCH_KEYS   number of distinct keys (default 10000)
--   BENCH_LIMIT  limit sent with every check (default 1000000000)
--   BENCH_WINDOW window sent with every check (default 1h)
--   BENCH_POLICY the policy named in policy and auth modes (default "bench",
--                bench/policies.toml)
--
-- done() prints one JSON line, prefixed "WRKJSON ", that bench/run parses.

local mode = os.getenv("BENCH_MODE") or "random"
local nkeys = tonumber(os.getenv("BENCH_KEYS") or "10000")
local limit = os.getenv("BENCH_LIMIT") or "1000000000"
local window = os.getenv("BENCH_WINDOW") or "1h"
local policy = os.getenv("BENCH_POLICY") or "bench"

local headers = { ["Content-Type"] = "application/json" }
local prefix = (mode == "deny") and "deny" or "k"

-- Pre-render every request once: the request() hook then only picks one,
-- so the generator costs the same for every server measured.
local requests = {}

local function body_for(key)
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

local next_id = 0
function setup(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
end

function init(args)
  math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919)
  if mode == "hot" then
    requests[1] = wrk.format("POST", "/check", headers, body_for("hot"))
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
      requests[i] = wrk.format("POST", "/check", headers, body_for(prefix .. i))
    end
  end
end

function request()
  if mode == "hot" then
    return requests[1]
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

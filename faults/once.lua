-- wrk script for faults/soak: every request a key never used before, with a
-- short window, so the table fills with rows that expire and must be cleaned.
-- Each answer's body is checked for "store":"postgres" (a 200 from the
-- memory fallback is not a pass), and done() prints how many lacked it.
local counter = 0
local prefix = ""
local threads = {}

-- Runs in the main state, once per thread: kept so done() can read them.
function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() * 1000 + math.floor(os.clock() * 1000000))
  prefix = string.format("once-%08x-", math.random(0, 0x7fffffff))
  not_postgres = 0 -- a global, for thread:get()
end

function request()
  counter = counter + 1
  local body = string.format('{"key":"%s%d","limit":5,"window":"2s"}', prefix, counter)
  return wrk.format("POST", "/check", { ["Content-Type"] = "application/json" }, body)
end

function response(status, headers, body)
  -- A plain substring search: the service writes compact JSON.
  if not (body and string.find(body, '"store":"postgres"', 1, true)) then
    not_postgres = not_postgres + 1
  end
end

function done(summary, latency, requests)
  local n = 0
  for _, thread in ipairs(threads) do
    n = n + thread:get("not_postgres")
  end
  io.write(string.format("Not from postgres: %d\n", n))
end

-- wrk script for faults/soak: every request a key never used before, with a
-- short window, so the table fills with rows that expire and must be cleaned.
local counter = 0
local prefix = ""

function init(args)
  math.randomseed(os.time() * 1000 + math.floor(os.clock() * 1000000))
  prefix = string.format("once-%08x-", math.random(0, 0x7fffffff))
end

function request()
  counter = counter + 1
  local body = string.format('{"key":"%s%d","limit":5,"window":"2s"}', prefix, counter)
  return wrk.format("POST", "/check", { ["Content-Type"] = "application/json" }, body)
end

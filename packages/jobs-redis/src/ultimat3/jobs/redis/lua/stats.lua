-- stats: per queue holding any row, the rows in each state and the run_at of the oldest row
-- that is due and waiting (ready or delayed, run_at <= now).
-- Answers {queue, {count per state in STATES order}, oldest run_at or false} per queue.
local out = {}
for _, q in ipairs(redis.call('SMEMBERS', K_QUEUES)) do
  local counts = {}
  for i, s in ipairs(STATES) do counts[i] = redis.call('ZCARD', k_state(q, s)) end
  local oldest = false
  -- Suspended rows share the due index: step over the due ones to the first waiting row. Paged
  -- by rank, each page found in O(log n): a ZRANGEBYSCORE offset walks again every row it
  -- skips, which made a metrics scrape quadratic in the suspended rows due (0.8 s beside 60,000).
  local start, last = 0, false
  while not last do
    local page = redis.call('ZRANGE', k_due(q), start, start + 99, 'WITHSCORES')
    last = #page < 200
    for i = 1, #page, 2 do
      if tonumber(page[i + 1]) > NOW_N then last = true break end
      local f = redis.call('HMGET', k_job(page[i]), 'state', 'run_at')
      -- A row whose hash vanished (see forget_vanished) is stepped over like a suspended one.
      if f[1] and f[1] ~= 'suspended' then oldest, last = f[2], true break end
    end
    start = start + 100
  end
  out[#out + 1] = {q, counts, oldest}
end
return out

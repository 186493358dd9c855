-- stats: per queue holding any row, the rows in each state and the run_at of the oldest row
-- that is due and waiting (ready or delayed, run_at <= now).
-- Answers {queue, {count per state in STATES order}, oldest run_at or false} per queue.
local out = {}
for _, q in ipairs(redis.call('SMEMBERS', K_QUEUES)) do
  local counts = {}
  for i, s in ipairs(STATES) do counts[i] = redis.call('ZCARD', k_state(q, s)) end
  local oldest = false
  local offset = 0
  -- Suspended rows share the due index; step over the due ones to the first waiting row.
  while not oldest do
    local page = redis.call('ZRANGEBYSCORE', k_due(q), '-inf', NOW, 'LIMIT', offset, 100)
    if #page == 0 then break end
    for _, id in ipairs(page) do
      local f = redis.call('HMGET', k_job(id), 'state', 'run_at')
      if f[1] ~= 'suspended' then oldest = f[2] break end
    end
    offset = offset + #page
  end
  out[#out + 1] = {q, counts, oldest}
end
return out

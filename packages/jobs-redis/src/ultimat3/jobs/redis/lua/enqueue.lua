-- enqueue: insert rows, or answer the row already there.
-- ARGV[4] = how many rows; then 12 fields per row: id, run_id, name, queue, input, key, tenant,
-- max_attempts, run_at, enqueued_by, traceparent, live key. Optional fields are "" for None and
-- "=" .. value otherwise. Answers {id, run_id, deduped} per row, in order.
--
-- Guarantees (atomic): an id that names ANY row inserts nothing; a live row (ready, delayed,
-- running, suspended) holding (name, tenant or '', key) inserts nothing; both answer that row.
-- A row due within a second is announced on the wake channel, unless an announcement for its
-- queue is still unclaimed (no claim has read the queue since): one wake per claim, not per row.
local WAKE_DUE_US = 1000000
local n = tonumber(ARGV[4])
local out = {}
for i = 0, n - 1 do
  local a = 5 + i * 12
  local id, run, name, q = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local lk = ARGV[a + 11]
  local jk = k_job(id)
  local held = redis.call('HGET', jk, 'run_id')
  if held then
    out[#out + 1] = {id, held, 1}
  else
    local holder = redis.call('HGET', K_LIVE, lk)
    if holder then
      out[#out + 1] = {holder, redis.call('HGET', k_job(holder), 'run_id'), 1}
    else
      local run_at = ARGV[a + 8]
      local state = 'ready'
      if tonumber(run_at) > NOW_N then state = 'delayed' end
      redis.call('HSET', jk, 'id', id, 'run_id', run, 'name', name, 'queue', q, 'state', state,
        'input', ARGV[a + 4], 'key', ARGV[a + 5], 'attempt', 0, 'max', ARGV[a + 7],
        'run_at', run_at, 'created', NOW, 'updated', NOW, 'lk', lk)
      local tenant, by, trace = ARGV[a + 6], ARGV[a + 9], ARGV[a + 10]
      if tenant ~= '' then redis.call('HSET', jk, 'tenant', string.sub(tenant, 2)) end
      if by ~= '' then redis.call('HSET', jk, 'by', string.sub(by, 2)) end
      if trace ~= '' then redis.call('HSET', jk, 'trace', string.sub(trace, 2)) end
      redis.call('HSET', K_LIVE, lk, id)
      redis.call('ZADD', k_due(q), run_at, id)
      redis.call('ZADD', k_state(q, state), NOW, id)
      redis.call('ZADD', K_CREATED, NOW, id)
      redis.call('SADD', K_QUEUES, q)
      if redis.call('HINCRBY', K_RUNS, run, 1) > 1 then redis.call('PERSIST', k_steps(run)) end
      if tonumber(run_at) - NOW_N <= WAKE_DUE_US
          and redis.call('SET', k_woken(q), '1', 'NX', 'PX', WAKE_HOLD_MS) then
        announce(q)
      end
      out[#out + 1] = {id, run, 0}
    end
  end
end
return out

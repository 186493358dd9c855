-- backfill: the ledger, one hash per pass plus an index in the order passes began.
-- ARGV[4] action ("begin" or "update"), ARGV[5] run id.
-- begin: ARGV[6] name, ARGV[7] checksum, ARGV[8] app version (optional) — opens the row, or
--   adopts the one this run opened on an earlier attempt (a failed one is running again, its
--   error cleared). Answers the row's fields.
-- update: ARGV[6] "1" to stamp completed_at now, then (field, value) pairs to set. A run with
--   no row changes nothing. Answers 1 or 0.
local action, run = ARGV[4], ARGV[5]
local key = B .. 'backfill:' .. run
if action == 'begin' then
  if redis.call('EXISTS', key) == 0 then
    local order = redis.call('INCR', B .. 'backfillorder')
    redis.call('HSET', key, 'name', ARGV[6], 'run_id', run, 'checksum', ARGV[7],
      'status', 'running', 'started', NOW, 'rows', 0, 'cursor', 'null', 'order', order)
    local version = optional(ARGV[8])
    if version then redis.call('HSET', key, 'app_version', version) end
    redis.call('ZADD', B .. 'backfills', order, run)
  elseif redis.call('HGET', key, 'status') == 'failed' then
    redis.call('HSET', key, 'status', 'running')
    redis.call('HDEL', key, 'error')
  end
  return redis.call('HGETALL', key)
end
if redis.call('EXISTS', key) == 0 then return 0 end
if ARGV[6] == '1' then redis.call('HSET', key, 'completed', NOW) end
for i = 7, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
return 1

-- workers: drop registry rows past their expiry, answer the rest as {id, json, ...}.
-- ARGV[4] is a worker id to remove first ("" none), so remove_worker is this script too.
local K_WORKERS, K_WORKERS_EXP = B .. 'workers', B .. 'workers:exp'
if ARGV[4] ~= '' then
  redis.call('HDEL', K_WORKERS, ARGV[4])
  redis.call('ZREM', K_WORKERS_EXP, ARGV[4])
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_WORKERS_EXP, '-inf', NOW)) do
  redis.call('HDEL', K_WORKERS, id)
  redis.call('ZREM', K_WORKERS_EXP, id)
end
return redis.call('HGETALL', K_WORKERS)

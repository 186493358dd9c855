-- record_worker: a worker's registry row, live until ARGV[6] (microseconds, driver's clock).
-- ARGV[4] worker id, ARGV[5] the row as JSON. Rows past their expiry are dropped here too.
local K_WORKERS, K_WORKERS_EXP = B .. 'workers', B .. 'workers:exp'
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_WORKERS_EXP, '-inf', NOW)) do
  redis.call('HDEL', K_WORKERS, id)
  redis.call('ZREM', K_WORKERS_EXP, id)
end
redis.call('HSET', K_WORKERS, ARGV[4], ARGV[5])
redis.call('ZADD', K_WORKERS_EXP, ARGV[6], ARGV[4])
return 1

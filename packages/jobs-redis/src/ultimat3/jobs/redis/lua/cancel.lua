-- cancel: stop a LIVE row (ready, delayed, running, suspended). ARGV[4] job id, ARGV[5] the
-- last_error to record. Answers the row's fields, or false when the row is missing or already
-- finished (it is left exactly as it ended). A running row keeps its worker and claim fields,
-- as every row leaving running does; it is no longer running, and every fence checks that
-- first, so its worker's heartbeat, steps, progress and settle all answer 0.
-- A running row records when its run stops at the latest (`stops`, its lease): a requeue makes
-- the row due no earlier, so the run it starts never runs beside the cancelled one.
local row = load(ARGV[4])
if not row or not LIVE[row.state] then return false end
local jk = k_job(ARGV[4])
redis.call('HSET', jk, 'error', ARGV[5])
if row.state == 'running' then
  redis.call('HSET', jk, 'stops', redis.call('HGET', jk, 'lease'))
else
  redis.call('HDEL', jk, 'stops')
end
move(row, 'cancelled')
return redis.call('HGETALL', jk)

-- cancel: stop a LIVE row (ready, delayed, running, suspended). ARGV[4] job id, ARGV[5] the
-- last_error to record. Answers the row's fields, or false when the row is missing or already
-- finished (it is left exactly as it ended). A running row keeps its worker and claim fields,
-- as every row leaving running does; it is no longer running, and every fence checks that
-- first, so its worker's heartbeat, steps, progress and settle all answer 0.
local row = load(ARGV[4])
if not row or not LIVE[row.state] then return false end
redis.call('HSET', k_job(ARGV[4]), 'error', ARGV[5])
move(row, 'cancelled')
return redis.call('HGETALL', k_job(ARGV[4]))

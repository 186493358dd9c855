-- get: one row and the steps of its run, read together. ARGV[4] job id.
-- Answers {row fields, step fields}, or false when no row has that id.
local row = redis.call('HGETALL', k_job(ARGV[4]))
if #row == 0 then return false end
local run = redis.call('HGET', k_job(ARGV[4]), 'run_id')
return {row, redis.call('HGETALL', k_steps(run))}

-- save_step: upsert one step of a run, fenced on the claim of the job that runs it.
-- ARGV[4] job id, ARGV[5] worker id, ARGV[6] claim token, ARGV[7] run id, ARGV[8] step name,
-- ARGV[9] the stored step ("<seq> <completed 1|0> <kind> <output json>"; steps stored before
-- they carried a kind have no <kind>, and codec.py reads both). Answers 1 or 0.
local f = redis.call('HMGET', k_job(ARGV[4]), 'state', 'worker', 'claim')
if f[1] ~= 'running' or f[2] ~= ARGV[5] or f[3] ~= ARGV[6] then return 0 end
redis.call('HSET', k_steps(ARGV[7]), ARGV[8], ARGV[9])
return 1

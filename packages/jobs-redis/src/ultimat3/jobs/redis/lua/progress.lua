-- record_progress: store a run's progress, fenced on its claim.
-- ARGV[4] job id, ARGV[5] worker id, ARGV[6] claim token, ARGV[7] progress json. Answers 1 or 0.
local jk = k_job(ARGV[4])
local f = redis.call('HMGET', jk, 'state', 'worker', 'claim')
if f[1] ~= 'running' or f[2] ~= ARGV[5] or f[3] ~= ARGV[6] then return 0 end
redis.call('HSET', jk, 'progress', ARGV[7])
return 1

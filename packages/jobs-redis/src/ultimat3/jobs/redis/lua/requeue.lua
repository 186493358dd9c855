-- requeue: put ONE finished row (done, failed, dead, cancelled) back in its queue, due now,
-- attempt 0. ARGV[4] job id, ARGV[5] the step to resume from, as `optional` reads it ("" keeps
-- every step; "=" names the step "").
-- Answers {"ok", row fields} or {"missing"}, {"live", state}, {"held", holder id},
-- {"no-step"}; only "ok" changed anything.
--
-- Guarantees (atomic): refused while a live row holds the key; from_step drops that step and
-- every step that started after it in the same call that moves the row.
local FINISHED = {done = true, failed = true, dead = true, cancelled = true}
local id, from_step = ARGV[4], optional(ARGV[5])
local row = load(id)
if not row then return {'missing'} end
if not FINISHED[row.state] then return {'live', row.state} end
local holder = live_holder(row.lk)
if holder then return {'held', holder} end
if from_step then
  local sk = k_steps(row.run_id)
  local cut = redis.call('HGET', sk, from_step)
  if not cut then return {'no-step'} end
  local cut_seq = tonumber(string.match(cut, '^(%-?%d+) '))
  local steps = redis.call('HGETALL', sk)
  for i = 1, #steps, 2 do
    if tonumber(string.match(steps[i + 1], '^(%-?%d+) ')) >= cut_seq then
      redis.call('HDEL', sk, steps[i])
    end
  end
end
ready_again(row)
announce(row.queue)
return {'ok', redis.call('HGETALL', k_job(id))}

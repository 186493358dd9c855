-- claimed: the rows a claim whose reply was lost had taken, answered as that claim answers them.
-- ARGV[4] worker id, ARGV[5] the claim's token base, ARGV[6] its lease_until, ARGV[7] = how many
-- queues it asked, then those queues.
-- Answers {claimed, exhausted} in claim.lua's shape: each row running under this worker with a
-- token of this base and exactly this lease, in the order the claim took them, and each row it
-- buried that is still dead or failed under its mark (an operator who requeued one since took
-- it out), in burial order. Reads only: a claim that never ran took and buried nothing.
local worker, base, lease_until = ARGV[4], ARGV[5], ARGV[6]
local prefix = base .. '.'
local CLAIMED_FIELDS = {'id', 'run_id', 'name', 'queue', 'input', 'key', 'tenant', 'attempt',
  'max', 'run_at', 'created', 'lease', 'worker', 'claim', 'by', 'trace', 'state'}
local taken = {}
for qi = 1, tonumber(ARGV[7]) do
  local q = ARGV[7 + qi]
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k_lease(q), lease_until, lease_until)) do
    local f = redis.call('HMGET', k_job(id), unpack(CLAIMED_FIELDS))
    local claim = f[14]
    if f[17] == 'running' and f[13] == worker and claim
        and string.sub(claim, 1, #prefix) == prefix then
      f[17] = nil
      taken[#taken + 1] = {tonumber(string.sub(claim, #prefix + 1)), f}
    end
  end
end
table.sort(taken, function(x, y) return x[1] < y[1] end)
local claimed = {}
for i, entry in ipairs(taken) do
  claimed[i] = {entry[2], redis.call('HGETALL', k_steps(entry[2][2]))}
end
local exhausted = {}
for _, id in ipairs(redis.call('LRANGE', k_buried(base), 0, -1)) do
  local f = redis.call('HMGET', k_job(id), 'worker', 'claim', unpack(EXHAUSTED_FIELDS))
  local state = f[#f]
  if f[1] == worker and f[2] == base and (state == 'dead' or state == 'failed') then
    table.remove(f, 1)
    table.remove(f, 1)
    exhausted[#exhausted + 1] = f
  end
end
return {claimed, exhausted}

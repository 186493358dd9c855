-- heartbeat: extend the leases of many rows, each fenced on its own claim.
-- ARGV[4] = how many; then 4 fields each: id, worker id, claim token, new lease_until.
-- Answers 1 (renewed) or 0 (the claim no longer holds the row) per row, in order.
local n = tonumber(ARGV[4])
local out = {}
for i = 0, n - 1 do
  local a = 5 + i * 4
  local id = ARGV[a]
  local jk = k_job(id)
  local f = redis.call('HMGET', jk, 'state', 'worker', 'claim', 'queue')
  if f[1] == 'running' and f[2] == ARGV[a + 1] and f[3] == ARGV[a + 2] then
    redis.call('HSET', jk, 'lease', ARGV[a + 3])
    redis.call('ZADD', k_lease(f[4]), ARGV[a + 3], id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out

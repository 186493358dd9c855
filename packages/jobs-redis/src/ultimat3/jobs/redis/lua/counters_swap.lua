-- counters_swap: rewrite the buckets a counter rollup changed, only if nothing else changed
-- them since they were read. ARGV[4] job name, ARGV[5] = how many checks, then
-- (field, value read or "" for absent) pairs, then (field, new value or "" to delete) pairs.
-- Answers 1 (swapped) or 0 (another rollup got there first: nothing changed; read again).
-- Settles only add to the current minute's bucket, which a rollup never rewrites, so the only
-- contender is a second rollup.
local key = k_ctr(ARGV[4])
local checks = tonumber(ARGV[5])
for i = 0, checks - 1 do
  local field, expected = ARGV[6 + i * 2], ARGV[7 + i * 2]
  if (redis.call('HGET', key, field) or '') ~= expected then return 0 end
end
for i = 6 + checks * 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', key, ARGV[i])
  else
    redis.call('HSET', key, ARGV[i], ARGV[i + 1])
  end
end
if redis.call('EXISTS', key) == 0 then redis.call('SREM', K_CTR_NAMES, ARGV[4]) end
return 1

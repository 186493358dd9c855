-- counters_swap: rewrite the buckets a counter rollup changed, only if nothing else changed
-- them since they were read, keeping the bucket index and its field count true.
-- ARGV[4] job name, ARGV[5] = how many fields, then (field, value read, new value) triples ("" is
-- absent: read absent, or to delete), then the buckets the rollup emptied, which leave the index.
-- A field whose new value is the one read is only checked: every field of an emptied bucket
-- comes, so none of them can have been written meanwhile.
-- Answers 1 (swapped) or 0 (another rollup got there first: nothing changed; read again).
-- Settles only add to the current minute's bucket, which a rollup never rewrites, so the only
-- contender is a second rollup.
local name = ARGV[4]
local key, index, len = k_ctr(name), k_ctr_index(name), k_ctr_len(name)
local last = 5 + tonumber(ARGV[5]) * 3
for i = 6, last, 3 do
  if (redis.call('HGET', key, ARGV[i]) or '') ~= ARGV[i + 1] then return 0 end
end
local delta = 0 -- fields created minus fields deleted
for i = 6, last, 3 do
  local field, was, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if value == '' and was ~= '' then
    redis.call('HDEL', key, field)
    delta = delta - 1
  elseif value ~= was then
    redis.call('HSET', key, field, value)
    if was == '' then
      local bucket = string.match(field, '^(%d+:%d+):')
      redis.call('ZADD', index, ctr_score(bucket), bucket)
      delta = delta + 1
    end
  end
end
for i = last + 1, #ARGV do redis.call('ZREM', index, ARGV[i]) end
if redis.call('EXISTS', key) == 0 then
  redis.call('DEL', index, len)
  redis.call('SREM', K_CTR_NAMES, name)
elseif delta ~= 0 then
  redis.call('INCRBY', len, delta)
end
return 1

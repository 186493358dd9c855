-- counters_due: the buckets of one job's counters that are past their tier's retention, read from
-- the bucket index, so a rollup never reads the whole hash (a full history is ~21k fields, and
-- its HGETALL held the server ~6 ms each minute for each job name).
-- ARGV[4] job name, then (tier width, start of the tier's latest due bucket) pairs.
-- Answers the due buckets as "<width>:<start>", tier by tier, oldest first.
--
-- The index is true while its field count equals the hash's length. They differ when a writer
-- that keeps no index (an older driver) added or removed fields, or one key expired without the
-- other: the index is then rebuilt from the hash, which is the record, once. Index and count
-- live as long as the hash: its TTL (or none), and gone when it is.
local REBUILD_BATCH = 1000 -- buckets a ZADD: far below what one unpack() can spread
local name = ARGV[4]
local key, index, len = k_ctr(name), k_ctr_index(name), k_ctr_len(name)
local fields = redis.call('HLEN', key)
if fields == 0 then
  redis.call('DEL', index, len)
  redis.call('SREM', K_CTR_NAMES, name)
  return {}
end
if tonumber(redis.call('GET', len)) ~= fields then
  redis.call('DEL', index)
  local seen, batch = {}, {}
  for _, field in ipairs(redis.call('HKEYS', key)) do
    local bucket = string.match(field, '^(%d+:%d+):')
    if bucket and not seen[bucket] then
      seen[bucket] = true
      batch[#batch + 1] = ctr_score(bucket)
      batch[#batch + 1] = bucket
    end
    if #batch == REBUILD_BATCH * 2 then
      redis.call('ZADD', index, unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then redis.call('ZADD', index, unpack(batch)) end
  redis.call('SET', len, fields)
end
local ttl = redis.call('PTTL', key)
for _, kept in ipairs({index, len}) do
  if ttl > 0 then redis.call('PEXPIRE', kept, ttl) else redis.call('PERSIST', kept) end
end
local due = {}
for i = 5, #ARGV, 2 do
  local first = ctr_score(ARGV[i] .. ':0')
  local last = ctr_score(ARGV[i] .. ':' .. ARGV[i + 1])
  for _, bucket in ipairs(redis.call('ZRANGEBYSCORE', index, first, last)) do
    due[#due + 1] = bucket
  end
end
return due

-- lease: fleet-wide slots, at most `limit` live holders per key, each live until its expiry on
-- the driver's clock. The key's hash maps holder -> "<expires> <slot order>"; beside it a
-- sorted set (`leasexp:<key>`) holds each holder scored by its expiry, so a call drops the
-- holders that expired without reading every holder: O(log n) a call, not O(holders).
-- ARGV[4] action ("acquire", "renew", "release", "holders"), ARGV[5] lease key, ARGV[6] holder,
-- ARGV[7] limit, ARGV[8] new expiry, ARGV[9] key TTL in ms (server time: the backstop that
-- frees a key every holder abandoned).
-- Answers 1/0 (acquire, renew: whether the holder holds a slot now), or for "holders" the live
-- holders as {holder, order, ...}. Expired holders are dropped first, whatever the action.
local action, key, holder = ARGV[4], B .. 'lease:' .. ARGV[5], ARGV[6]
local expiries = B .. 'leasexp:' .. ARGV[5]
if redis.call('ZCARD', expiries) ~= redis.call('HLEN', key) then
  -- The two disagree (a hash written without its sorted set, or one key expired before the
  -- other): rebuild the sorted set from the hash, which is the record.
  redis.call('DEL', expiries)
  local held = redis.call('HGETALL', key)
  for i = 1, #held, 2 do
    redis.call('ZADD', expiries, string.match(held[i + 1], '^(%d+) '), held[i])
  end
end
local expired = redis.call('ZRANGEBYSCORE', expiries, '-inf', NOW)
for i = 1, #expired, 1000 do  -- in chunks: unpack has a ceiling on how much it spreads
  redis.call('HDEL', key, unpack(expired, i, math.min(i + 999, #expired)))
end
redis.call('ZREMRANGEBYSCORE', expiries, '-inf', NOW)
if action == 'holders' then
  local out = {}
  local live = redis.call('HGETALL', key)
  for i = 1, #live, 2 do
    out[#out + 1] = live[i]
    out[#out + 1] = string.match(live[i + 1], ' (%d+)$')
  end
  return out
end
if action == 'release' then
  redis.call('HDEL', key, holder)
  redis.call('ZREM', expiries, holder)
  return 1
end
local mine = redis.call('HGET', key, holder)
if mine then
  redis.call('HSET', key, holder, ARGV[8] .. ' ' .. string.match(mine, ' (%d+)$'))
elseif action == 'renew' or redis.call('HLEN', key) >= tonumber(ARGV[7]) then
  return 0
else
  redis.call('HSET', key, holder, ARGV[8] .. ' ' .. redis.call('INCR', B .. 'leaseorder'))
end
redis.call('ZADD', expiries, ARGV[8], holder)
redis.call('PEXPIRE', key, ARGV[9])
redis.call('PEXPIRE', expiries, ARGV[9])
return 1

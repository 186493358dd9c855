-- lease: fleet-wide slots, at most `limit` live holders per key, each live until its expiry on
-- the driver's clock. The key's hash maps holder -> "<expires> <slot order>"; beside it a
-- sorted set (`leasexp:<key>`) holds each holder scored by its expiry, so a call drops the
-- holders that expired without reading every holder: O(log n) a call, not O(holders).
-- ARGV[4] action ("acquire", "renew", "release", "holders"), ARGV[5] lease key, ARGV[6] holder,
-- ARGV[7] limit, ARGV[8] new expiry, ARGV[9] the backstop in ms: the keys' server TTL is that
-- long past their newest holder's expiry (whoever wrote last), so a key every holder abandoned
-- frees itself and no holder's slot is freed by a shorter lease written after it.
-- Answers 1/0 (acquire, renew: whether the holder holds a slot now), or for "holders" the live
-- holders as {holder, order, ...}. Expired holders are dropped first, whatever the action.
local action, key, holder = ARGV[4], B .. 'lease:' .. ARGV[5], ARGV[6]
local expiries = B .. 'leasexp:' .. ARGV[5]
local function expiry_of(entry) return tonumber(string.match(entry, '^(%d+) ')) end
if redis.call('ZCARD', expiries) ~= redis.call('HLEN', key) then
  -- The two disagree (a hash written without its sorted set, or one key expired before the
  -- other): rebuild the sorted set from the hash, which is the record, with the hash's TTL.
  redis.call('DEL', expiries)
  local held = redis.call('HGETALL', key)
  for i = 1, #held, 2 do redis.call('ZADD', expiries, expiry_of(held[i + 1]), held[i]) end
  local ttl = redis.call('PTTL', key)
  if ttl > 0 then redis.call('PEXPIRE', expiries, ttl) end
end
-- The sorted set names the holders that may have expired; the hash decides. A holder renewed
-- by a writer that kept only the hash (an older driver) still runs: its score is moved on.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', NOW)) do
  local entry = redis.call('HGET', key, gone)
  if entry and expiry_of(entry) > NOW_N then
    redis.call('ZADD', expiries, expiry_of(entry), gone)
  else
    redis.call('HDEL', key, gone)
    redis.call('ZREM', expiries, gone)
  end
end
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
local newest = tonumber(redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')[2])
local ttl_ms = math.max(0, math.floor((newest - NOW_N) / 1000)) + tonumber(ARGV[9])
redis.call('PEXPIRE', key, ttl_ms)
redis.call('PEXPIRE', expiries, ttl_ms)
return 1

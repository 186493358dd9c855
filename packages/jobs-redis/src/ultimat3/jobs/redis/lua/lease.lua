-- lease: fleet-wide slots, at most `limit` live holders per key, each live until its expiry on
-- the driver's clock. The key's hash maps holder -> "<expires> <slot order>".
-- ARGV[4] action ("acquire", "renew", "release", "holders"), ARGV[5] lease key, ARGV[6] holder,
-- ARGV[7] limit, ARGV[8] new expiry, ARGV[9] key TTL in ms (server time: the backstop that
-- frees a key every holder abandoned).
-- Answers 1/0 (acquire, renew: whether the holder holds a slot now), or for "holders" the live
-- holders as {holder, order, ...}. Expired holders are dropped first, whatever the action.
local action, key, holder = ARGV[4], B .. 'lease:' .. ARGV[5], ARGV[6]
local held = redis.call('HGETALL', key)
for i = 1, #held, 2 do
  if tonumber(string.match(held[i + 1], '^(%d+) ')) <= NOW_N then
    redis.call('HDEL', key, held[i])
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
redis.call('PEXPIRE', key, ARGV[9])
return 1

-- events: the event bus, on the SERVER's clock (TIME) — the one clock every process shares, so
-- "published after I asked" never depends on a worker's skew. This is the one script that does
-- not read ARGV[1]. Events are a hash each, expiring on that same clock by the server's own key
-- TTL, indexed per event name by publish time and, for the purge, by expiry. What the purge
-- removes is those index entries (a few dozen bytes an event): the payloads are already gone.
-- Each publish first purges up to PUBLISH_PURGE entries of events expired over PURGE_LAG_US ago,
-- so on a bus in use the index stays within a minute's worth of expired entries whether or not
-- anyone schedules a purge; "purge" removes every expired one (and answers how many), and clears
-- what a bus nobody publishes to any more left behind.
-- ARGV[4] action: "publish" (ARGV[5] id, ARGV[6] event, ARGV[7] payload json, ARGV[8] ttl in
-- microseconds; answers {published_at, expires_at}), "purge" (ARGV[5] how many at most;
-- answers how many it removed) or "now" (answers the server time).
local K_EXP = B .. 'evexpiry'
local PUBLISH_PURGE = 10
local PURGE_LAG_US = 60000000
local t = redis.call('TIME')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
local function purge(limit, before)
  local members = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', before, 'LIMIT', 0, limit)
  for _, member in ipairs(members) do
    local id, event = expiry_parse(member)
    redis.call('ZREM', K_EXP, member)
    redis.call('ZREM', B .. 'evby:' .. event, id)
    redis.call('DEL', B .. 'ev:' .. id)
  end
  return #members
end
local action = ARGV[4]
if action == 'now' then return now end
if action == 'purge' then return purge(tonumber(ARGV[5]), now) end
purge(PUBLISH_PURGE, string.format('%d', tonumber(now) - PURGE_LAG_US))
local id, event = ARGV[5], ARGV[6]
local ttl = tonumber(ARGV[8])
local expires = string.format('%d', tonumber(now) + ttl)
local key = B .. 'ev:' .. id
redis.call('HSET', key, 'event', event, 'payload', ARGV[7], 'published', now, 'expires', expires)
redis.call('PEXPIRE', key, math.max(1, math.floor(ttl / 1000)))
redis.call('ZADD', B .. 'evby:' .. event, now, id)
redis.call('ZADD', K_EXP, expires, expiry_member(id, event))
return {now, expires}

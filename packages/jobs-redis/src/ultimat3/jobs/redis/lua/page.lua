-- page: up to ARGV[7] members of the sorted set KEYS[2] strictly after the position
-- (ARGV[5] score, ARGV[6] member) in direction ARGV[4] ("asc" or "desc"); an empty score starts
-- at the edge. Answers {member, score, member, score, ...}.
--
-- The position is a (score, member) pair, not a rank (see `rank_of`). It is located by reading
-- only, so a replica or a read-only ACL serves this script too.
local key, dir, score, member = KEYS[2], ARGV[4], ARGV[5], ARGV[6]
local n = tonumber(ARGV[7])

if dir == 'asc' then
  local start = 0
  if score ~= '' then start = rank_of(key, score, member, true) end
  return redis.call('ZRANGE', key, start, start + n - 1, 'WITHSCORES')
end
local start = 0
if score ~= '' then start = redis.call('ZCARD', key) - rank_of(key, score, member, false) end
return redis.call('ZREVRANGE', key, start, start + n - 1, 'WITHSCORES')

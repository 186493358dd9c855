-- page: up to ARGV[7] members of the sorted set KEYS[2] strictly after the position
-- (ARGV[5] score, ARGV[6] member) in direction ARGV[4] ("asc" or "desc"); an empty score starts
-- at the edge. Answers {member, score, member, score, ...}.
--
-- The position is a (score, member) pair, not a rank, so a page stays right while the rows
-- before it move or go. A position whose member is not in the set is located by inserting it,
-- reading its rank and taking it out again, inside this one atomic call: O(log n) even when
-- every member shares one score (rows created on a frozen clock).
local key, dir, score, member = KEYS[2], ARGV[4], ARGV[5], ARGV[6]
local n = tonumber(ARGV[7])
local rank_cmd, range_cmd = 'ZRANK', 'ZRANGE'
if dir == 'desc' then rank_cmd, range_cmd = 'ZREVRANK', 'ZREVRANGE' end
local start = 0
if score ~= '' then
  local held = redis.call('ZSCORE', key, member)
  if held and tonumber(held) == tonumber(score) then
    start = redis.call(rank_cmd, key, member) + 1
  else
    redis.call('ZADD', key, score, member)
    start = redis.call(rank_cmd, key, member)
    if held then redis.call('ZADD', key, held, member) else redis.call('ZREM', key, member) end
    -- A member held at another score sat before the probe once put back: step over it.
    if held and dir == 'asc' and tonumber(held) < tonumber(score) then start = start + 1 end
    if held and dir == 'desc' and tonumber(held) > tonumber(score) then start = start + 1 end
  end
end
return redis.call(range_cmd, key, start, start + n - 1, 'WITHSCORES')

-- page: up to ARGV[7] members of the sorted set KEYS[2] strictly after the position
-- (ARGV[5] score, ARGV[6] member) in direction ARGV[4] ("asc" or "desc"); an empty score starts
-- at the edge. Answers {member, score, member, score, ...}.
--
-- The position is a (score, member) pair, not a rank, so a page stays right while the rows
-- before it move or go, and it need not be a member any more. It is located by reading only (a
-- replica or a read-only ACL serves this script too): the members at that score hold the ranks
-- [ZCOUNT below it, ZCOUNT up to it), in member byte order, and a binary search over those
-- ranks finds the place. O(log^2 n) even when every member shares one score (rows created on a
-- frozen clock).
local key, dir, score, member = KEYS[2], ARGV[4], ARGV[5], ARGV[6]
local n = tonumber(ARGV[7])

-- How many members sort before the position, counting a member at it when `inclusive`.
local function ranked_before(inclusive)
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  local hi = redis.call('ZCOUNT', key, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local at = redis.call('ZRANGE', key, mid, mid)[1]
    if bytes_lt(at, member) or (inclusive and at == member) then lo = mid + 1 else hi = mid end
  end
  return lo
end

if dir == 'asc' then
  local start = 0
  if score ~= '' then start = ranked_before(true) end
  return redis.call('ZRANGE', key, start, start + n - 1, 'WITHSCORES')
end
local start = 0
if score ~= '' then start = redis.call('ZCARD', key) - ranked_before(false) end
return redis.call('ZREVRANGE', key, start, start + n - 1, 'WITHSCORES')

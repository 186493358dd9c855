-- page: up to ARGV[7] members of the sorted sets KEYS[2..] strictly after the position
-- (ARGV[5] score, ARGV[6] member) in direction ARGV[4] ("asc" or "desc"), merged in
-- (score, member) order; an empty score starts at the edge. Answers {member, score, ...}.
--
-- The position is a (score, member) pair, not a rank (see `rank_of`). It is located by reading
-- only, so a replica or a read-only ACL serves this script too. Several sets are the sets a row
-- moves between (one queue's states): read in one call, a row that moves meanwhile is answered
-- once, where sets read one after another could each answer it, or neither.
local dir, score, member = ARGV[4], ARGV[5], ARGV[6]
local n = tonumber(ARGV[7])

local function read(key)
  if dir == 'asc' then
    local start = 0
    if score ~= '' then start = rank_of(key, score, member, true) end
    return redis.call('ZRANGE', key, start, start + n - 1, 'WITHSCORES')
  end
  local start = 0
  if score ~= '' then start = redis.call('ZCARD', key) - rank_of(key, score, member, false) end
  return redis.call('ZREVRANGE', key, start, start + n - 1, 'WITHSCORES')
end

if #KEYS == 2 then return read(KEYS[2]) end

-- Whether (member a, score sa) comes before (member b, score sb) in this direction.
local function first(a, sa, b, sb)
  local x, y = tonumber(sa), tonumber(sb)
  if x ~= y then
    if dir == 'asc' then return x < y end
    return x > y
  end
  if dir == 'asc' then return bytes_lt(a, b) end
  return bytes_lt(b, a)
end

local lists, heads = {}, {}
for k = 2, #KEYS do
  lists[#lists + 1] = read(KEYS[k])
  heads[#heads + 1] = 1
end
local out = {}
while #out < 2 * n do
  local best
  for i, list in ipairs(lists) do
    local h = heads[i]
    if h < #list and (best == nil or first(list[h], list[h + 1],
        lists[best][heads[best]], lists[best][heads[best] + 1])) then
      best = i
    end
  end
  if best == nil then break end
  local h = heads[best]
  out[#out + 1] = lists[best][h]
  out[#out + 1] = lists[best][h + 1]
  heads[best] = h + 2
end
return out

-- bulk_count: what a bulk action left for a next call, counted over one page of a sorted set.
-- KEYS[2] the set, ARGV[4] what to count, ARGV[5] a state (for "due"), the optional filters
-- ARGV[6] name and ARGV[7] tenant, the position to count strictly after (ARGV[8] score,
-- ARGV[9] member, see `rank_of`; an empty score starts at the edge), ARGV[10] how many members
-- to read. What to count:
--   "remove", "promote", "requeue": in a state set (one queue's rows in the action's state),
--     the rows a next call could move: every matching row; those still waiting on their run_at;
--     for requeue, the live keys of matching rows that no live row holds, each once (of rows
--     sharing a free key only one can move);
--   "due": in a due index, the rows in the state given whose run_at has come (the rows of a
--     state that promote cannot move: the rest of the state set still waits).
-- Answers {read, last score, last member, matched, free live keys...}; a page shorter than asked
-- is the last one.
--
-- Reads only, and of each row only the fields its check needs (one HMGET, never the whole
-- row): a caller walks a set page by page, so an exact count over many rows never holds the
-- server for long.
local key, what, state = KEYS[2], ARGV[4], ARGV[5]
local name, tenant = optional(ARGV[6]), optional(ARGV[7])
local n = tonumber(ARGV[10])
local want, at = {}, {}
local function read(field)
  want[#want + 1] = field
  at[field] = #want
end
if name then read('name') end
if tenant then read('tenant') end
if what == 'promote' then read('run_at') end
if what == 'requeue' then read('lk') end
if what == 'due' then read('state') end

local start = 0
if ARGV[8] ~= '' then start = rank_of(key, ARGV[8], ARGV[9], true) end
local page = redis.call('ZRANGE', key, start, start + n - 1, 'WITHSCORES')
local matched, keys, seen, last = 0, {}, {}, #page
for i = 1, #page, 2 do
  if what == 'due' and tonumber(page[i + 1]) > NOW_N then
    last = i - 1
    break
  end
  local f = {}
  if #want > 0 then f = redis.call('HMGET', k_job(page[i]), unpack(want)) end
  if (not name or f[at.name] == name) and (not tenant or f[at.tenant] == tenant) then
    if what == 'remove' or (what == 'due' and f[at.state] == state) then
      matched = matched + 1
    elseif what == 'promote' then
      local run_at = f[at.run_at]
      if run_at and tonumber(run_at) > NOW_N then matched = matched + 1 end
    elseif what == 'requeue' then
      local lk = f[at.lk]
      if lk and not seen[lk] then
        seen[lk] = true
        keys[#keys + 1] = lk
      end
    end
  end
end
local out = {last / 2, page[last] or '', page[last - 1] or '', matched}
if #keys > 0 then
  -- One HMGET for the page's keys: the live check costs no call of its own per free row. A
  -- holder whose row vanished holds nothing (see live_holder).
  local holders = redis.call('HMGET', K_LIVE, unpack(keys))
  for i, lk in ipairs(keys) do
    if not holders[i] or redis.call('EXISTS', k_job(holders[i])) == 0 then
      out[#out + 1] = lk
    end
  end
end
return out

-- bulk: one operator action over the rows named, in the order given, until a budget is spent.
-- ARGV[4] action ("requeue", "remove" or "promote"), ARGV[5] state, then the optional filters
-- ARGV[6] queue, ARGV[7] name, ARGV[8] tenant, ARGV[9] how many rows may still move, then ids.
-- Answers {moved, seen}: the first `seen` ids were examined — all of them, unless the budget ran
-- out (then up to the row that spent it). What is left past them is counted by bulk_count.lua.
--
-- Each row is re-read and re-checked here, so ids listed from a page read a moment earlier
-- are safe: a row that changed state since is simply not matched. A row is checked on the
-- fields the filter names and loaded whole only when it moves.
local action, state = ARGV[4], ARGV[5]
local queue, name, tenant = optional(ARGV[6]), optional(ARGV[7]), optional(ARGV[8])
local budget = tonumber(ARGV[9])
local moved, seen, touched = 0, 0, {}
for i = 10, #ARGV do
  if moved >= budget then break end
  seen = seen + 1
  local id = ARGV[i]
  local f = redis.call('HMGET', k_job(id), 'state', 'queue', 'name', 'tenant', 'run_at', 'lk')
  if f[1] == state and (not queue or f[2] == queue) and (not name or f[3] == name)
      and (not tenant or f[4] == tenant) then
    if action == 'remove' then
      drop(load(id))
      moved = moved + 1
    elseif action == 'promote' then
      if tonumber(f[5]) > NOW_N then
        local row = load(id)
        row.run_at = NOW
        move(row, 'ready')
        touched[row.queue] = true
        moved = moved + 1
      end
    elseif not live_holder(f[6]) then
      local row = load(id)
      ready_again(row)
      touched[row.queue] = true
      moved = moved + 1
    end
  end
end
for q in pairs(touched) do announce(q) end
return {moved, seen}

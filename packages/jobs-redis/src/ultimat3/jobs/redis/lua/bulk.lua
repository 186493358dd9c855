-- bulk: one operator action over the rows named, in the order given, up to a budget.
-- ARGV[4] action ("requeue", "remove" or "promote"), ARGV[5] state, then the optional filters
-- ARGV[6] queue, ARGV[7] name, ARGV[8] tenant, ARGV[9] how many rows may still move, then ids.
-- Answers {moved, left, free live keys...}: `left` counts matching rows the budget left behind
-- (remove, promote); the free keys are those of matching rows requeue left behind whose key no
-- live row holds (a held row can never move, so it is not "remaining").
--
-- Each row is re-read and re-checked here, so ids listed from a page read a moment earlier
-- are safe: a row that changed state since is simply not matched.
local action, state = ARGV[4], ARGV[5]
local queue, name, tenant = optional(ARGV[6]), optional(ARGV[7]), optional(ARGV[8])
local budget = tonumber(ARGV[9])
local moved, left, free, touched = 0, 0, {}, {}
for i = 10, #ARGV do
  local id = ARGV[i]
  local f = redis.call('HMGET', k_job(id), 'state', 'queue', 'name', 'tenant')
  if f[1] == state and (not queue or f[2] == queue) and (not name or f[3] == name)
      and (not tenant or f[4] == tenant) then
    local row = load(id)
    if action == 'remove' then
      if moved < budget then
        drop(row)
        moved = moved + 1
      else
        left = left + 1
      end
    elseif action == 'promote' then
      if tonumber(row.run_at) > NOW_N then
        if moved < budget then
          row.run_at = NOW
          move(row, 'ready')
          touched[row.queue] = true
          moved = moved + 1
        else
          left = left + 1
        end
      end
    elseif redis.call('HEXISTS', K_LIVE, row.lk) == 0 then
      if moved < budget then
        ready_again(row)
        touched[row.queue] = true
        moved = moved + 1
      else
        free[#free + 1] = row.lk
      end
    end
  end
end
for q in pairs(touched) do announce(q) end
local out = {moved, left}
for _, lk in ipairs(free) do out[#out + 1] = lk end
return out

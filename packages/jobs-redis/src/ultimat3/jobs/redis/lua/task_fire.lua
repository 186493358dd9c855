-- task_fire: record that a task's occurrence dispatched; an older occurrence never overwrites a
-- newer one. ARGV[4] task, ARGV[5] occurrence (ms). The row is "<occurrence> <fired_at>".
local K_FIRES = B .. 'taskfires'
local held = redis.call('HGET', K_FIRES, ARGV[4])
if held and tonumber(string.match(held, '^(%-?%d+) ')) > tonumber(ARGV[5]) then return 0 end
redis.call('HSET', K_FIRES, ARGV[4], ARGV[5] .. ' ' .. NOW)
return 1

-- scheduler: per-task watermarks (the last occurrence dispatched or passed over) in one hash.
-- ARGV[4] action, ARGV[5] task, ARGV[6] occurrence (ms).
-- arm: move the watermark forward (never back) without firing. Answers 1.
-- fire: ARGV[7] the watermark the caller read ("" none), ARGV[8] the occurrence that dispatched
--   (ms), ARGV[9] = how many rows, then the rows as enqueue takes them. Moves the watermark from
--   that value to the occurrence, inserts the rows AND records the fire (as task_fire does), in
--   this one atomic call — or, when the watermark moved meanwhile (another node fired), does
--   nothing and answers false. Otherwise answers each row as enqueue does.
local K_MARKS = B .. 'watermarks'
local action, task, occurrence = ARGV[4], ARGV[5], ARGV[6]
local held = redis.call('HGET', K_MARKS, task)
if action == 'arm' then
  if not held or tonumber(occurrence) > tonumber(held) then
    redis.call('HSET', K_MARKS, task, occurrence)
  end
  return 1
end
if (held or '') ~= ARGV[7] then return false end
redis.call('HSET', K_MARKS, task, occurrence)
local out = {}
for i = 0, tonumber(ARGV[9]) - 1 do out[#out + 1] = insert_row(10 + i * ROW_ARGS) end
record_fire(task, ARGV[8])
return out

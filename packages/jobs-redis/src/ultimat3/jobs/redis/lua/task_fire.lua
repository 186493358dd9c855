-- task_fire: record that a task's occurrence dispatched (see record_fire). ARGV[4] task, ARGV[5]
-- occurrence (ms).
return record_fire(ARGV[4], ARGV[5])

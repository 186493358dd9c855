-- remove: delete one row and, when no other row shares its run, its steps. ARGV[4] job id.
-- Answers 1 (removed), 0 (no such row) or -1 (running: refused, nothing changed).
local row = load(ARGV[4])
if not row then return 0 end
if row.state == 'running' then return -1 end
drop(row)
return 1

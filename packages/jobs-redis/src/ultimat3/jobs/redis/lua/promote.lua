-- promote: a row waiting on its run_at (delayed, or ready and backing off) is due now.
-- ARGV[4] job id. Answers {"ok", row fields}, {"missing"} or {"waiting-not", state}.
local row = load(ARGV[4])
if not row then return {'missing'} end
if (row.state ~= 'delayed' and row.state ~= 'ready') or tonumber(row.run_at) <= NOW_N then
  return {'waiting-not', row.state}
end
row.run_at = NOW
move(row, 'ready')
announce(row.queue)
return {'ok', redis.call('HGETALL', k_job(ARGV[4]))}

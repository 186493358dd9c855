-- settle: acks and nacks of many rows in one call, each fenced on its own claim.
-- ARGV[4] = how many settles; then 9 fields each: id, worker id, claim token, target state,
-- counter kind ("" none), duration ms ("" none), error (optional: "" or "=" .. text), run_at (""
-- keeps it), count_attempt ("1"/"0"). Answers 1 (landed) or 0 (the claim no longer holds the
-- row) per settle, in order.
--
-- Guarantees (atomic per call): a settle lands only while its row is running under exactly that
-- worker and claim; then the row moves to its target, the attempt is handed back when not
-- counted, and the per-job counter moves in this same call. Rows of the settled queues whose
-- done TTL passed are swept.
local SWEEP_LIMIT = 200
local n = tonumber(ARGV[4])
local out, queues = {}, {}
for i = 0, n - 1 do
  local a = 5 + i * 9
  local id = ARGV[a]
  local jk = k_job(id)
  local f = redis.call('HMGET', jk, 'state', 'worker', 'claim', 'name')
  if f[1] ~= 'running' or f[2] ~= ARGV[a + 1] or f[3] ~= ARGV[a + 2] then
    out[#out + 1] = 0
  else
    local row = load(id)
    if ARGV[a + 8] == '0' then redis.call('HINCRBY', jk, 'attempt', -1) end
    local err = ARGV[a + 6]
    if err ~= '' then redis.call('HSET', jk, 'error', string.sub(err, 2)) end
    if ARGV[a + 7] ~= '' then row.run_at = ARGV[a + 7] end
    move(row, ARGV[a + 3])
    if ARGV[a + 4] ~= '' then count(f[4], ARGV[a + 4], ARGV[a + 5]) end
    queues[row.queue] = true
    out[#out + 1] = 1
  end
end
for q in pairs(queues) do sweep(q, SWEEP_LIMIT) end
return out

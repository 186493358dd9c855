-- settle: acks and nacks of many rows in one call, each fenced on its own claim.
-- ARGV[4] = how many settles; then each is
--   "a", id, worker id, claim token, duration ms ("" none)                       (an ack), or
--   "n", id, worker id, claim token, target state, counter kind ("" none), duration ms ("" none),
--        error (optional), run_at ("" keeps it), count_attempt ("1"/"0")        (a nack).
-- Answers 1 (landed) or 0 (the claim no longer holds the row) per settle, in order; an ack
-- that landed before under the same claim answers 1 again, so a batch of acks may be repeated.
--
-- Guarantees (atomic per call): a settle lands only while its row is running under exactly that
-- worker and claim; then the row moves to its target (an ack: done), the attempt is handed back
-- when not counted, and the per-job counter moves in this same call. Rows of the settled queues
-- whose done TTL passed are swept: per queue at least SWEEP_LIMIT, and two for each settle of
-- that queue, so a busy queue's expired rows go faster than its new ones finish.
local SWEEP_LIMIT = 200
local out, queues = {}, {}
local a = 5
for _ = 1, tonumber(ARGV[4]) do
  local ack = ARGV[a] == 'a'
  local row = load(ARGV[a + 1])
  if not owned(row, ARGV[a + 2], ARGV[a + 3]) then
    -- A done row keeps the claim whose ack moved it there (the only way in): an ack sent again
    -- under that claim answers 1 again and changes nothing.
    local again = ack and row ~= nil and row.state == 'done' and row.claim == ARGV[a + 3]
    out[#out + 1] = again and 1 or 0
  elseif ack then
    move(row, 'done')
    count(row.name, 'done', ARGV[a + 4])
    out[#out + 1] = 1
  else
    local extra = {}
    if ARGV[a + 9] == '0' then extra = {'attempt', row.attempt - 1} end
    local err = optional(ARGV[a + 7])
    if err then
      extra[#extra + 1] = 'error'
      extra[#extra + 1] = err
    end
    if ARGV[a + 8] ~= '' then row.run_at = ARGV[a + 8] end
    move(row, ARGV[a + 4], extra)
    if ARGV[a + 5] ~= '' then count(row.name, ARGV[a + 5], ARGV[a + 6]) end
    out[#out + 1] = 1
  end
  if row then queues[row.queue] = (queues[row.queue] or 0) + 1 end
  if ack then a = a + 5 else a = a + 10 end
end
flush_counts()
for q, settled in pairs(queues) do sweep(q, math.max(SWEEP_LIMIT, 2 * settled)) end
return out

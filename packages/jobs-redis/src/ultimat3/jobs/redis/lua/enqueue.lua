-- enqueue: insert rows, or answer the row already there.
-- ARGV[4] = how many rows; then 12 fields per row: id, run_id, name, queue, input, key, tenant,
-- max_attempts, run_at, enqueued_by, traceparent, live key. Optional fields are "" for None and
-- "=" .. value otherwise. Answers {id, run_id, deduped} per row, in order.
--
-- Guarantees (atomic): an id that names ANY row inserts nothing; a live row (ready, delayed,
-- running, suspended) holding (name, tenant or '', key) inserts nothing; both answer that row.
-- A row due within a second is announced on the wake channel, unless an announcement for its
-- queue is still unclaimed (no claim has read the queue since): one wake per claim, not per row.
local n = tonumber(ARGV[4])
local out = {}
for i = 0, n - 1 do out[#out + 1] = insert_row(5 + i * ROW_ARGS) end
return out

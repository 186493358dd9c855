-- claim: hand out due rows of the asked queues, each under a fresh claim token.
-- ARGV[4] worker id, ARGV[5] claim token base, ARGV[6] lease_until, ARGV[7] the last_error of a
-- buried row, ARGV[8] = how many queues, then (queue, free slots) pairs, then how many names
-- are in drop_exhausted, then those names.
-- Answers {claimed, exhausted}: each claimed row as {CLAIMED_FIELDS values, step fields}, each
-- buried row as its EXHAUSTED_FIELDS values after the burial (the orders codec.py reads).
--
-- Guarantees (atomic): per queue in the order asked, skipping paused queues, up to `free` rows
-- due now (ready, delayed or suspended with run_at <= now; running rows whose lease lapsed) in
-- (run_at, id) order each become running with attempt + 1. A lapsed row already at its last
-- attempt is never handed out: it is buried dead (failed when its name is in drop_exhausted),
-- counted, and reported once. Reads two sorted sets per queue, never a scan: up to `free` due
-- rows, and the lapsed rows — at most LAPSED_LIMIT a call, the longest lapsed first, so a mass
-- lapse (a fleet crash) costs each claim a bounded read; the order above then holds among them.
local SWEEP_LIMIT = 200
local LAPSED_LIMIT = 1000
local worker, base, lease_until, lapsed_error = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local nq = tonumber(ARGV[8])
local drop = {}
local nd_at = 9 + nq * 2
for i = 1, tonumber(ARGV[nd_at]) do drop[ARGV[nd_at + i]] = true end

local function before(x, y)
  if x[1] ~= y[1] then return x[1] < y[1] end
  return bytes_lt(x[2], y[2])
end

-- A claimed row is answered as CLAIMED_FIELDS, in this order (codec.read_claimed reads it):
-- id, run_id, name, queue, input, key, tenant, attempt, max, run_at, created, lease, worker,
-- claim, by, trace. The fields `load` does not read anyway come in its same call.
local CLAIM_MORE = {'input', 'key', 'tenant', 'by', 'trace'}
local EXHAUSTED_FIELDS = {'id', 'run_id', 'name', 'queue', 'input', 'tenant', 'attempt', 'max',
  'state'}
local claimed, exhausted = {}, {}
local seq = 0

local function take(row)
  seq = seq + 1
  local claim, attempt = base .. '.' .. seq, row.attempt + 1
  move(row, 'running', {'attempt', attempt, 'worker', worker, 'claim', claim, 'lease', lease_until})
  redis.call('ZADD', k_lease(row.queue), lease_until, row.id)
  local m = row.more
  claimed[#claimed + 1] = {
    {row.id, row.run_id, row.name, row.queue, m[1], m[2], m[3], attempt, row.max, row.run_at,
     row.created, lease_until, worker, claim, m[4], m[5]},
    redis.call('HGETALL', k_steps(row.run_id))}
end

local function bury(row)
  local kind = 'dead'
  if drop[row.name] then kind = 'failed' end
  move(row, kind, {'error', lapsed_error})
  count(row.name, kind, nil)
  exhausted[#exhausted + 1] = redis.call('HMGET', k_job(row.id), unpack(EXHAUSTED_FIELDS))
end

for qi = 0, nq - 1 do
  local q, free = ARGV[9 + qi * 2], tonumber(ARGV[10 + qi * 2])
  if free > 0 and redis.call('SISMEMBER', K_PAUSED, q) == 0 then
    redis.call('DEL', k_woken(q))
    sweep(q, SWEEP_LIMIT)
    local due = redis.call('ZRANGEBYSCORE', k_due(q), '-inf', NOW, 'WITHSCORES', 'LIMIT', 0, free)
    local lapsed = {}
    local lapsed_ids = redis.call('ZRANGEBYSCORE', k_lease(q), '-inf', NOW, 'LIMIT', 0,
      LAPSED_LIMIT + free)
    for _, id in ipairs(lapsed_ids) do
      local row = load(id, CLAIM_MORE)
      lapsed[#lapsed + 1] = {tonumber(row.run_at), id, row}
    end
    table.sort(lapsed, before)
    local i, j, taken = 1, 1, 0
    while taken < free do
      local d, l = nil, lapsed[j]
      if due[i] then d = {tonumber(due[i + 1]), due[i]} end
      if not d and not l then break end
      if l and (not d or before(l, d)) then
        j = j + 1
        if l[3].attempt >= l[3].max then
          bury(l[3])
        else
          take(l[3])
          taken = taken + 1
        end
      else
        i = i + 2
        take(load(d[2], CLAIM_MORE))
        taken = taken + 1
      end
    end
  end
end
flush_counts()
return {claimed, exhausted}

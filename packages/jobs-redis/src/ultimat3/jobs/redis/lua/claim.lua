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
-- counted, and reported once. Reads sorted sets, never a scan: up to `free` due rows, and the
-- lapsed rows a window of LAPSED_LIMIT + free at a time, the longest lapsed first, so a mass
-- lapse (a fleet crash) costs a claim that fills its slots one bounded read. The order above
-- holds among the due rows and the lapsed rows of that window. When the slots are not filled,
-- every row of the window was taken or buried, and the next window is read, up to
-- LAPSED_WINDOWS per queue: a queue that cannot fill its slots has every lapsed row examined,
-- and each one on its last attempt buried, up to LAPSED_WINDOWS * (LAPSED_LIMIT + free) rows;
-- the next claim goes on from there. The bound keeps one call short: a burial costs ~80 us
-- (measured, Redis 7.0), so five windows hold the server under half a second.
-- An index entry whose row's hash is gone (evicted, deleted by hand) is dropped and passed over.
-- Expired done rows are swept from each queue claimed and from one more queue picked at random
-- (so a queue nobody claims from any more loses them too).
local SWEEP_LIMIT = 200
local LAPSED_LIMIT = 1000
local LAPSED_WINDOWS = 5
local worker, base, lease_until, lapsed_error = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local nq = tonumber(ARGV[8])
local dropped = {}
local nd_at = 9 + nq * 2
for i = 1, tonumber(ARGV[nd_at]) do dropped[ARGV[nd_at + i]] = true end

local function before(x, y)
  if x[1] ~= y[1] then return x[1] < y[1] end
  return bytes_lt(x[2], y[2])
end

-- An id's byte order as numbers, six bytes to a number (each byte + 1, base 257; a missing byte
-- is 0, so a prefix sorts first): sorting a window whose rows share run_at (an enqueue_many)
-- compares a few numbers per pair instead of looping over bytes, which took most of its time.
local function byte_key(id)
  local key = {}
  for i = 1, #id, 6 do
    local bytes, v = {string.byte(id, i, i + 5)}, 0  -- six at a time: unpack-sized for any id
    for k = 1, 6 do v = v * 257 + (bytes[k] or -1) + 1 end
    key[#key + 1] = v
  end
  return key
end

local function sooner(x, y)  -- `before`, with each entry's byte_key made when a tie needs it
  if x[1] ~= y[1] then return x[1] < y[1] end
  local a, b = x[3], y[3]
  if not a then a = byte_key(x[2]); x[3] = a end
  if not b then b = byte_key(y[2]); y[3] = b end
  for i = 1, math.max(#a, #b) do
    local p, q = a[i] or 0, b[i] or 0
    if p ~= q then return p < q end
  end
  return false
end

-- A claimed row is answered as CLAIMED_FIELDS, in this order (codec.read_claimed reads it):
-- id, run_id, name, queue, input, key, tenant, attempt, max, run_at, created, lease, worker,
-- claim, by, trace. The fields `load` does not read anyway come in its same call.
local CLAIM_MORE = {'input', 'key', 'tenant', 'by', 'trace'}
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

-- A buried row is marked with this worker and the claim's token base, and listed under that
-- base: how claimed.lua finds it when this reply is lost, and how a nack of the row's previous
-- holder, read back after its own reply was lost, sees that it did not land.
local buried_key, buried_ttl = k_buried(base), nil
local function bury(row)
  local kind = 'dead'
  if dropped[row.name] then kind = 'failed' end
  move(row, kind, {'error', lapsed_error, 'worker', worker, 'claim', base})
  count(row.name, kind, nil)
  exhausted[#exhausted + 1] = redis.call('HMGET', k_job(row.id), unpack(EXHAUSTED_FIELDS))
  redis.call('RPUSH', buried_key, row.id)
  if not buried_ttl then
    buried_ttl = math.max(1000, math.floor((tonumber(lease_until) - NOW_N) / 1000))
    redis.call('PEXPIRE', buried_key, buried_ttl)
  end
end

-- A row taken here leaves the lapsed range only when its new lease ends after now; a window is
-- read again from the start only then.
local pages = tonumber(lease_until) > NOW_N
local swept = {}

for qi = 0, nq - 1 do
  local q, free = ARGV[9 + qi * 2], tonumber(ARGV[10 + qi * 2])
  if free > 0 and redis.call('SISMEMBER', K_PAUSED, q) == 0 then
    redis.call('DEL', k_woken(q))
    sweep(q, SWEEP_LIMIT)
    swept[q] = true
    local due = redis.call('ZRANGEBYSCORE', k_due(q), '-inf', NOW, 'WITHSCORES', 'LIMIT', 0, free)
    local window = LAPSED_LIMIT + free
    local i, taken, read, windows = 1, 0, 0, 0
    repeat
      windows = windows + 1
      -- The window is ordered on run_at alone; a lapsed row is loaded whole only when its turn
      -- comes. While lapsed rows wait behind older ready ones, every claim reads the window
      -- again, and loading each row of it made such a claim 50x a plain one.
      local lapsed = {}
      local lapsed_ids = redis.call('ZRANGEBYSCORE', k_lease(q), '-inf', NOW, 'LIMIT', 0, window)
      read = #lapsed_ids
      for _, id in ipairs(lapsed_ids) do
        local run_at = redis.call('HGET', k_job(id), 'run_at')
        if run_at then
          lapsed[#lapsed + 1] = {tonumber(run_at), id}
        else
          forget_vanished(q, id)
        end
      end
      table.sort(lapsed, sooner)
      local j = 1
      while taken < free do
        local d, l = nil, lapsed[j]
        if due[i] then d = {tonumber(due[i + 1]), due[i]} end
        if not d and not l then break end
        if l and (not d or before(l, d)) then
          j = j + 1
          local row = load(l[2], CLAIM_MORE)
          if row.attempt >= row.max then
            bury(row)
          else
            take(row)
            taken = taken + 1
          end
        else
          i = i + 2
          local row = load(d[2], CLAIM_MORE)
          if row then
            take(row)
            taken = taken + 1
          else
            forget_vanished(q, d[2])
          end
        end
      end
    until taken >= free or read < window or not pages or windows == LAPSED_WINDOWS
  end
end
if DONE_TTL > 0 then
  local other = redis.call('SRANDMEMBER', K_QUEUES)
  if other and not swept[other] then sweep(other, SWEEP_LIMIT) end
end
flush_counts()
return {claimed, exhausted}

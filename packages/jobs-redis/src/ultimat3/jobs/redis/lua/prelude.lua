-- Shared by every script: prepended to each one before it is loaded (see scripts.py).
--
-- Conventions every script keeps:
--   KEYS[1] is the namespace base, "{<prefix>}:". Every key a script touches is built from it, so
--   every key carries the same {hash tag} and lands in ONE cluster slot.
--   ARGV[1] is now in microseconds since the epoch on the DRIVER's clock, ARGV[2] the done-row
--   TTL in microseconds ("0": kept), ARGV[3] the counter field prefix of now's 1-minute bucket.
--   Times are integer microseconds kept as STRINGS in hashes (Lua's tostring would round them);
--   they are compared with tonumber(), exact below 2^53 (the year 2255).
--   Job inputs, step outputs and progress are JSON written by Python and never decoded here.

local B = KEYS[1]
local NOW = ARGV[1]
local NOW_N = tonumber(ARGV[1])
local DONE_TTL = tonumber(ARGV[2])
local CTR_BUCKET = ARGV[3]

local K_LIVE = B .. 'live'          -- hash: live key -> id of the live row holding it
local K_CREATED = B .. 'created'    -- zset: every row, score created_at, so (created_at, id) order
local K_QUEUES = B .. 'queues'      -- set: queues holding at least one row
local K_RUNS = B .. 'runs'          -- hash: run id -> rows sharing it (steps go with the last)
local K_PAUSED = B .. 'paused'      -- set: paused queues, read by the claim itself
local K_CTR_NAMES = B .. 'ctrnames' -- set: job names with counter buckets
local K_WAKE = B .. 'wake'          -- pub/sub channel: the queue name of a row worth waking for

local STATES = {'ready', 'delayed', 'running', 'suspended', 'done', 'failed', 'dead', 'cancelled'}
local LIVE = {ready = true, delayed = true, running = true, suspended = true}
local DUE = {ready = true, delayed = true, suspended = true}
local WAKE_HOLD_MS = 1000

local function k_job(id) return B .. 'job:' .. id end
local function k_steps(run) return B .. 'steps:' .. run end
local function k_ctr(name) return B .. 'ctr:' .. name end
-- Beside each counter hash: the index of its buckets (zset, member "<width>:<start>", score
-- `ctr_score`), and how many of the hash's fields that index accounts for (string). A rollup
-- reads the index, never the whole hash (see counters_due.lua).
local function k_ctr_index(name) return B .. 'ctridx:' .. name end
local function k_ctr_len(name) return B .. 'ctrlen:' .. name end
-- Per queue: one zset per state (score created_at), the due index (score run_at), the lease
-- index (score lease_until), the expiry index of done rows (score finished_at) and the wake flag.
local function k_state(q, s) return B .. 'q:' .. q .. ':s:' .. s end
local function k_due(q) return B .. 'q:' .. q .. ':due' end
local function k_lease(q) return B .. 'q:' .. q .. ':lease' end
local function k_expiry(q) return B .. 'q:' .. q .. ':expiry' end
local function k_woken(q) return B .. 'q:' .. q .. ':woken' end
-- The ids a claim buried (list, in burial order), under that claim's token base. It outlives
-- the claim by the claim's lease at most: long enough for a claim whose reply was lost to read
-- its burials back (claimed.lua), and nothing indexes it, so its server-side expiry is safe.
local function k_buried(base) return B .. 'buried:' .. base end
-- A buried row as claim.lua and claimed.lua answer it (the order codec.read_exhausted reads).
local EXHAUSTED_FIELDS = {'id', 'run_id', 'name', 'queue', 'input', 'tenant', 'attempt', 'max',
  'state'}

-- Byte order, as Python compares str and a sorted set orders members (Lua's < uses strcoll).
local function bytes_lt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- How many members of the sorted set `key` sort before the position (score, member), counting
-- a member at it when `inclusive`: a page starts there, so a page stays right while the rows
-- before it move or go, and the position need not be a member any more. The members at `score`
-- hold the ranks [ZCOUNT below it, ZCOUNT up to it), in member byte order, and a binary search
-- over those ranks finds the place: O(log^2 n) even when every member shares one score (rows
-- created on a frozen clock). Reads only.
local function rank_of(key, score, member, inclusive)
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  local hi = redis.call('ZCOUNT', key, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local at = redis.call('ZRANGE', key, mid, mid)[1]
    if bytes_lt(at, member) or (inclusive and at == member) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- An expiry member names the row AND its run, so a row whose hash already expired is still
-- swept cleanly (its run's step count is released too).
local function expiry_member(id, run) return #id .. ':' .. id .. run end
local function expiry_parse(member)
  local n, rest = string.match(member, '^(%d+):(.*)$')
  n = tonumber(n)
  return string.sub(rest, 1, n), string.sub(rest, n + 1)
end

-- Counter moves are gathered per script call and written once per (job, kind) by
-- `flush_counts`, so a batch of a hundred settles of one job costs three writes, not three hundred.
local COUNTS = {}
local function count(name, kind, duration)
  local per = COUNTS[name]
  if not per then
    per = {}
    COUNTS[name] = per
  end
  per[kind] = (per[kind] or 0) + 1
  if duration ~= nil and duration ~= '' then per.ms = (per.ms or 0) + tonumber(duration) end
end

-- A bucket's index score: its width * CTR_TIER + its start (seconds, below CTR_TIER until the
-- year 2286), so each tier is a score range of its own, ordered by start.
local CTR_TIER = 10000000000
local function ctr_score(bucket)
  local width, start = string.match(bucket, '^(%d+):(%d+)$')
  return string.format('%d', tonumber(width) * CTR_TIER + tonumber(start))
end

-- A HINCRBY answering exactly n created its field: the bucket goes into the index (again, for
-- a second kind) and the field count moves. (A field found at 0 counts twice: the next rollup
-- sees the count off and indexes the hash again.)
local function flush_counts()
  for name, per in pairs(COUNTS) do
    for kind, n in pairs(per) do
      if n ~= 0 and redis.call('HINCRBY', k_ctr(name), CTR_BUCKET .. ':' .. kind, n) == n then
        redis.call('ZADD', k_ctr_index(name), ctr_score(CTR_BUCKET), CTR_BUCKET)
        redis.call('INCR', k_ctr_len(name))
      end
    end
    redis.call('SADD', K_CTR_NAMES, name)
  end
end

-- Change a row's state, keeping every index true. `row` holds id, queue, created, lk, run_id,
-- state (the state it is leaving) and run_at (written, and the due score, when `to` is a due
-- state); `extra` (optional) is more field/value pairs written in the same HSET. A row leaving
-- running keeps its worker/claim/lease fields: they mean nothing outside running (every fence
-- checks the state first, and rows are read without them).
local function move(row, to, extra)
  local id, q, from = row.id, row.queue, row.state
  local jk = k_job(id)
  if from ~= to then
    redis.call('ZREM', k_state(q, from), id)
    redis.call('ZADD', k_state(q, to), row.created, id)
  end
  if DUE[to] then
    redis.call('ZADD', k_due(q), row.run_at, id)
  elseif DUE[from] then
    redis.call('ZREM', k_due(q), id)
  end
  if from == 'running' and to ~= 'running' then redis.call('ZREM', k_lease(q), id) end
  if from == 'done' and to ~= 'done' then
    redis.call('ZREM', k_expiry(q), expiry_member(id, row.run_id))
  end
  -- A live row always holds its own live key: every insert and requeue takes the key only when
  -- no live row holds it.
  if LIVE[from] and not LIVE[to] then
    redis.call('HDEL', K_LIVE, row.lk)
  elseif LIVE[to] and not LIVE[from] then
    redis.call('HSET', K_LIVE, row.lk, id)
  end
  local set = extra or {}
  set[#set + 1] = 'state'
  set[#set + 1] = to
  set[#set + 1] = 'updated'
  set[#set + 1] = NOW
  if DUE[to] then
    set[#set + 1] = 'run_at'
    set[#set + 1] = row.run_at
  elseif not LIVE[to] then
    set[#set + 1] = 'finished'
    set[#set + 1] = NOW
  end
  redis.call('HSET', jk, unpack(set))
  -- A done row is removed by `sweep`, on the driver's clock. No key carries a server TTL: the
  -- server's clock would decide instead, and a hash vanishing on its own would leave its
  -- indexes behind, under an id that may be enqueued again. The row is indexed by its finish
  -- time under done_ttl=0 too: the TTL is the sweeping driver's, so one started later with a
  -- TTL removes it like any other (unindexed, it was kept forever).
  if to == 'done' then
    redis.call('ZADD', k_expiry(q), NOW, expiry_member(id, row.run_id))
  end
  row.state = to
end

-- The row fields `move` and the fences need, or nil when the row does not exist.
-- `more` (optional) names further fields, read in the same call into row.more in that order.
local LOAD_FIELDS = {'state', 'queue', 'created', 'lk', 'run_id', 'run_at', 'attempt', 'max', 'name',
  'worker', 'claim'}
local function load(id, more)
  local names = LOAD_FIELDS
  if more then
    names = {unpack(LOAD_FIELDS)}
    for _, name in ipairs(more) do names[#names + 1] = name end
  end
  local f = redis.call('HMGET', k_job(id), unpack(names))
  if not f[1] then return nil end
  local row = {id = id, state = f[1], queue = f[2], created = f[3], lk = f[4], run_id = f[5],
               run_at = f[6], attempt = tonumber(f[7]), max = tonumber(f[8]), name = f[9],
               worker = f[10], claim = f[11]}
  if more then row.more = {unpack(f, #LOAD_FIELDS + 1, #names)} end
  return row
end

-- Whether `row` is running under exactly this worker and claim: the fence of every write a run
-- makes after its claim.
local function owned(row, worker, claim)
  return row ~= nil and row.state == 'running' and row.worker == worker and row.claim == claim
end

-- Release one row's share of its run: the steps go when no row names the run any more.
local function release_run(run)
  if redis.call('HINCRBY', K_RUNS, run, -1) <= 0 then
    redis.call('HDEL', K_RUNS, run)
    redis.call('DEL', k_steps(run))
  end
end

local function forget_queue_if_empty(q)
  local keys = {}
  for i, s in ipairs(STATES) do keys[i] = k_state(q, s) end
  if redis.call('EXISTS', unpack(keys)) == 0 then redis.call('SREM', K_QUEUES, q) end
end

-- Delete one row (any state) and everything that indexes it.
local function drop(row)
  local id, q = row.id, row.queue
  redis.call('ZREM', k_state(q, row.state), id)
  redis.call('ZREM', k_due(q), id)
  redis.call('ZREM', k_lease(q), id)
  redis.call('ZREM', k_expiry(q), expiry_member(id, row.run_id))
  redis.call('ZREM', K_CREATED, id)
  if LIVE[row.state] and redis.call('HGET', K_LIVE, row.lk) == id then
    redis.call('HDEL', K_LIVE, row.lk)
  end
  redis.call('DEL', k_job(id))
  release_run(row.run_id)
  forget_queue_if_empty(q)
end

-- What a row whose hash vanished (evicted under a maxmemory policy other than noeviction, or
-- deleted behind the driver's back) left in queue `q`'s indexes: removed, so a claim reading
-- them goes on past it instead of failing every call. Called only when `id` names no row, so no
-- other row's entries go with them. Its live key is free: see `live_holder`.
local function forget_vanished(q, id)
  redis.call('ZREM', k_due(q), id)
  redis.call('ZREM', k_lease(q), id)
  for _, s in ipairs(STATES) do redis.call('ZREM', k_state(q, s), id) end
  redis.call('ZREM', K_CREATED, id)
end

-- The id of the live row holding live key `lk`, or nil: nil too when the row the key names has
-- vanished (see forget_vanished), whose key is then free for whoever takes it next.
local function live_holder(lk)
  local holder = redis.call('HGET', K_LIVE, lk)
  if holder and redis.call('EXISTS', k_job(holder)) == 1 then return holder end
  return nil
end

-- Remove up to `limit` done rows of queue `q` whose TTL passed on the driver's clock. Called by
-- every claim and settle that touches the queue (a settle sweeps two rows for each it settles,
-- so removal keeps pace with completion), and by each claim for one more queue picked at random.
-- An expiry entry names a row AND its run; the row goes only while it is still exactly that done
-- row. Should the id name another row by then (its hash removed behind the driver's back and the
-- id enqueued again), that row is left whole: only what the vanished row left behind goes (its
-- entry in the done index, its share of its run).
local function sweep(q, limit)
  if DONE_TTL <= 0 then return end
  local cutoff = string.format('%d', NOW_N - DONE_TTL)
  local members = redis.call('ZRANGEBYSCORE', k_expiry(q), '-inf', cutoff, 'LIMIT', 0, limit)
  for _, member in ipairs(members) do
    local id, run = expiry_parse(member)
    redis.call('ZREM', k_expiry(q), member)
    local f = redis.call('HMGET', k_job(id), 'state', 'run_id', 'queue')
    local done_here = f[1] == 'done' and f[3] == q
    if not f[1] or (done_here and f[2] == run) then
      redis.call('ZREM', k_state(q, 'done'), id)
      redis.call('ZREM', K_CREATED, id)
      redis.call('DEL', k_job(id))
    elseif not done_here then
      redis.call('ZREM', k_state(q, 'done'), id)
    end
    release_run(run)
  end
  if #members > 0 then forget_queue_if_empty(q) end
end

local function announce(q)
  redis.call('PUBLISH', K_WAKE, q)
end

-- A finished row back in its queue: due now, attempt 0, no error, progress or finish time.
local function ready_again(row)
  local jk = k_job(row.id)
  redis.call('HSET', jk, 'attempt', 0)
  -- Due now; a row cancelled while it ran, once that run is over (cancel.lua's `stops`).
  local stops = redis.call('HGET', jk, 'stops')
  row.run_at = NOW
  if stops and tonumber(stops) > NOW_N then row.run_at = stops end
  -- A fresh row: no run it had is its own any more, so a late settle of one reads its nack
  -- as not landed (driver.py's read-back compares these fields).
  redis.call('HDEL', jk, 'error', 'progress', 'stops', 'worker', 'claim')
  move(row, 'ready')
  redis.call('HDEL', jk, 'finished')
end

-- An optional argument: "" is None, "=" .. value is value.
local function optional(value)
  if value == '' then return nil end
  return string.sub(value, 2)
end

-- Insert the row whose ROW_ARGS fields start at ARGV[a], or answer the row already there:
-- id, run_id, name, queue, input, key, tenant, max_attempts, run_at, enqueued_by, traceparent,
-- live key (optional ones as `optional` reads them). Answers {id, run_id, deduped 0/1}.
-- An id that names ANY row inserts nothing; nor does a live row holding the live key. A row due
-- within a second is announced, unless an announcement for its queue is still unclaimed.
local ROW_ARGS = 12
local WAKE_DUE_US = 1000000
local function insert_row(a)
  local id, run, name, q = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local lk = ARGV[a + 11]
  local jk = k_job(id)
  local held = redis.call('HGET', jk, 'run_id')
  if held then return {id, held, 1} end
  -- Takes the live key, or finds it held: one command for the check and the write.
  if redis.call('HSETNX', K_LIVE, lk, id) == 0 then
    local holder = redis.call('HGET', K_LIVE, lk)
    local holder_run = redis.call('HGET', k_job(holder), 'run_id')
    if holder_run then return {holder, holder_run, 1} end
    redis.call('HSET', K_LIVE, lk, id)  -- its holder vanished (see forget_vanished): the key is free
  end
  local run_at = ARGV[a + 8]
  local state = 'ready'
  if tonumber(run_at) > NOW_N then state = 'delayed' end
  local row = {'id', id, 'run_id', run, 'name', name, 'queue', q, 'state', state,
    'input', ARGV[a + 4], 'key', ARGV[a + 5], 'attempt', 0, 'max', ARGV[a + 7],
    'run_at', run_at, 'created', NOW, 'updated', NOW, 'lk', lk}
  for field, at in pairs({tenant = a + 6, by = a + 9, trace = a + 10}) do
    local value = optional(ARGV[at])
    if value then
      row[#row + 1] = field
      row[#row + 1] = value
    end
  end
  redis.call('HSET', jk, unpack(row))
  redis.call('ZADD', k_due(q), run_at, id)
  redis.call('ZADD', k_state(q, state), NOW, id)
  redis.call('ZADD', K_CREATED, NOW, id)
  redis.call('SADD', K_QUEUES, q)
  redis.call('HINCRBY', K_RUNS, run, 1)
  if tonumber(run_at) - NOW_N <= WAKE_DUE_US
      and redis.call('SET', k_woken(q), '1', 'NX', 'PX', WAKE_HOLD_MS) then
    announce(q)
  end
  return {id, run, 0}
end

-- Record that `task`'s occurrence (ms, a string) dispatched, fired now; an older occurrence
-- never overwrites a newer one. The record is "<occurrence> <fired_at>". Answers 1, or 0 when a
-- newer occurrence is recorded already.
local K_FIRES = B .. 'taskfires'
local function record_fire(task, occurrence)
  local held = redis.call('HGET', K_FIRES, task)
  if held and tonumber(string.match(held, '^(%-?%d+) ')) > tonumber(occurrence) then return 0 end
  redis.call('HSET', K_FIRES, task, occurrence .. ' ' .. NOW)
  return 1
end

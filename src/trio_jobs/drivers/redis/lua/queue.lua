-- The Redis driver's scripts: every multi-key change is one of these, atomic by
-- itself (Redis runs a script to the end before any other command).
--
-- Each named script starts at a `-- name:` line and runs to the next one; the
-- `prelude` is prepended to every other script. Every script takes the same
-- four leading arguments: ARGV[1] the key prefix, ARGV[2] a test clock's now
-- ('' in production: the server's own TIME decides), ARGV[3] / ARGV[4] how long
-- a done / a dead, failed or cancelled row is kept (seconds; a done retention
-- of 0 keeps no done rows: see UNKEPT in the prelude). Its own arguments
-- start at ARGV[A]. Times are float seconds, kept in hashes as '%.6f' strings
-- (a Lua number returned to Redis would be truncated to an integer).
--
-- Every script checks its arguments before its first write: Redis does not
-- roll a script back, so a script that failed half way (a NaN score, say) would
-- leave half a row behind. A refusal is an error reply whose first word is the
-- code ('X_INVARIANT <what>', 'X_JOB_INPUT_INVALID <what>'); the driver maps it
-- in one place (_client.translate). The facade refuses the same values first
-- (_validate.py): these checks hold for a caller below it.
--
-- Keys (P is the prefix):
--   P:schema                 the key-schema version
--   P:job:<id>               a row (hash)
--   P:steps:<id>             its step records: name -> '<seq>\n<json>' (a row
--                            stored with 'ns' = 1 has none: put_step clears it)
--   P:live                   hash: live key (name, tenant, idempotency key) -> id
--   P:ready:<queue>          due rows: score = priority, member = '<run_at ms><seq><id>'
--                            (equal scores sort by member: oldest due first)
--   P:sched:<queue>          rows not yet due: score = run_at, member = id
--   P:running                claimed rows: score = lease expiry, member = id
--   P:queues                 every queue seen; P:count:<queue> live rows per state
--   P:term:<queue>:<state>   terminal rows: score = when the row expires, member = id
--   P:waiting:<event>        suspended rows waiting for an event
--   P:events:<event>         score = published_at, member = '<event id>\n<payload>'
--   P:paused                 paused queues
--   P:cnt, P:cnt:<bucket>    counters per minute bucket ('<name>\n<field>' -> n, and
--                            '<name>\nqueue' -> the queue its job settled in)
--   P:lease:<key>:<slot>     a held concurrency slot: 'job\nworker\nclaim\nexpires'
--   P:lslots:<key>, P:jl:<id>  the slots of one lease key / held by one job
--   P:busy:<key>             runs waiting on a busy lease key: score = priority,
--                            member = '<seq>' .. id (see wake_waiter)
--   P:wake                   the pub/sub channel; the message is a queue name
--   P:rate:<len>:<name>:<key>  a rate limiter's window: score = when an acquisition
--                            was granted, member = '<score>:<seq>' (see rate_acquire)
--   P:rate:seq               the counter that keeps those members apart

-- name: prelude
-- The range every driver accepts (_validate.py, _time.py): instants from 1970
-- to the end of 9999, durations up to 100 years, 32-bit priorities.
local MAX_EPOCH = 253402300799
local MAX_DURATION = 3155760000
local MAX_PRIORITY = 2147483647

-- A number that is not NaN or infinite, or nil.
local function finite(v)
  local x = tonumber(v)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then return nil end
  return x
end

-- A whole number written as digits (an optional minus), or nil.
local function whole(v)
  if type(v) ~= 'string' or not string.match(v, '^%-?%d+$') then return nil end
  return tonumber(v)
end

-- Each check answers what is wrong with an argument, or nil.
local function need(v, name)
  if v == nil or v == '' then return name .. ' is missing' end
  return nil
end

local function need_whole(v, name, lo, hi)
  local x = whole(v)
  if x == nil or (lo and x < lo) or (hi and x > hi) then
    return name .. ' must be a whole number' ..
      (lo and hi and (' from ' .. lo .. ' to ' .. hi) or (lo and (' of at least ' .. lo) or ''))
  end
  return nil
end

local function need_positive(v, name)
  local x = finite(v)
  if x == nil or x <= 0 or x > MAX_DURATION then
    return name .. ' must be a positive number of seconds, at most 100 years'
  end
  return nil
end

-- A retention: 0 (keep no such row) or a positive number of seconds.
local function need_retention(v, name)
  local x = finite(v)
  if x == nil or x < 0 or x > MAX_DURATION then
    return name .. ' must be 0 or a positive number of seconds, at most 100 years'
  end
  return nil
end

-- An optional argument ('' is none, '=' .. value is one).
local function need_opt(v, name)
  if v == nil or (v ~= '' and string.sub(v, 1, 1) ~= '=') then
    return name .. ' must be empty or =<value>'
  end
  return nil
end

-- A plain string that may be empty (present, not '='-encoded).
local function need_str(v, name)
  if v == nil then return name .. ' is missing' end
  return nil
end

-- A plain instant, or '' for none.
local function need_instant_or_empty(v, name)
  if v == nil then return name .. ' is missing' end
  if v == '' then return nil end
  local x = finite(v)
  if x == nil or x < 0 or x > MAX_EPOCH then
    return name .. ' must be an instant from 1970 to 9999 (epoch seconds)'
  end
  return nil
end

local function need_instant_opt(v, name)
  local bad = need_opt(v, name)
  if bad or v == '' then return bad end
  local x = finite(string.sub(v, 2))
  if x == nil or x < 0 or x > MAX_EPOCH then
    return name .. ' must be an instant from 1970 to 9999 (epoch seconds)'
  end
  return nil
end

local function need_duration_opt(v, name)
  local bad = need_opt(v, name)
  if bad or v == '' then return bad end
  local x = finite(string.sub(v, 2))
  if x == nil or x < 0 or x > MAX_DURATION then
    return name .. ' must be a number of seconds from 0 to 100 years'
  end
  return nil
end

local function need_flag(v, name)
  if v ~= '' and v ~= '0' and v ~= '1' then return name .. " must be '', '0' or '1'" end
  return nil
end

-- The first fault of a list of checks (nil when all pass).
local function first(...)
  for i = 1, select('#', ...) do
    local bad = select(i, ...)
    if bad then return bad end
  end
  return nil
end

local function refuse(code, why)
  return redis.error_reply(code .. ' ' .. why .. '; nothing was written')
end

local P = ARGV[1]
local fault = first(
  need(P, 'the key prefix'),
  ARGV[2] ~= '' and finite(ARGV[2]) == nil and 'the test clock must be empty or a number' or nil,
  need_retention(ARGV[3], 'the done retention'),
  need_positive(ARGV[4], 'the dead retention'))
if fault then return refuse('X_INVARIANT', fault) end
local NOW
if ARGV[2] ~= '' then
  NOW = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- A done retention of 0 keeps no done rows (done_retention=0): the ack deletes
-- a row that settles done, in the same call. A row something still reads keeps
-- its row, decided by the row (a child: its parent reads its result; a
-- unique_for= row: it keeps its key taken), for 14 days (the other drivers'
-- Retention default): DONE_TTL is then that row's TTL.
local UNKEPT = tonumber(ARGV[3]) == 0
local DONE_TTL = UNKEPT and 14 * 86400 or tonumber(ARGV[3])
local DEAD_TTL = tonumber(ARGV[4])
local A = 5

local LIVE = {ready = true, delayed = true, running = true, suspended = true}
local WAITING = {ready = true, delayed = true, suspended = true}
local COUNTER_TTL = 31 * 86400

local function fmt(x)
  return string.format('%.6f', x)
end

-- A string (or a missing value, as null) as JSON.
local function jstr(v)
  if v == nil or v == false then return 'null' end
  return cjson.encode(v)
end

local function jobkey(id)
  return P .. ':job:' .. id
end

-- An optional argument: '' is none, anything else is '=' .. value.
local function opt(v)
  if v == nil or v == '' then
    return nil
  end
  return string.sub(v, 2)
end

local function count(q, st, d)
  redis.call('HINCRBY', P .. ':count:' .. q, st, d)
end

local function set_state(jk, q, old, new)
  if old ~= new then
    if LIVE[old] then count(q, old, -1) end
    if LIVE[new] then count(q, new, 1) end
  end
  redis.call('HSET', jk, 'st', new)
end

local function to_ready(jk, id, q, prio, run_at, seq)
  local m = string.format('%015d%012d', math.floor(run_at * 1000), seq) .. id
  redis.call('ZADD', P .. ':ready:' .. q, prio, m)
  redis.call('HSET', jk, 'rm', m)
end

-- A live, not-running row: where the claim will find it.
local function index(jk, id, q)
  local f = redis.call('HMGET', jk, 'prio', 'run', 'seq')
  local run_at = tonumber(f[2])
  if run_at <= NOW then
    to_ready(jk, id, q, tonumber(f[1]), run_at, tonumber(f[3]))
  else
    redis.call('ZADD', P .. ':sched:' .. q, run_at, id)
  end
end

-- A child (step.invoke/step.gather: its 'par') left the live states: its
-- parent counts it down ('kp', once per child: 'cs'), and the last one makes
-- a parent suspended on its children ('wc') due at once. A child of a wait
-- ('pw': its step's wait, EnqueueRequest.parent_wait) is also counted on that
-- wait ('kw:<wait>'): the last of the wait a parent is suspended on ('cw')
-- makes it due, however many children of earlier steps still run. (A child
-- stored before waits were counted has no 'pw': the parent's total decides.)
local function child_settled(jk, par)
  if not par then return end
  if redis.call('HSETNX', jk, 'cs', 1) == 0 then return end
  local pk = jobkey(par)
  if redis.call('EXISTS', pk) == 0 then return end
  local left = redis.call('HINCRBY', pk, 'kp', -1)
  local pw = redis.call('HGET', jk, 'pw')
  if pw then
    left = redis.call('HINCRBY', pk, 'kw:' .. pw, -1)
    if left <= 0 then redis.call('HDEL', pk, 'kw:' .. pw) end
  end
  if left > 0 then return end
  local f = redis.call('HMGET', pk, 'st', 'wc', 'run', 'q', 'cw')
  if f[1] == 'suspended' and f[2] == '1' and (not f[5] or f[5] == pw)
      and tonumber(f[3]) > NOW then
    redis.call('ZREM', P .. ':sched:' .. f[4], par)
    redis.call('HSET', pk, 'run', fmt(NOW), 'upd', fmt(NOW))
    index(pk, par, f[4])
    redis.call('PUBLISH', P .. ':wake', f[4])
  end
end

-- A row leaves the live states: its live key is free again. A row enqueued
-- with unique_for= ('un') is remembered as its key's newest settled row
-- (P:uniq:<live key>), for as long as a settled row is kept; a child counts
-- down its parent.
local function free_key(jk, id)
  local f = redis.call('HMGET', jk, 'lf', 'un', 'par')
  local lf = f[1]
  if lf and redis.call('HGET', P .. ':live', lf) == id then
    redis.call('HDEL', P .. ':live', lf)
    if f[2] == '1' then
      redis.call('SET', P .. ':uniq:' .. lf, id, 'EX', math.ceil(math.max(DONE_TTL, DEAD_TTL)))
    end
  end
  child_settled(jk, f[3])
end

local function parse_lease(v)
  if not v then return nil end
  local j, w, c, e = string.match(v, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
  return j, w, c, tonumber(e)
end

-- Whether a live slot of lease key `key` is held.
local function key_held(key)
  for _, sk in ipairs(redis.call('SMEMBERS', P .. ':lslots:' .. key)) do
    local j, w, c, e = parse_lease(redis.call('GET', sk))
    if j and e > NOW then return true end
  end
  return false
end

-- A slot of `key` came free: the first run waiting on it (P:busy:<key>, by
-- priority then enqueue order) is due now. Entries of rows claimed, cancelled
-- or woken since are stale: skipped.
local function wake_waiter(key)
  local bk = P .. ':busy:' .. key
  while true do
    local got = redis.call('ZPOPMIN', bk)
    if #got == 0 then return end
    local id = string.sub(got[1], 13)
    local jk = jobkey(id)
    local f = redis.call('HMGET', jk, 'st', 'bk', 'q', 'run')
    if f[1] == 'ready' and f[2] == key then
      redis.call('HDEL', jk, 'bk')
      if tonumber(f[4]) > NOW then
        redis.call('ZREM', P .. ':sched:' .. f[3], id)
        redis.call('HSET', jk, 'run', fmt(NOW))
        index(jk, id, f[3])
        redis.call('PUBLISH', P .. ':wake', f[3])
        return
      end
      -- already due (its bound passed): claimable anyway; wake the next
    end
  end
end

-- Release every slot `id` holds; each wakes the first run waiting on its key.
local function release_leases(id)
  local jl = P .. ':jl:' .. id
  for _, sk in ipairs(redis.call('SMEMBERS', jl)) do
    local j = parse_lease(redis.call('GET', sk))
    if j == id then
      redis.call('DEL', sk)
      -- sk is P:lease:<key>:<slot>
      wake_waiter(string.match(string.sub(sk, #P + 8), '^(.*):%d+$'))
    end
  end
  redis.call('DEL', jl)
  redis.call('HDEL', jobkey(id), 'hl')
end

-- bump() for many settles at once: `counted` maps a job name to {settles,
-- summed duration or nil, queue}; the bucket's key is touched once.
local function bump_many(counted, field)
  local bucket = math.floor(NOW / 60) * 60
  local ck = P .. ':cnt:' .. string.format('%d', bucket)
  local any = false
  for name, c in pairs(counted) do
    any = true
    redis.call('HINCRBY', ck, name .. '\n' .. field, c[1])
    redis.call('HSET', ck, name .. '\nqueue', c[3])
    if c[2] then redis.call('HINCRBYFLOAT', ck, name .. '\nduration', c[2]) end
  end
  if not any then return end
  redis.call('EXPIRE', ck, COUNTER_TTL)
  redis.call('ZADD', P .. ':cnt', bucket, string.format('%d', bucket))
  redis.call('ZREMRANGEBYSCORE', P .. ':cnt', '-inf', '(' .. string.format('%d', bucket - COUNTER_TTL))
end

local function bump(name, field, duration, q)
  local bucket = math.floor(NOW / 60) * 60
  local ck = P .. ':cnt:' .. string.format('%d', bucket)
  redis.call('HINCRBY', ck, name .. '\n' .. field, 1)
  redis.call('HSET', ck, name .. '\nqueue', q)
  if duration and duration ~= '' then
    redis.call('HINCRBYFLOAT', ck, name .. '\nduration', tonumber(duration))
  end
  redis.call('EXPIRE', ck, COUNTER_TTL)
  redis.call('ZADD', P .. ':cnt', bucket, string.format('%d', bucket))
  redis.call('ZREMRANGEBYSCORE', P .. ':cnt', '-inf', '(' .. string.format('%d', bucket - COUNTER_TTL))
end

-- A row ends: counted out of its live state, indexed for stats until it expires.
local function terminal(jk, id, q, old, st)
  set_state(jk, q, old, st)
  local ttl = st == 'done' and DONE_TTL or DEAD_TTL
  redis.call('ZADD', P .. ':term:' .. q .. ':' .. st, NOW + ttl, id)
  redis.call('EXPIRE', jk, math.ceil(ttl))
  redis.call('EXPIRE', P .. ':steps:' .. id, math.ceil(ttl))
end

-- The attempt log: the row's field 'al', a JSON array of its newest MAX_LOG
-- claims, oldest first (times as '%.6f' strings: cjson would round numbers),
-- then the newest entry in short fields of its own while it is open, and
-- after the ack closed it done: 'oa' started_at, 'ow' worker_id, 'on' the
-- attempt, 'os' / 'ost' the step it is in and since when, 'oe' its end (set
-- by the ack; the outcome is then done). Kept out of 'al' because a JSON
-- value over 64 bytes turns a small row's hash from Redis's compact listpack
-- into a hashtable (about 4x the memory of a done row, and a conversion on
-- every claim). Every other ending pushes the entry onto 'al' (log_push) and
-- clears the fields; so does a claim or a requeue that finds one. A row
-- written before these fields holds its open entry in 'al': the old way below
-- still closes it there.
local MAX_LOG = 20
local LAPSED = 'the lease lapsed: the worker holding it died or stopped renewing it'
local ENTRY_FIELDS = {'oa', 'ow', 'on', 'os', 'ost', 'oe'}

local function log_read(jk)
  local raw = redis.call('HGET', jk, 'al')
  if not raw then return {} end
  return cjson.decode(raw)
end

-- Push the entry kept in fields onto 'al' (closed with `outcome`, `code` and
-- `message` if it is still open and an outcome is given). False when the row
-- has none.
local function log_push(jk, outcome, code, message)
  local f = redis.call('HMGET', jk, 'oa', 'ow', 'on', 'os', 'ost', 'oe', 'al')
  if not f[1] then return false end
  local e = {attempt = tonumber(f[3]), worker_id = f[2], started_at = f[1]}
  if f[4] then
    e.step = f[4]
    e.step_started_at = f[5]
  end
  if f[6] then
    e.ended_at = f[6]
    e.outcome = 'done'
  elseif outcome then
    e.ended_at = fmt(NOW)
    e.outcome = outcome
    if code ~= '' then e.error_code = code end
    if message ~= '' then e.error = message end
  end
  local log = f[7] and cjson.decode(f[7]) or {}
  while #log >= MAX_LOG do table.remove(log, 1) end
  log[#log + 1] = e
  redis.call('HSET', jk, 'al', cjson.encode(log))
  redis.call('HDEL', jk, unpack(ENTRY_FIELDS))
  return true
end

-- Close the open entry (none open: nothing to close). '' is no code / message.
local function log_end(jk, outcome, code, message)
  local f = redis.call('HMGET', jk, 'oa', 'oe')
  if f[1] then
    if not f[2] then log_push(jk, outcome, code, message) end
    return
  end
  local log = log_read(jk)
  local last = log[#log]
  if not last or last.ended_at then return end
  last.ended_at = fmt(NOW)
  last.outcome = outcome
  if code ~= '' then last.error_code = code end
  if message ~= '' then last.error = message end
  redis.call('HSET', jk, 'al', cjson.encode(log))
end

-- The step the open entry's run is in ('' : between steps).
local function log_step(jk, step, since)
  local f = redis.call('HMGET', jk, 'oa', 'oe')
  if f[1] then
    if f[2] then return end
    if step == '' then
      redis.call('HDEL', jk, 'os', 'ost')
    else
      redis.call('HSET', jk, 'os', step, 'ost', since)
    end
    return
  end
  local log = log_read(jk)
  local last = log[#log]
  if not last or last.ended_at then return end
  if step == '' then
    last.step = nil
    last.step_started_at = nil
  else
    last.step = step
    last.step_started_at = since
  end
  redis.call('HSET', jk, 'al', cjson.encode(log))
end

-- The claim's holder, while its lease holds.
local function owned(jk, worker, claim)
  local f = redis.call('HMGET', jk, 'st', 'w', 'c', 'le', 'q', 'name')
  if f[1] == 'running' and f[2] == worker and f[3] == claim and tonumber(f[4]) > NOW then
    return f
  end
  return nil
end

-- Whether `claim` settled the row: its ack or nack keeps the claim as 'sc', and
-- claim numbers are unique, so a row not running that names it is that settle,
-- landed. A retry whose first try's reply was lost answers landed again, and
-- moves nothing twice.
local function settled_by(jk, claim)
  local f = redis.call('HMGET', jk, 'st', 'sc')
  return f[1] ~= false and f[1] ~= 'running' and f[2] == claim
end

-- The live row holding live key `lf`: its id and run id, or nil.
local function live_holder(lf)
  local held = redis.call('HGET', P .. ':live', lf)
  if held then
    local f = redis.call('HMGET', jobkey(held), 'rid', 'st')
    if f[1] and LIVE[f[2]] then
      return held, f[1]
    end
  end
  return nil
end

-- The settled row a unique_for= of `uf` seconds still holds key `lf` for
-- (settled less than `uf` ago): its id and run id, or nil.
local function unique_holder(lf, uf)
  local held = redis.call('GET', P .. ':uniq:' .. lf)
  if not held then return nil end
  local f = redis.call('HMGET', jobkey(held), 'rid', 'st', 'upd')
  if f[1] and f[2] and not LIVE[f[2]] and tonumber(f[3]) + uf > NOW then
    return held, f[1]
  end
  return nil
end

-- The row holding an input's live key, the row already stored under its id
-- (a republish), or (uf: its unique_for= in seconds, or nil) the settled row
-- still holding its key: {id, run_id}, or nil when the input would be a new row.
local function holder(lf, id, uf)
  local held, rid = live_holder(lf)
  if held then return {held, rid} end
  rid = redis.call('HGET', jobkey(id), 'rid')
  if rid then
    return {id, rid}
  end
  if uf then
    held, rid = unique_holder(lf, uf)
    if held then return {held, rid} end
  end
  return nil
end

-- A row's arguments: id, run id, name, queue, payload, tenant, idempotency
-- key, concurrency key, max attempts, priority, run_at, delay, actor, trace
-- context, live key, sensitive ('0'/'1'), parent id, debounce, unique_for,
-- the parent's wait (a child of step.invoke/step.gather).
local ROW = 20

local function need_positive_opt(v, name)
  local bad = need_opt(v, name)
  if bad or v == '' then return bad end
  return need_positive(string.sub(v, 2), name)
end

-- What is wrong with the row at ARGV[i .. i + ROW - 1], or nil (insert_row's
-- arguments; checked for every row before the first is written).
local function row_fault(i, r)
  local id, rid, name, q, pl, tn, key, ck, mx, prio, run, delay, ac, tc, lf, sens, par, deb, uf, pw = unpack(ARGV, i, i + ROW - 1)
  local bad = first(
    need(id, 'id'), need(rid, 'run_id'), need(name, 'name'), need(q, 'queue'),
    need(pl, 'payload'), need_opt(tn, 'tenant_id'), need(key, 'idempotency_key'),
    need_opt(ck, 'concurrency_key'), need_whole(mx, 'max_attempts', 1),
    need_whole(prio, 'priority', -MAX_PRIORITY - 1, MAX_PRIORITY),
    need_instant_opt(run, 'run_at'), need_duration_opt(delay, 'delay'),
    need_opt(ac, 'actor'), need_opt(tc, 'trace_context'), need(lf, 'the live key'),
    (sens ~= '0' and sens ~= '1') and "sensitive must be '0' or '1'" or nil,
    need_opt(par, 'parent_id'), need_positive_opt(deb, 'debounce'),
    need_positive_opt(uf, 'unique_for'), need_opt(pw, 'parent_wait'))
  if bad then return 'row ' .. r .. ': ' .. bad end
  return nil
end

-- The rows of an enqueue or a commit: n at ARGV[i ...]. Answers the first
-- fault, or nil.
local function rows_fault(n, i)
  if n == nil or n < 0 then return 'the row count must be a whole number' end
  if #ARGV < i + n * ROW - 1 then return 'the rows are incomplete' end
  for r = 1, n do
    local bad = row_fault(i + (r - 1) * ROW, r)
    if bad then return bad end
  end
  return nil
end

-- Store one new row from ARGV[i .. i + ROW - 1]. Answers its queue when it is due now.
local function insert_row(i)
  local id, rid, name, q, pl, tn, key, ck, mx, prio, run, delay, ac, tc, lf, sens, par, deb, uf, pw = unpack(ARGV, i, i + ROW - 1)
  local run_at
  if deb ~= '' then
    run_at = NOW + tonumber(opt(deb))
  elseif run ~= '' then
    run_at = tonumber(opt(run))
  else
    run_at = NOW + (tonumber(opt(delay)) or 0)
  end
  local st = 'delayed'
  if run_at <= NOW then st = 'ready' end
  local seq = redis.call('INCR', P .. ':seq')
  local jk = jobkey(id)
  redis.call('HSET', jk, 'id', id, 'rid', rid, 'name', name, 'q', q, 'pl', pl, 'key', key,
    'max', mx, 'prio', prio, 'run', fmt(run_at), 'cr', fmt(NOW), 'upd', fmt(NOW), 'seq', seq,
    'st', st, 'att', 0, 'lf', lf, 'pr', 0, 'lp', 0, 'ns', 1)
  if tn ~= '' then redis.call('HSET', jk, 'tn', opt(tn)) end
  if ck ~= '' then redis.call('HSET', jk, 'ck', opt(ck)) end
  if ac ~= '' then redis.call('HSET', jk, 'ac', opt(ac)) end
  if tc ~= '' then redis.call('HSET', jk, 'tc', opt(tc)) end
  redis.call('HSET', jk, 'sens', sens)
  if par ~= '' then redis.call('HSET', jk, 'par', opt(par)) end
  if uf ~= '' then redis.call('HSET', jk, 'un', '1') end
  redis.call('HSET', P .. ':live', lf, id)
  redis.call('SADD', P .. ':queues', q)
  -- The operator surface's indexes: by creation (list), by id (prefixes).
  redis.call('ZADD', P .. ':all', fmt(NOW), id)
  redis.call('ZADD', P .. ':ids', 0, id)
  if par ~= '' then
    -- A child: its parent lists it and counts it live (see child_settled).
    redis.call('RPUSH', P .. ':kids:' .. opt(par), id)
    if pw ~= '' then redis.call('HSET', jk, 'pw', opt(pw)) end
    if redis.call('EXISTS', jobkey(opt(par))) == 1 then
      redis.call('HINCRBY', jobkey(opt(par)), 'kp', 1)
      if pw ~= '' then redis.call('HINCRBY', jobkey(opt(par)), 'kw:' .. opt(pw), 1) end
    end
  end
  count(q, st, 1)
  index(jk, id, q)
  if st == 'ready' then return q end
  return nil
end

-- A live row a debounced enqueue may still move: never claimed (no attempt
-- log: a sleep's hand-back is uncounted), ready or delayed, not waiting on a
-- busy key. It takes the input's payload and concurrency key and is due
-- `debounce` after now.
local function debounce_row(held, i)
  local jk = jobkey(held)
  local f = redis.call('HMGET', jk, 'st', 'q', 'al', 'bk', 'rm', 'oa')
  if (f[1] ~= 'ready' and f[1] ~= 'delayed') or f[3] or f[4] or f[6] then return end
  local q = f[2]
  local ck = ARGV[i + 7]
  redis.call('HSET', jk, 'pl', ARGV[i + 4], 'run', fmt(NOW + tonumber(opt(ARGV[i + 17]))),
    'upd', fmt(NOW))
  if ck ~= '' then redis.call('HSET', jk, 'ck', opt(ck)) else redis.call('HDEL', jk, 'ck') end
  if f[5] then
    redis.call('ZREM', P .. ':ready:' .. q, f[5])
    redis.call('HDEL', jk, 'rm')
  end
  redis.call('ZREM', P .. ':sched:' .. q, held)
  set_state(jk, q, f[1], 'delayed')
  index(jk, held, q)
end

-- One input of an enqueue (ARGV[i .. i + ROW - 1]): deduped onto the row
-- holding its key (a debounced input moves it, see debounce_row), or stored.
-- Answers {id, run_id, deduped} and, for a new row due now, its queue.
local function enqueue_row(i)
  local lf, uf = ARGV[i + 14], opt(ARGV[i + 18])
  local held, rid = live_holder(lf)
  if held then
    if ARGV[i + 17] ~= '' then debounce_row(held, i) end
    return {held, rid, 1}, nil
  end
  local found = holder(lf, ARGV[i], uf and tonumber(uf))
  if found then return {found[1], found[2], 1}, nil end
  return {ARGV[i], ARGV[i + 1], 0}, insert_row(i)
end

-- Store an event and make every run suspended on it due now. Answers the
-- queues it woke (a set).
local function publish_event(name, payload, woke)
  local eid = redis.call('INCR', P .. ':eventid')
  local ek = P .. ':events:' .. name
  redis.call('ZADD', ek, NOW, eid .. '\n' .. payload)
  redis.call('ZREMRANGEBYSCORE', ek, '-inf', '(' .. fmt(NOW - DEAD_TTL))
  local wk = P .. ':waiting:' .. name
  for _, id in ipairs(redis.call('SMEMBERS', wk)) do
    local jk = jobkey(id)
    local f = redis.call('HMGET', jk, 'st', 'we', 'run', 'q')
    if f[1] == 'suspended' and f[2] == name then
      if tonumber(f[3]) > NOW then
        redis.call('ZREM', P .. ':sched:' .. f[4], id)
        redis.call('HSET', jk, 'run', fmt(NOW))
        index(jk, id, f[4])
        woke[f[4]] = true
      end
    else
      redis.call('SREM', wk, id)
    end
  end
end

-- One step record, only while the fence holds the row; a replaced record keeps
-- the seq it was first recorded under. Answers whether it landed.
local function put_step(id, worker, claim, name, seq, body)
  if not owned(jobkey(id), worker, claim) then return false end
  local sk = P .. ':steps:' .. id
  local old = redis.call('HGET', sk, name)
  if old then
    seq = string.match(old, '^(%-?%d+)\n') or seq
  else
    -- 'ns' (no step records: the claim skips reading them, the ack expiring them)
    redis.call('HDEL', jobkey(id), 'ns')
  end
  redis.call('HSET', sk, name, seq .. '\n' .. body)
  return true
end

local function announce(queues)
  for q, _ in pairs(queues) do
    redis.call('PUBLISH', P .. ':wake', q)
  end
end

-- ---------------------------------------------------------------- the operator surface
-- (operate.lua's scripts; the helpers live here, beside what they change)

-- A row as the operator surface reads it: {fields, steps, children}, or {}
-- when no row has that id. `bare`: without steps and children (a list row).
local function view(id, bare)
  local h = redis.call('HGETALL', jobkey(id))
  if #h == 0 then return {} end
  if bare then return {h, {}, {}} end
  return {h, redis.call('HGETALL', P .. ':steps:' .. id), redis.call('LRANGE', P .. ':kids:' .. id, 0, -1)}
end

-- Ids whose rows are gone (a retention expiry): out of the operator's indexes.
local function forget(ids)
  for _, id in ipairs(ids) do
    redis.call('ZREM', P .. ':all', id)
    redis.call('ZREM', P .. ':ids', id)
  end
end

-- Out of the queue's indexes (a row about to move or go).
local function unindex(jk, id, q)
  local rm = redis.call('HGET', jk, 'rm')
  if rm then
    redis.call('ZREM', P .. ':ready:' .. q, rm)
    redis.call('HDEL', jk, 'rm')
  end
  redis.call('ZREM', P .. ':sched:' .. q, id)
end

-- A settled row is live again: ready now, attempts and error cleared, kept
-- until it settles again.
local function requeue_row(id)
  local jk = jobkey(id)
  local f = redis.call('HMGET', jk, 'st', 'q', 'lf')
  local st, q = f[1], f[2]
  redis.call('ZREM', P .. ':term:' .. q .. ':' .. st, id)
  redis.call('PERSIST', jk)
  redis.call('PERSIST', P .. ':steps:' .. id)
  log_push(jk)
  redis.call('HDEL', jk, 'ec', 'em', 'rs', 'we', 'bk', 'w', 'c')
  redis.call('HSET', jk, 'att', 0, 'run', fmt(NOW), 'upd', fmt(NOW))
  redis.call('HSET', P .. ':live', f[3], id)
  set_state(jk, q, st, 'ready')
  index(jk, id, q)
  redis.call('PUBLISH', P .. ':wake', q)
end

local CANCELLED_OUTCOME = 'cancelled'

-- A live row ends cancelled: a running one's claim is fenced off (its attempt
-- log entry closed with `line`), its live key and slots freed.
local function cancel_row(id, message, line)
  local jk = jobkey(id)
  local f = redis.call('HMGET', jk, 'st', 'q')
  local st, q = f[1], f[2]
  if st == 'running' then
    log_end(jk, CANCELLED_OUTCOME, 'X_ABORTED', line)
    redis.call('ZREM', P .. ':running', id)
  end
  unindex(jk, id, q)
  redis.call('HDEL', jk, 'w', 'c', 'bk')
  redis.call('HSET', jk, 'ec', 'X_ABORTED', 'em', message, 'upd', fmt(NOW))
  free_key(jk, id)
  release_leases(id)
  terminal(jk, id, q, st, 'cancelled')
end

-- A row and its steps are deleted, out of every index.
local function drop_row(id)
  local jk = jobkey(id)
  local f = redis.call('HMGET', jk, 'st', 'q')
  local st, q = f[1], f[2]
  if st then
    unindex(jk, id, q)
    redis.call('ZREM', P .. ':running', id)
    if LIVE[st] then count(q, st, -1) else redis.call('ZREM', P .. ':term:' .. q .. ':' .. st, id) end
    redis.call('HDEL', jk, 'un')
    free_key(jk, id)
    release_leases(id)
  end
  redis.call('DEL', jk, P .. ':steps:' .. id, P .. ':kids:' .. id)
  forget({id})
end

-- Whether a row promote moves: delayed, or ready backing off before a retry.
local function promotable(st, run)
  return st == 'delayed' or (st == 'ready' and tonumber(run) > NOW)
end

local function promote_row(id)
  local jk = jobkey(id)
  local f = redis.call('HMGET', jk, 'st', 'q')
  unindex(jk, id, f[2])
  redis.call('HSET', jk, 'run', fmt(NOW), 'pr', 1, 'upd', fmt(NOW))
  set_state(jk, f[2], f[1], 'ready')
  index(jk, id, f[2])
  redis.call('PUBLISH', P .. ':wake', f[2])
end

-- name: schema
-- The key-schema version: set on first use, answered as stored afterwards.
fault = need_whole(ARGV[A], 'the key-schema version', 1)
if fault then return refuse('X_INVARIANT', fault) end
local cur = redis.call('GET', P .. ':schema')
if not cur then
  redis.call('SET', P .. ':schema', ARGV[A])
  return ARGV[A]
end
return cur

-- name: schema_index
-- The upgrade from key-schema version 1: the rows ARGV[A ..] (ids) into the
-- operator surface's indexes.
for i = A, #ARGV do
  local cr = redis.call('HGET', jobkey(ARGV[i]), 'cr')
  if cr then
    redis.call('ZADD', P .. ':all', cr, ARGV[i])
    redis.call('ZADD', P .. ':ids', 0, ARGV[i])
    if redis.call('EXISTS', P .. ':jl:' .. ARGV[i]) == 1 then
      redis.call('HSET', jobkey(ARGV[i]), 'hl', 1)
    end
  end
end
return 1

-- name: schema_set
-- Move the stored version from ARGV[A] to ARGV[A + 1]; answers the version stored.
fault = need_whole(ARGV[A], 'the version', 1) or need_whole(ARGV[A + 1], 'the version', 1)
if fault then return refuse('X_INVARIANT', fault) end
if redis.call('GET', P .. ':schema') == ARGV[A] then
  redis.call('SET', P .. ':schema', ARGV[A + 1])
end
return redis.call('GET', P .. ':schema')

-- name: enqueue
-- Up to 1,000 rows. An input whose live key a live row holds, or whose id is
-- already a row (a republish), answers that row, deduped; inputs sharing a key
-- in one call are one row (the first stands for the rest). Answers
-- {id, run_id, deduped} per input, in order; announces the queues it made due.
local n = whole(ARGV[A])
fault = rows_fault(n, A + 1)
if fault then return refuse('X_JOB_INPUT_INVALID', fault) end
if #ARGV ~= A + n * ROW then return refuse('X_INVARIANT', 'extra arguments after the rows') end
local out = {}
local woke = {}
local i = A + 1
for r = 1, n do
  local answer, q = enqueue_row(i)
  if q then woke[q] = true end
  out[r] = answer
  i = i + ROW
end
announce(woke)
return out

-- name: peek
-- Read-only: what a staged input would dedupe onto now ({id, run_id} or {}).
-- Per input: its live key, its id and its unique_for= ('' for none).
local n = tonumber(ARGV[A])
local out = {}
for r = 1, n do
  local lf, id, uf = ARGV[A + 3 * r - 2], ARGV[A + 3 * r - 1], ARGV[A + 3 * r]
  out[r] = holder(lf, id, uf ~= '' and tonumber(uf) or nil) or {}
end
return out

-- name: commit
-- A transaction's buffered enqueues (rows it answered as new), publishes and
-- fenced step records, applied together. When another enqueue took one of its
-- keys (or ids) since it was staged, nothing is applied and the script answers
-- 'conflict'; when a step record's fence no longer holds its row, 'lost'.
local n = whole(ARGV[A])
fault = rows_fault(n, A + 1)
if fault then return refuse('X_JOB_INPUT_INVALID', fault) end
do
  local e0 = A + 1 + n * ROW
  local ne = whole(ARGV[e0])
  fault = need_whole(ARGV[e0], 'the event count', 0)
  if not fault then
    for e = 1, ne do
      fault = fault or need(ARGV[e0 + 2 * e - 1], 'an event name') or need(ARGV[e0 + 2 * e], 'an event payload')
    end
    local s0 = e0 + 2 * ne + 1
    fault = fault or need_whole(ARGV[s0], 'the step count', 0)
    if not fault then
      local ns = whole(ARGV[s0])
      for r = 0, ns - 1 do
        local k = s0 + 1 + 6 * r
        fault = fault or first(need(ARGV[k], 'a step job id'), need(ARGV[k + 1], 'a step worker'),
          need_whole(ARGV[k + 2], 'a step claim'), need(ARGV[k + 3], 'a step name'),
          need_whole(ARGV[k + 4], 'a step seq'), need(ARGV[k + 5], 'a step record'))
      end
      if not fault then
        local d0 = s0 + 6 * ns + 1
        fault = need_whole(ARGV[d0], 'the debounce count', 0) or rows_fault(whole(ARGV[d0]), d0 + 1)
        if not fault and #ARGV ~= d0 + ROW * whole(ARGV[d0]) then
          fault = 'the arguments do not add up'
        end
      end
    end
  end
  if fault then return refuse('X_INVARIANT', fault) end
end
local i = A + 1
for r = 1, n do
  local uf = opt(ARGV[i + 18])
  if holder(ARGV[i + 14], ARGV[i], uf and tonumber(uf)) then
    return 'conflict'
  end
  i = i + ROW
end
local ne = tonumber(ARGV[i])
local s0 = i + 2 * ne + 1
local ns = tonumber(ARGV[s0] or '0')
for r = 0, ns - 1 do
  local k = s0 + 1 + 6 * r
  if not owned(jobkey(ARGV[k]), ARGV[k + 1], ARGV[k + 2]) then
    return 'lost'
  end
end
for r = 0, ns - 1 do
  local k = s0 + 1 + 6 * r
  put_step(ARGV[k], ARGV[k + 1], ARGV[k + 2], ARGV[k + 3], ARGV[k + 4], ARGV[k + 5])
end
local woke = {}
i = A + 1
for r = 1, n do
  local q = insert_row(i)
  if q then woke[q] = true end
  i = i + ROW
end
for e = 1, ne do
  publish_event(ARGV[i + 2 * e - 1], ARGV[i + 2 * e], woke)
end
-- Debounced inputs the staging answered as deduped onto a live row: that row
-- takes the last of them, if it still has not started.
local d0 = s0 + 6 * ns + 1
for r = 0, tonumber(ARGV[d0]) - 1 do
  local k = d0 + 1 + r * ROW
  local held = live_holder(ARGV[k + 14])
  if held then debounce_row(held, k) end
end
announce(woke)
local qs = {}
for q, _ in pairs(woke) do qs[#qs + 1] = q end
return qs

-- name: claim
-- One pass of a worker. First every running row whose lease lapsed is reaped:
-- on its final attempt it is buried (dead, or failed for the drop names) and
-- answered as exhausted; otherwise it is offered again, due at its lapse. Then,
-- per unpaused queue in the order given, rows that fell due move to the ready
-- set and up to `take` of them are claimed, best first (priority, run_at, seq),
-- each with a fresh fence and its step records. Answers {taken, exhausted,
-- next due} (see ClaimResult.next_due).
fault = first(need(ARGV[A], 'worker_id'), need_positive(ARGV[A + 1], 'visibility_timeout'),
  need(ARGV[A + 2], 'the lapse message'), need_whole(ARGV[A + 3], 'the drop-name count', 0))
if not fault then
  local q0 = A + 4 + tonumber(ARGV[A + 3])
  if (#ARGV - q0 + 1) % 2 ~= 0 then fault = 'queues come in (queue, take) pairs' end
  for j = q0, #ARGV, 2 do
    fault = fault or need(ARGV[j], 'a queue') or need_whole(ARGV[j + 1], 'a take', 0)
  end
end
if fault then return refuse('X_INVARIANT', fault) end
local worker = ARGV[A]
local vis = tonumber(ARGV[A + 1])
local lapse_message = ARGV[A + 2]
local nd = tonumber(ARGV[A + 3])
local drop = {}
for j = 1, nd do drop[ARGV[A + 3 + j]] = true end
local i = A + 4 + nd

local exhausted = {}
local lapsed = redis.call('ZRANGEBYSCORE', P .. ':running', '-inf', fmt(NOW), 'LIMIT', 0, 1000)
for _, id in ipairs(lapsed) do
  local jk = jobkey(id)
  redis.call('ZREM', P .. ':running', id)
  local f = redis.call('HMGET', jk, 'st', 'le', 'att', 'max', 'name', 'q', 'rid', 'pl', 'tn')
  if f[1] == 'running' and tonumber(f[2]) <= NOW then
    release_leases(id)
    local att, mx = tonumber(f[3]), tonumber(f[4])
    redis.call('HDEL', jk, 'w', 'c')
    redis.call('HSET', jk, 'upd', fmt(NOW))
    if att >= mx then
      local st = 'dead'
      if drop[f[5]] then st = 'failed' end
      local msg = string.format(lapse_message, att, mx)
      redis.call('HSET', jk, 'ec', 'X_JOB_LEASE_LOST', 'em', msg)
      log_end(jk, 'lapsed', 'X_JOB_LEASE_LOST', LAPSED)
      free_key(jk, id)
      terminal(jk, id, f[6], 'running', st)
      bump(f[5], st, nil, f[6])
      exhausted[#exhausted + 1] = {id, f[7], f[5], f[6], f[8], f[9] or false, st, 'X_JOB_LEASE_LOST', msg}
    else
      log_end(jk, 'lapsed', 'X_JOB_LEASE_LOST', LAPSED)
      redis.call('HSET', jk, 'run', f[2], 'pr', 0, 'lp', 1)
      set_state(jk, f[6], 'running', 'ready')
      index(jk, id, f[6])
    end
  end
end

local taken = {}
local leased = {}
local open_queues = {}
-- What every row of this call shares, formatted once.
local nowf = fmt(NOW)
local le = NOW + vis
local lef = fmt(le)
local jworker = jstr(worker)
local shared = ',' .. jworker .. ','
local encode = cjson.encode
while i <= #ARGV do
  local q = ARGV[i]
  local want = tonumber(ARGV[i + 1])
  i = i + 2
  local open = redis.call('SISMEMBER', P .. ':paused', q) == 0
  if open then open_queues[#open_queues + 1] = q end
  if want > 0 and open then
    local sk = P .. ':sched:' .. q
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', sk, '-inf', fmt(NOW), 'LIMIT', 0, 5000)) do
      redis.call('ZREM', sk, id)
      local jk = jobkey(id)
      local f = redis.call('HMGET', jk, 'st', 'prio', 'run', 'seq')
      if WAITING[f[1]] then
        to_ready(jk, id, q, tonumber(f[2]), tonumber(f[3]), tonumber(f[4]))
      end
    end
    local rk = P .. ':ready:' .. q
    local jq = jstr(q)
    local moved = {}
    while want > 0 do
      local got = redis.call('ZRANGE', rk, 0, want - 1)
      if #got == 0 then break end
      redis.call('ZREM', rk, unpack(got))
      -- One claim number per entry read (a stale entry leaves a gap: the
      -- numbers are unique, not dense).
      local last_claim = redis.call('INCRBY', P .. ':claims', #got)
      for k, m in ipairs(got) do
        local id = string.sub(m, 28)
        local jk = jobkey(id)
        local f = redis.call('HMGET', jk, 'st', 'rm', 'att', 'we', 'pr', 'lp', 'oa',
          'rid', 'name', 'pl', 'tn', 'key', 'ck', 'max', 'cr', 'run', 'ac', 'tc', 'bk', 'wc', 'ns')
        if WAITING[f[1]] and f[2] == m then
          want = want - 1
          local att = tonumber(f[3]) + 1
          local claim = string.format('%d', last_claim - #got + k)
          moved[f[1]] = (moved[f[1]] or 0) + 1
          -- The attempt log gains this claim's open entry, in its fields (see
          -- log_push: an entry still in them, which no waiting row should
          -- hold, goes onto 'al' first).
          if f[7] then log_push(jk) end
          -- 'pr' and 'lp' (promoted, lapsed) are written only when set: a
          -- row's first claim finds both '0'.
          if f[5] ~= '0' or f[6] ~= '0' then
            redis.call('HSET', jk, 'st', 'running', 'att', att, 'w', worker, 'c', claim,
              'le', lef, 'upd', nowf, 'pr', 0, 'lp', 0, 'oa', nowf, 'ow', worker, 'on', att)
          else
            redis.call('HSET', jk, 'st', 'running', 'att', att, 'w', worker, 'c', claim,
              'le', lef, 'upd', nowf, 'oa', nowf, 'ow', worker, 'on', att)
          end
          -- 'rm' stays, stale: only to_ready sets it, with the entry it adds
          -- (unindex and debounce_row remove an entry that is gone: nothing).
          -- The rest are rarely set: one call only for a row that has one
          -- ('cw' comes only with 'wc').
          if f[4] or f[19] or f[20] then redis.call('HDEL', jk, 'we', 'bk', 'wc', 'cw') end
          if f[4] then redis.call('SREM', P .. ':waiting:' .. f[4], id) end
          leased[#leased + 1] = lef
          leased[#leased + 1] = id
          -- The row as JSON, its stored JSON (payload, actor, trace context,
          -- step records) embedded as is: the driver parses the reply once.
          local steps = '[]'
          local flat = f[21] ~= '1' and redis.call('HGETALL', P .. ':steps:' .. id) or {}
          if #flat > 0 then
            local parts = {}
            for j = 1, #flat, 2 do
              local seq, body = string.match(flat[j + 1], '^(%-?%d+)\n(.*)$')
              parts[#parts + 1] = '[' .. encode(flat[j]) .. ',' .. seq .. ',' .. body .. ']'
            end
            steps = '[' .. table.concat(parts, ',') .. ']'
          end
          -- Numbers as JSON numbers: att, max, claim, and the times ('%.6f').
          -- One concatenation (one string built); nil fields as null.
          taken[#taken + 1] = '[' .. encode(id) .. ',' .. (f[8] and encode(f[8]) or 'null') .. ',' ..
            (f[9] and encode(f[9]) or 'null') ..
            ',' .. jq .. ',' .. (f[10] or 'null') .. ',' .. (f[11] and encode(f[11]) or 'null') ..
            ',' .. (f[12] and encode(f[12]) or 'null') .. ',' .. (f[13] and encode(f[13]) or 'null') .. ',' .. att ..
            ',' .. f[14] .. shared .. claim .. ',' .. f[15] .. ',' .. f[16] .. ',' .. lef ..
            ',' .. (f[17] or 'null') .. ',' .. (f[18] or 'null') .. ',' ..
            (f[5] == '1' and '1' or '0') .. ',' .. (f[6] == '1' and '1' or '0') .. ',' .. steps .. ']'
        end
      end
    end
    -- The live counts, once per state a claimed row left.
    local n = 0
    for st, k in pairs(moved) do
      count(q, st, -k)
      n = n + k
    end
    if n > 0 then count(q, 'running', n) end
  end
end
if #leased > 0 then redis.call('ZADD', P .. ':running', unpack(leased)) end
-- When a row not due now may become claimable: the first due time of the
-- unpaused queues asked, or the first running lease to lapse ('' for none).
local next_due = nil
local function earlier(zkey)
  local top = redis.call('ZRANGE', zkey, 0, 0, 'WITHSCORES')
  if #top > 0 then
    local t = tonumber(top[2])
    if not next_due or t < next_due then next_due = t end
  end
end
for _, q in ipairs(open_queues) do earlier(P .. ':sched:' .. q) end
earlier(P .. ':running')
return {'[' .. table.concat(taken, ',') .. ']', exhausted, next_due and fmt(next_due) or ''}

-- name: ack
-- The fenced completions of many slots, one call (the settle combiner): per
-- settle its row's id, the fence (worker, claim), the result, the progress,
-- the duration and `again`. Each row ends done with
-- its result; its live key and concurrency slots are freed and the done
-- counter moves, all here. The row keeps the claim that settled it ('sc');
-- `again` = '1' is the retry of an ack whose reply never came (see
-- settled_by). Answers 1 (landed) or 0 per settle, in order.
-- With a done retention of 0 (UNKEPT) a row that settles done is deleted
-- instead, with its steps, its children list, its slots, its live key and its
-- list indexes, in this call; the counters still count it. A child ('par') and
-- a unique_for= row ('un') are kept as above. The retry of an ack whose reply
-- never came then also answers landed when its row is gone: only a settled
-- row is ever deleted (remove refuses a running row, expiry and the purge
-- reach settled rows only), so a gone row's job is done.
-- The settles come as plain arguments from ARGV[A], 7 strings each (no JSON to
-- decode: a table per settle cost the server more than the arguments do). The
-- common shape is checked inline; a settle that fails it gets the full checks,
-- for their message.
local last = #ARGV
fault = (last - A + 1) % 7 ~= 0 and 'the settles must come 7 strings each' or nil
local byte = string.byte
for j = A, (fault and 0 or last), 7 do
  local c, res, pg, dur, ag = ARGV[j + 2], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5], ARGV[j + 6]
  local d = dur ~= '' and byte(dur) == 61 and finite(string.sub(dur, 2)) or nil
  if not (ARGV[j] ~= '' and ARGV[j + 1] ~= '' and whole(c)
      and (res == '' or byte(res) == 61) and (pg == '' or byte(pg) == 61)
      and (dur == '' or (d and d >= 0 and d <= MAX_DURATION))
      and (ag == '' or ag == '0' or ag == '1')) then
    fault = first(need(ARGV[j], 'job_id'), need(ARGV[j + 1], 'worker_id'),
      need_whole(c, 'the claim'), need_opt(res, 'the result'),
      need_opt(pg, 'the progress'), need_duration_opt(dur, 'the duration'),
      need_flag(ag, 'again'))
    fault = 'settle ' .. ((j - A) / 7 + 1) .. ': ' .. fault
    break
  end
end
if fault then return refuse('X_INVARIANT', fault) end
local n = (last - A + 1) / 7
local out = {}
local gone = {}      -- rows out of the running set
local ended = {}     -- queue -> {score, id, ...} for its done set
local settled = {}   -- queue -> rows that left running
local counted = {}   -- job name -> {settles, summed duration or nil, queue}
local dropped = {}   -- rows deleted (UNKEPT), out of the list indexes below
-- What every settle of this call shares, formatted once.
local nowf = fmt(NOW)
local kept = fmt(NOW + DONE_TTL)
local ttl = math.ceil(DONE_TTL)
for r = 0, n - 1 do
  local j = A + 7 * r
  local id, worker, claim = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local res, pg, dur = ARGV[j + 3], ARGV[j + 4], ARGV[j + 5]
  local jk = jobkey(id)
  local f = redis.call('HMGET', jk, 'st', 'w', 'c', 'le', 'q', 'name', 'lf', 'un', 'oa', 'hl', 'par', 'ns')
  if not (f[1] == 'running' and f[2] == worker and f[3] == claim and tonumber(f[4]) > NOW) then
    if ARGV[j + 6] == '1' and (settled_by(jk, claim)
        or (UNKEPT and redis.call('EXISTS', jk) == 0)) then
      out[r + 1] = 1
    else
      out[r + 1] = 0
    end
  else
    local q, name = f[5], f[6]
    gone[#gone + 1] = id
    if UNKEPT and not f[11] and f[8] ~= '1' then
      -- Not kept: the live key is free, the slots released, the row's keys
      -- deleted now (a later settle of the same id finds no row: refused).
      if f[7] and redis.call('HGET', P .. ':live', f[7]) == id then
        redis.call('HDEL', P .. ':live', f[7])
      end
      if f[10] then release_leases(id) end
      redis.call('DEL', jk, P .. ':steps:' .. id, P .. ':kids:' .. id)
      dropped[#dropped + 1] = id
    else
      -- The attempt log's open entry closes done: the fence held, so the
      -- entry is this claim's, open in its fields ('oe' closes it; see
      -- log_push). A row claimed before those fields holds it in 'al' instead:
      -- closed there (log_end), as before.
      local fields = {'st', 'done', 'sc', claim, 'upd', nowf}
      if f[9] then
        fields[#fields + 1] = 'oe'
        fields[#fields + 1] = nowf
      else
        log_end(jk, 'done', '', '')
      end
      if res ~= '' then
        fields[#fields + 1] = 'rs'
        fields[#fields + 1] = opt(res)
        redis.call('HDEL', jk, 'w', 'c')
      else
        redis.call('HDEL', jk, 'w', 'c', 'rs')
      end
      if pg ~= '' then
        fields[#fields + 1] = 'pg'
        fields[#fields + 1] = opt(pg)
      end
      redis.call('HSET', jk, unpack(fields))
      -- free_key, inline (the fields are read above).
      if f[7] and redis.call('HGET', P .. ':live', f[7]) == id then
        redis.call('HDEL', P .. ':live', f[7])
        if f[8] == '1' then
          redis.call('SET', P .. ':uniq:' .. f[7], id, 'EX', math.ceil(math.max(DONE_TTL, DEAD_TTL)))
        end
      end
      if f[11] then child_settled(jk, f[11]) end
      if f[10] then release_leases(id) end
      -- terminal(), with the sets written once per queue below.
      local e = ended[q] or {}
      e[#e + 1] = kept
      e[#e + 1] = id
      ended[q] = e
      redis.call('EXPIRE', jk, ttl)
      if f[12] ~= '1' then redis.call('EXPIRE', P .. ':steps:' .. id, ttl) end
    end
    settled[q] = (settled[q] or 0) + 1
    local c = counted[name] or {0, nil, q}
    c[1] = c[1] + 1
    if dur ~= '' then c[2] = (c[2] or 0) + tonumber(opt(dur)) end
    c[3] = q
    counted[name] = c
    out[r + 1] = 1
  end
end
if #gone > 0 then redis.call('ZREM', P .. ':running', unpack(gone)) end
for q, k in pairs(settled) do count(q, 'running', -k) end
for q, e in pairs(ended) do redis.call('ZADD', P .. ':term:' .. q .. ':done', unpack(e)) end
if #dropped > 0 then
  redis.call('ZREM', P .. ':all', unpack(dropped))
  redis.call('ZREM', P .. ':ids', unpack(dropped))
end
bump_many(counted, 'done')
return out

-- name: nack
-- The fenced hand-back: live again (ready/delayed/suspended, due at run_at or
-- now + delay) or for good (dead/failed). counted = 0 gives the attempt back.
-- ARGV[A + 15]: the busy lease key a 'wait' run waits on ('' for none);
-- ARGV[A + 16 .. A + 18]: the attempt's outcome, code and error line ('' none);
-- ARGV[A + 19]: wait_children ('1': suspended on its children), ARGV[A + 20]:
-- the wait it is suspended on (NackOptions.children_wait; '' for none: all).
local STATES = {ready = true, delayed = true, suspended = true, dead = true, failed = true}
fault = first(need(ARGV[A], 'job_id'), need(ARGV[A + 1], 'worker_id'),
  need_whole(ARGV[A + 2], 'the claim'),
  not STATES[ARGV[A + 3]] and 'the state must be ready, delayed, suspended, dead or failed' or nil,
  (ARGV[A + 4] ~= '0' and ARGV[A + 4] ~= '1') and "counted must be '0' or '1'" or nil,
  need_opt(ARGV[A + 5], 'max_attempts'),
  (ARGV[A + 5] or '') ~= '' and need_whole(string.sub(ARGV[A + 5], 2), 'max_attempts', 1) or nil,
  need_opt(ARGV[A + 6], 'the progress'), need_flag(ARGV[A + 7], 'set_error'),
  need_opt(ARGV[A + 8], 'the error code'), need_opt(ARGV[A + 9], 'the error'),
  need_instant_opt(ARGV[A + 10], 'run_at'), need_duration_opt(ARGV[A + 11], 'delay'),
  need_opt(ARGV[A + 12], 'the waited event'), need_duration_opt(ARGV[A + 13], 'the duration'),
  need_flag(ARGV[A + 14], 'again'), need_opt(ARGV[A + 15], 'the busy key'),
  need_str(ARGV[A + 16], 'the outcome'), need_str(ARGV[A + 17], 'the attempt code'),
  need_str(ARGV[A + 18], 'the error line'), need_flag(ARGV[A + 19] or '', 'wait_children'),
  need_opt(ARGV[A + 20] or '', 'children_wait'))
if fault then return refuse('X_INVARIANT', fault) end
local id, worker, claim, st = ARGV[A], ARGV[A + 1], ARGV[A + 2], ARGV[A + 3]
local counted, mx, pg, set_err = ARGV[A + 4], ARGV[A + 5], ARGV[A + 6], ARGV[A + 7]
local ec, em, run, delay = ARGV[A + 8], ARGV[A + 9], ARGV[A + 10], ARGV[A + 11]
local we, dur = ARGV[A + 12], ARGV[A + 13]
local jk = jobkey(id)
local f = owned(jk, worker, claim)
if not f then
  if ARGV[A + 14] == '1' and settled_by(jk, claim) then
    return {1, redis.call('HGET', jk, 'q'), 0}
  end
  return {0}
end
local q, name = f[5], f[6]
redis.call('ZREM', P .. ':running', id)
redis.call('HDEL', jk, 'w', 'c')
redis.call('HSET', jk, 'sc', claim)
redis.call('HSET', jk, 'upd', fmt(NOW))
if counted == '0' then redis.call('HINCRBY', jk, 'att', -1) end
if mx ~= '' then
  local cur = tonumber(redis.call('HGET', jk, 'max'))
  redis.call('HSET', jk, 'max', math.max(cur, tonumber(opt(mx))))
end
if pg ~= '' then redis.call('HSET', jk, 'pg', opt(pg)) end
if set_err == '1' then
  if ec ~= '' then redis.call('HSET', jk, 'ec', opt(ec)) else redis.call('HDEL', jk, 'ec') end
  if em ~= '' then redis.call('HSET', jk, 'em', opt(em)) else redis.call('HDEL', jk, 'em') end
end
log_end(jk, ARGV[A + 16], ARGV[A + 17], ARGV[A + 18])
release_leases(id)
if st == 'dead' or st == 'failed' then
  free_key(jk, id)
  terminal(jk, id, q, 'running', st)
  bump(name, st, opt(dur), q)
  return {1, q, 0}
end
local run_at
if run ~= '' then run_at = tonumber(opt(run)) else run_at = NOW + (tonumber(opt(delay)) or 0) end
local busy = opt(ARGV[A + 15])
if busy and st == 'ready' then
  -- A busy-key hand-back waits on the key while a live slot of it is held (a
  -- release wakes it: wake_waiter); a key that came free meanwhile: due now.
  if key_held(busy) then
    local g = redis.call('HMGET', jk, 'prio', 'seq')
    local bk = P .. ':busy:' .. busy
    redis.call('HSET', jk, 'bk', busy)
    redis.call('ZADD', bk, tonumber(g[1]), string.format('%012d', tonumber(g[2])) .. id)
    redis.call('EXPIRE', bk, 86400)  -- stale entries go a day after the last hand-back
  else
    run_at = NOW
  end
end
if ARGV[A + 19] == '1' then
  -- Suspended on its children (of one wait, or all): due at once when none
  -- is live as it lands.
  redis.call('HSET', jk, 'wc', 1)
  local cw = opt(ARGV[A + 20])
  local live
  if cw then
    redis.call('HSET', jk, 'cw', cw)
    live = redis.call('HGET', jk, 'kw:' .. cw)
  else
    redis.call('HDEL', jk, 'cw')
    live = redis.call('HGET', jk, 'kp')
  end
  if (tonumber(live) or 0) <= 0 then run_at = NOW end
else
  redis.call('HDEL', jk, 'wc', 'cw')
end
redis.call('HSET', jk, 'run', fmt(run_at))
if we ~= '' then
  redis.call('HSET', jk, 'we', opt(we))
  redis.call('SADD', P .. ':waiting:' .. opt(we), id)
else
  redis.call('HDEL', jk, 'we')
end
set_state(jk, q, 'running', st)
if counted == '1' then bump(name, 'retried', opt(dur), q) end
index(jk, id, q)
if run_at <= NOW then
  redis.call('PUBLISH', P .. ':wake', q)
  return {1, q, 1}
end
return {1, q, 0}

-- name: release_orphans
-- Rows running under this worker with a live lease and a claim it does not hold
-- (a claim whose reply never reached it took them): handed back uncounted, due
-- now, their slots released. ARGV[A] the worker, ARGV[A + 1] the error message,
-- ARGV[A + 2] its first line (for the attempt log), ARGV[A + 3 ...] the claims
-- it holds. Answers their ids.
fault = first(need(ARGV[A], 'worker_id'), need(ARGV[A + 1], 'the message'),
  need_str(ARGV[A + 2], 'the first line'))
for i = A + 3, #ARGV do fault = fault or need_whole(ARGV[i], 'a held claim') end
if fault then return refuse('X_INVARIANT', fault) end
local worker, msg, line = ARGV[A], ARGV[A + 1], ARGV[A + 2]
local held = {}
for i = A + 3, #ARGV do held[ARGV[i]] = true end
local out = {}
local ids = redis.call('ZRANGEBYSCORE', P .. ':running', '(' .. fmt(NOW), '+inf')
table.sort(ids)
for _, id in ipairs(ids) do
  local jk = jobkey(id)
  local f = redis.call('HMGET', jk, 'st', 'w', 'c', 'q')
  if f[1] == 'running' and f[2] == worker and not held[f[3]] then
    local q = f[4]
    redis.call('ZREM', P .. ':running', id)
    redis.call('HDEL', jk, 'w', 'c', 'bk', 'we')
    redis.call('HSET', jk, 'upd', fmt(NOW), 'run', fmt(NOW))
    redis.call('HINCRBY', jk, 'att', -1)
    redis.call('HSET', jk, 'ec', 'X_DRIVER_UNAVAILABLE', 'em', msg)
    log_end(jk, 'handed-back', 'X_DRIVER_UNAVAILABLE', line)
    release_leases(id)
    set_state(jk, q, 'running', 'ready')
    index(jk, id, q)
    redis.call('PUBLISH', P .. ':wake', q)
    out[#out + 1] = id
  end
end
return out

-- name: heartbeat
-- Renew each held row's lease and its concurrency slots: 'ok', 'lost' (not
-- ours any more) or 'cancelled', one per request. Each request also names the
-- step its run is in ('' : none) and since when, for the attempt log.
fault = first(need_positive(ARGV[A], 'visibility_timeout'), need_whole(ARGV[A + 1], 'the count', 0))
if not fault then
  local m = tonumber(ARGV[A + 1])
  if #ARGV ~= A + 1 + 6 * m then fault = 'the requests do not add up' end
  for r = 1, m do
    local b = A + 2 + (r - 1) * 6
    fault = fault or first(need(ARGV[b], 'job_id'), need(ARGV[b + 1], 'worker_id'),
      need_whole(ARGV[b + 2], 'the claim'), need_opt(ARGV[b + 3], 'the progress'),
      need_str(ARGV[b + 4], 'the step'), need_instant_or_empty(ARGV[b + 5], 'the step start'))
  end
end
if fault then return refuse('X_INVARIANT', fault) end
local vis = tonumber(ARGV[A])
local n = tonumber(ARGV[A + 1])
local out = {}
for r = 1, n do
  local b = A + 2 + (r - 1) * 6
  local id, worker, claim, pg = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local jk = jobkey(id)
  if owned(jk, worker, claim) then
    local le = NOW + vis
    redis.call('HSET', jk, 'le', fmt(le))
    redis.call('ZADD', P .. ':running', le, id)
    if pg ~= '' then redis.call('HSET', jk, 'pg', opt(pg)) end
    log_step(jk, ARGV[b + 4], ARGV[b + 5])
    for _, sk in ipairs(redis.call('SMEMBERS', P .. ':jl:' .. id)) do
      local j, w, c = parse_lease(redis.call('GET', sk))
      if j == id and w == worker and c == claim then
        redis.call('SET', sk, id .. '\n' .. worker .. '\n' .. claim .. '\n' .. fmt(le),
          'PX', math.ceil(math.max(vis * 2, vis + 60) * 1000))
      end
    end
    out[r] = 'ok'
  else
    local f = redis.call('HMGET', jk, 'st', 'w')
    if f[1] == 'cancelled' and not f[2] then out[r] = 'cancelled' else out[r] = 'lost' end
  end
end
return out

-- name: children
-- The rows ARGV[A ..] (a parent's children), in order: {state, result or
-- false, error code or false}, or {} for an id no row holds.
local out = {}
for i = A, #ARGV do
  local f = redis.call('HMGET', jobkey(ARGV[i]), 'st', 'rs', 'ec')
  if f[1] then out[#out + 1] = {f[1], f[2] or false, f[3] or false} else out[#out + 1] = {} end
end
return out

-- name: step_put
-- One step record, only while the fence holds the row (see put_step).
fault = first(need(ARGV[A], 'job_id'), need(ARGV[A + 1], 'worker_id'),
  need_whole(ARGV[A + 2], 'the claim'), need(ARGV[A + 3], 'the step name'),
  need_whole(ARGV[A + 4], 'the seq'), need(ARGV[A + 5], 'the record'))
if fault then return refuse('X_INVARIANT', fault) end
if put_step(ARGV[A], ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], ARGV[A + 4], ARGV[A + 5]) then
  return 1
end
return 0

-- name: publish
fault = first(need(ARGV[A], 'the event name'), need(ARGV[A + 1], 'the payload'))
if fault then return refuse('X_INVARIANT', fault) end
local woke = {}
publish_event(ARGV[A], ARGV[A + 1], woke)
announce(woke)
local qs = {}
for q, _ in pairs(woke) do qs[#qs + 1] = q end
return qs

-- name: poll
-- Events named ARGV[A] published at or after ARGV[A + 1], with the bus's now.
return {fmt(NOW), redis.call('ZRANGEBYSCORE', P .. ':events:' .. ARGV[A], ARGV[A + 1], '+inf', 'WITHSCORES')}

-- name: stats
local out = {}
for _, q in ipairs(redis.call('SMEMBERS', P .. ':queues')) do
  local row = {q, redis.call('HGETALL', P .. ':count:' .. q)}
  for _, st in ipairs({'done', 'failed', 'dead', 'cancelled'}) do
    local tk = P .. ':term:' .. q .. ':' .. st
    -- Rows past their retention: Redis expired them (or will within a
    -- second); out of the operator's indexes once they are gone.
    local expired = redis.call('ZRANGEBYSCORE', tk, '-inf', fmt(NOW), 'LIMIT', 0, 1000)
    for _, id in ipairs(expired) do
      if redis.call('EXISTS', jobkey(id)) == 0 then forget({id}) end
    end
    redis.call('ZREMRANGEBYSCORE', tk, '-inf', fmt(NOW))
    row[#row + 1] = st
    row[#row + 1] = redis.call('ZCARD', tk)
  end
  out[#out + 1] = row
end
return out

-- name: backfill_record
-- The backfill ledger (see drivers/_backfills.py): P:bf:<job id>, a hash (name,
-- pages, items, cursor as JSON, started_at, finished_at), and P:bfs, a sorted
-- set of job ids by started_at. Write one page of a pass: create its row
-- (started now), or move it forward. An existing row takes the write only when
-- `pages` is at least its own; `finished` ('1') stamps finished_at once.
-- ARGV[A..]: job id, name, pages, items, cursor (JSON), finished ('0' / '1').
fault = first(need(ARGV[A], 'job_id'), need(ARGV[A + 1], 'the backfill name'),
  need_whole(ARGV[A + 2], 'pages', 0), need_whole(ARGV[A + 3], 'items', 0),
  need(ARGV[A + 4], 'the cursor'),
  (ARGV[A + 5] ~= '0' and ARGV[A + 5] ~= '1') and "finished must be '0' or '1'" or nil)
if fault then return refuse('X_INVARIANT', fault) end
local bk = P .. ':bf:' .. ARGV[A]
local stored = redis.call('HGET', bk, 'pages')
if not stored then
  redis.call('HSET', bk, 'name', ARGV[A + 1], 'pages', ARGV[A + 2], 'items', ARGV[A + 3],
    'cursor', ARGV[A + 4], 'started_at', fmt(NOW))
  if ARGV[A + 5] == '1' then redis.call('HSET', bk, 'finished_at', fmt(NOW)) end
  redis.call('ZADD', P .. ':bfs', fmt(NOW), ARGV[A])
  return 1
end
if tonumber(ARGV[A + 2]) < tonumber(stored) then return 0 end
redis.call('HSET', bk, 'pages', ARGV[A + 2], 'items', ARGV[A + 3], 'cursor', ARGV[A + 4])
if ARGV[A + 5] == '1' and redis.call('HEXISTS', bk, 'finished_at') == 0 then
  redis.call('HSET', bk, 'finished_at', fmt(NOW))
end
return 1

-- name: backfill_list
-- The newest ARGV[A + 1] rows of the ledger (by started_at, then job id,
-- descending), of backfill ARGV[A] only when it is not ''. Each row:
-- {job id, name, pages, items, cursor, started_at, finished_at or ''}.
fault = first(need_str(ARGV[A], 'the backfill name'),
  need_whole(ARGV[A + 1], 'the limit', 1, 1000))
if fault then return refuse('X_INVARIANT', fault) end
local want, limit = ARGV[A], tonumber(ARGV[A + 1])
local out = {}
local start = 0
while #out < limit do
  local ids = redis.call('ZREVRANGE', P .. ':bfs', start, start + 199)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local h = redis.call('HMGET', P .. ':bf:' .. id,
      'name', 'pages', 'items', 'cursor', 'started_at', 'finished_at')
    if h[1] and (want == '' or h[1] == want) then
      out[#out + 1] = {id, h[1], h[2], h[3], h[4], h[5], h[6] or ''}
      if #out >= limit then break end
    end
  end
  start = start + 200
end
return out

-- name: backfill_rows
-- The rows of the passes ARGV[A..] (job ids; those the ledger holds), each as
-- backfill_list answers it.
local out = {}
for i = A, #ARGV do
  local h = redis.call('HMGET', P .. ':bf:' .. ARGV[i],
    'name', 'pages', 'items', 'cursor', 'started_at', 'finished_at')
  if h[1] then out[#out + 1] = {ARGV[i], h[1], h[2], h[3], h[4], h[5], h[6] or ''} end
end
return out

-- name: lease_acquire
-- Take a free slot of `key` (one not held, or whose holder's lease expired), or
-- keep the one this fence already holds. Answers {slot or -1, own}. Fenced
-- like every write: a claim that lapsed takes no slot.
fault = first(need(ARGV[A], 'the lease key'), need_whole(ARGV[A + 1], 'the limit', 1),
  need(ARGV[A + 2], 'job_id'), need(ARGV[A + 3], 'worker_id'),
  need_whole(ARGV[A + 4], 'the claim'), need_positive(ARGV[A + 5], 'the ttl'))
if fault then return refuse('X_INVARIANT', fault) end
local key, limit, job, worker, claim, ttl = ARGV[A], tonumber(ARGV[A + 1]), ARGV[A + 2], ARGV[A + 3], ARGV[A + 4], tonumber(ARGV[A + 5])
if not owned(jobkey(job), worker, claim) then return {-1, 0} end
local free = nil
local holders = {}
for slot = 0, limit - 1 do
  local sk = P .. ':lease:' .. key .. ':' .. slot
  local j, w, c, e = parse_lease(redis.call('GET', sk))
  if not j or e <= NOW then
    if not free then free = slot end
  elseif j == job and w == worker and c == claim then
    return {slot, 0}
  else
    holders[#holders + 1] = j
  end
end
if free then
  local sk = P .. ':lease:' .. key .. ':' .. free
  redis.call('SET', sk, job .. '\n' .. worker .. '\n' .. claim .. '\n' .. fmt(NOW + ttl),
    'PX', math.ceil(math.max(ttl * 2, ttl + 60) * 1000))
  redis.call('SADD', P .. ':jl:' .. job, sk)
  redis.call('SADD', P .. ':lslots:' .. key, sk)
  redis.call('HSET', jobkey(job), 'hl', 1)  -- the ack releases only rows that hold one
  return {free, 0}
end
local own = 1
for _, j in ipairs(holders) do
  if j ~= job then own = 0 end
end
if #holders == 0 then own = 0 end
return {-1, own}

-- name: lease_release
fault = need(ARGV[A], 'job_id')
if fault then return refuse('X_INVARIANT', fault) end
release_leases(ARGV[A])
return 1

-- name: lease_held
fault = need(ARGV[A], 'the lease key')
if fault then return refuse('X_INVARIANT', fault) end
local n = 0
local ls = P .. ':lslots:' .. ARGV[A]
for _, sk in ipairs(redis.call('SMEMBERS', ls)) do
  local j, w, c, e = parse_lease(redis.call('GET', sk))
  if not j then
    redis.call('SREM', ls, sk)
  elseif e > NOW then
    n = n + 1
  end
end
return n

-- name: rate_acquire
-- One acquisition of limiter ARGV[A] under key ARGV[A + 1]: at most ARGV[A + 2]
-- granted in any ARGV[A + 3] seconds. The window is a sorted set of the grants'
-- instants (the server's clock); those that left it are dropped first. Under the
-- limit, the grant is recorded and the key expires a second after its window
-- would empty. At it, nothing is recorded and the answer is the seconds until
-- this one's turn (at least 1 ms), the rule of drivers/_window.py: the wait
-- until the grant that must leave the window leaves, when that is at most
-- ARGV[A + 4] seconds; else a place in the queue of the refused, a hash
-- (base: the window's grants when it opened; queued: places promised) that
-- expires a second after its last promise. Place n comes back at
-- base[n % limit] + per * (1 + n / limit); the first refusal after the last
-- promise passed, or when the next place would come before a grant can leave,
-- opens a new queue. The name's length leads the keys, so no
-- name and key join into another pair's keys. Answers {1, '0'} or {0, '<seconds>'}.
fault = first(need(ARGV[A], 'the limiter name'), need_str(ARGV[A + 1], 'the key'),
  need_whole(ARGV[A + 2], 'the limit', 1), need_positive(ARGV[A + 3], 'the window'),
  need_positive(ARGV[A + 4], 'the exact wait'))
if fault then return refuse('X_INVARIANT', fault) end
local name, limit, per = ARGV[A], tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local pair = string.len(name) .. ':' .. name .. ':' .. ARGV[A + 1]
local rk = P .. ':rate:' .. pair
redis.call('ZREMRANGEBYSCORE', rk, '-inf', fmt(NOW - per))
local n = redis.call('ZCARD', rk)
if n < limit then
  local seq = redis.call('INCR', P .. ':rate:seq')
  redis.call('ZADD', rk, fmt(NOW), fmt(NOW) .. ':' .. seq)
  redis.call('PEXPIRE', rk, math.ceil(per * 1000) + 1000)
  return {1, '0'}
end
local leaving = redis.call('ZRANGE', rk, n - limit, n - limit, 'WITHSCORES')
local wait = tonumber(leaving[2]) + per - NOW
if wait <= tonumber(ARGV[A + 4]) then return {0, fmt(math.max(0.001, wait))} end
local qk = P .. ':rateq:' .. pair
local q = redis.call('HMGET', qk, 'base', 'queued')
local base = {}
for x in string.gmatch(q[1] or '', '[^ ]+') do base[#base + 1] = tonumber(x) end
local queued = tonumber(q[2] or '0') or 0
local function promise(i)
  return base[(i % limit) + 1] + per * (1 + math.floor(i / limit))
end
if queued == 0 or #base ~= limit or promise(queued - 1) <= NOW
    or promise(queued) < NOW + wait then
  -- no queue ahead (or another limit's), or one the window has outrun (others
  -- took its slots: its next place would come before a grant can leave):
  -- open one on this window
  local scores = redis.call('ZRANGE', rk, n - limit, n - 1, 'WITHSCORES')
  base = {}
  local text = {}
  for i = 2, #scores, 2 do
    base[#base + 1] = tonumber(scores[i])
    text[#text + 1] = scores[i]
  end
  queued = 0
  redis.call('HSET', qk, 'base', table.concat(text, ' '))
end
local at = promise(queued)
redis.call('HSET', qk, 'queued', queued + 1)
redis.call('PEXPIRE', qk, math.ceil((at - NOW) * 1000) + 1000)
return {0, fmt(math.max(0.001, at - NOW))}

-- name: counters
-- Minute buckets at or after ARGV[A + 1] for job ARGV[A] ('' for every job).
local out = {}
for _, b in ipairs(redis.call('ZRANGEBYSCORE', P .. ':cnt', ARGV[A + 1], '+inf')) do
  out[#out + 1] = {b, redis.call('HGETALL', P .. ':cnt:' .. b)}
end
return out

-- The operator surface's scripts (the driver's `introspect`: _introspect.py),
-- on the prelude of queue.lua.
--
-- Keys beside queue.lua's:
--   P:all                    every row: score = created_at, member = id (list pages)
--   P:ids                    every row: score 0, member = id (id prefixes, by ZRANGEBYLEX)
--   P:kids:<id>              the rows a run enqueued from step.invoke/step.gather, in order
--   P:uniq:<live key>        the newest settled row of a key enqueued with unique_for=
--   P:workers, P:wexp        live workers: id -> '<recorded at>\n<json>'; score = expiry
--
-- A row a retention expiry deleted leaves its id in P:all and P:ids; the
-- readers skip it and drop it (list, resolve_id, the bulk calls, stats).
--
-- A refusal of the row's state is an answer, not an error: {0, code, detail};
-- the driver raises the JobsError with the reference driver's message.

-- name: show
-- The row ARGV[A]: {fields, steps, children}, or {} when no row has that id.
return view(ARGV[A])

-- name: resolve_id
-- Up to six ids of rows that start with ARGV[A], in id order (six: enough to
-- say "at least" past the five a refusal names).
fault = need(ARGV[A], 'the prefix')
if fault then return refuse('X_INVARIANT', fault) end
local prefix = ARGV[A]
local out, stale = {}, {}
local offset = 0
while #out < 6 do
  local got = redis.call('ZRANGEBYLEX', P .. ':ids', '[' .. prefix, '[' .. prefix .. '\255',
    'LIMIT', offset, 50)
  if #got == 0 then break end
  for _, id in ipairs(got) do
    if redis.call('EXISTS', jobkey(id)) == 1 then
      out[#out + 1] = id
      if #out >= 6 then break end
    else
      stale[#stale + 1] = id
    end
  end
  offset = offset + #got
end
forget(stale)
return out

-- name: list
-- One stretch of a list page. ARGV[A ..]: queue, name, state, tenant (=value
-- or ''), id prefix, created_from, created_to ('' for none), the direction
-- ('first', 'after': older than the mark, 'before': newer), the mark's
-- created_at and id, how many rows are wanted, and how many index entries
-- this call may read. Rows come in the direction's order (newest first, or
-- for 'before' oldest first). Answers {rows (each as view answers it, without
-- steps), the last entry read's created_at and id, 1 when the index has no
-- more in that direction}.
fault = first(need_str(ARGV[A], 'the queue'), need_str(ARGV[A + 1], 'the name'),
  need_str(ARGV[A + 2], 'the state'), need_opt(ARGV[A + 3], 'the tenant'),
  need_str(ARGV[A + 4], 'the id prefix'),
  need_instant_or_empty(ARGV[A + 5], 'created_from'),
  need_instant_or_empty(ARGV[A + 6], 'created_to'),
  (ARGV[A + 7] ~= 'first' and ARGV[A + 7] ~= 'after' and ARGV[A + 7] ~= 'before')
    and "the direction must be 'first', 'after' or 'before'" or nil,
  need_whole(ARGV[A + 10], 'the rows wanted', 1, 1000),
  need_whole(ARGV[A + 11], 'the budget', 1, 100000))
if fault then return refuse('X_INVARIANT', fault) end
local fq, fname, fst, ftn, fid = ARGV[A], ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], ARGV[A + 4]
local cf, ct = tonumber(ARGV[A + 5]), tonumber(ARGV[A + 6])
local direction, mcr, mid = ARGV[A + 7], ARGV[A + 8], ARGV[A + 9]
local want, budget = tonumber(ARGV[A + 10]), tonumber(ARGV[A + 11])
local ak = P .. ':all'
-- The rank (0-based, newest first) the scan starts at.
local pos = 0
if direction ~= 'first' then
  local r = redis.call('ZREVRANK', ak, mid)
  if r then
    if direction == 'after' then pos = r + 1 else pos = r - 1 end
  else
    -- The mark's row is gone: the entries newer than it, counted.
    local newer = redis.call('ZCOUNT', ak, '(' .. mcr, '+inf')
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', ak, mcr, mcr)) do
      if m > mid then newer = newer + 1 end
    end
    if direction == 'after' then pos = newer else pos = newer - 1 end
  end
end
local step = 1
if direction == 'before' then step = -1 end
local rows, stale = {}, {}
local scanned, done = 0, 0
local last_cr, last_id = mcr, mid
while #rows < want and scanned < budget do
  if pos < 0 then done = 1 break end
  local lo, hi = pos, pos + 99
  if step < 0 then lo, hi = math.max(0, pos - 99), pos end
  local chunk = redis.call('ZREVRANGE', ak, lo, hi, 'WITHSCORES')
  if #chunk == 0 then done = 1 break end
  local n = #chunk / 2
  local stop = false
  for k = 1, n do
    local e = k
    if step < 0 then e = n - k + 1 end
    local id, score = chunk[2 * e - 1], tonumber(chunk[2 * e])
    scanned = scanned + 1
    last_id, last_cr = id, chunk[2 * e]
    if step > 0 and cf and score < cf then done = 1 stop = true break end
    if step < 0 and ct and score >= ct then done = 1 stop = true break end
    local inside = not (cf and score < cf) and not (ct and score >= ct)
    if inside then
      local h = redis.call('HGETALL', jobkey(id))
      if #h == 0 then
        stale[#stale + 1] = id
      else
        local t = {}
        for j = 1, #h, 2 do t[h[j]] = h[j + 1] end
        if (fq == '' or t.q == fq) and (fname == '' or t.name == fname)
            and (fst == '' or t.st == fst)
            and (ftn == '' or t.tn == opt(ftn))
            and (fid == '' or string.sub(id, 1, #fid) == fid) then
          rows[#rows + 1] = {h, {}, {}}
        end
      end
    end
    if #rows >= want or scanned >= budget then stop = true break end
  end
  if stop then break end
  pos = pos + step * n
end
forget(stale)
return {rows, last_cr, last_id, done}

-- name: requeue
-- ARGV[A] the id, ARGV[A + 1] the step to requeue from ('' for none): the
-- settled row is live again, ready now, its attempts and error cleared; with
-- a step, that step's record and every later one are deleted. Answers {1,
-- view} or {0, code, detail}.
fault = need(ARGV[A], 'job_id') or need_str(ARGV[A + 1], 'the step')
if fault then return refuse('X_INVARIANT', fault) end
local id, from_step = ARGV[A], ARGV[A + 1]
local jk = jobkey(id)
local f = redis.call('HMGET', jk, 'st', 'lf')
if not f[1] then return {0, 'X_JOB_NOT_FOUND'} end
if LIVE[f[1]] then return {0, 'X_JOB_NOT_REQUEUEABLE', f[1]} end
local held = live_holder(f[2])
if held and held ~= id then return {0, 'X_JOB_DUPLICATE', held} end
if from_step ~= '' then
  local sk = P .. ':steps:' .. id
  local rec = redis.call('HGET', sk, from_step)
  if not rec then return {0, 'X_INVARIANT', 'no step'} end
  local cut = tonumber(string.match(rec, '^(%-?%d+)\n'))
  local all = redis.call('HGETALL', sk)
  for j = 1, #all, 2 do
    if tonumber(string.match(all[j + 1], '^(%-?%d+)\n')) >= cut then
      redis.call('HDEL', sk, all[j])
    end
  end
end
requeue_row(id)
return {1, view(id)}

-- name: cancel
-- ARGV[A] the id, ARGV[A + 1] its last error, ARGV[A + 2] the attempt log's
-- line for a run cancelled while it ran, ARGV[A + 3] a child's last error.
-- The live row ends cancelled (its live key and slots freed; a running one's
-- claim fenced off), and so do its live children, and theirs. Answers {1,
-- view} or {0, code, state}.
fault = first(need(ARGV[A], 'job_id'), need(ARGV[A + 1], 'the error'),
  need(ARGV[A + 2], 'the line'), need(ARGV[A + 3], "a child's error"))
if fault then return refuse('X_INVARIANT', fault) end
local id = ARGV[A]
local st = redis.call('HGET', jobkey(id), 'st')
if not st then return {0, 'X_JOB_NOT_FOUND'} end
if not LIVE[st] then return {0, 'X_JOB_NOT_CANCELLABLE', st} end
cancel_row(id, ARGV[A + 1], ARGV[A + 2])
local todo = redis.call('LRANGE', P .. ':kids:' .. id, 0, -1)
local k = 1
while k <= #todo do
  local kid = todo[k]
  k = k + 1
  local kst = redis.call('HGET', jobkey(kid), 'st')
  if kst and LIVE[kst] then
    cancel_row(kid, ARGV[A + 3], ARGV[A + 2])
    for _, g in ipairs(redis.call('LRANGE', P .. ':kids:' .. kid, 0, -1)) do
      todo[#todo + 1] = g
    end
  end
end
return {1, view(id)}

-- name: remove
-- ARGV[A] the id: the row and its steps are deleted, unless it is running.
-- Answers {1} or {0, code}.
fault = need(ARGV[A], 'job_id')
if fault then return refuse('X_INVARIANT', fault) end
local st = redis.call('HGET', jobkey(ARGV[A]), 'st')
if not st then return {0, 'X_JOB_NOT_FOUND'} end
if st == 'running' then return {0, 'X_JOB_NOT_REMOVABLE'} end
drop_row(ARGV[A])
return {1}

-- name: promote
-- ARGV[A] the id: a delayed row, or a ready one backing off before a retry,
-- is due now (its claim says promoted). Answers {1, view} or {0, code, state}.
fault = need(ARGV[A], 'job_id')
if fault then return refuse('X_INVARIANT', fault) end
local f = redis.call('HMGET', jobkey(ARGV[A]), 'st', 'run')
if not f[1] then return {0, 'X_JOB_NOT_FOUND'} end
if not promotable(f[1], f[2]) then return {0, 'X_INVARIANT', f[1]} end
promote_row(ARGV[A])
return {1, view(ARGV[A])}

-- name: bulk
-- ARGV[A] the action ('remove', 'requeue', 'promote'), ARGV[A + 1] whether
-- to move rows ('1') or only preview them ('0'), ARGV[A + 2] the state,
-- ARGV[A + 3 .. A + 5] queue, name, tenant (=value or '' for any), ARGV[A + 6]
-- the most rows one call moves, ARGV[A + 7] how many to sample (a preview).
-- Rows are taken oldest first (created_at, then id). Moving: answers
-- {affected, remaining}; previewing: {count, sample (views, without steps)}.
local ACTIONS = {remove = true, requeue = true, promote = true}
fault = first(not ACTIONS[ARGV[A]] and 'the action must be remove, requeue or promote' or nil,
  need_flag(ARGV[A + 1], 'apply'), need(ARGV[A + 2], 'the state'),
  need_str(ARGV[A + 3], 'the queue'), need_str(ARGV[A + 4], 'the name'),
  need_opt(ARGV[A + 5], 'the tenant'), need_whole(ARGV[A + 6], 'the most rows', 1),
  need_whole(ARGV[A + 7], 'the sample', 0))
if fault then return refuse('X_INVARIANT', fault) end
local action, apply, st = ARGV[A], ARGV[A + 1] == '1', ARGV[A + 2]
local fq, fname, ftn = ARGV[A + 3], ARGV[A + 4], ARGV[A + 5]
local most, sample = tonumber(ARGV[A + 6]), tonumber(ARGV[A + 7])
local queues = {fq}
if fq == '' then queues = redis.call('SMEMBERS', P .. ':queues') end
local seen, found, stale = {}, {}, {}
local function consider(id, zk)
  if seen[id] then return end
  seen[id] = true
  local f = redis.call('HMGET', jobkey(id), 'st', 'q', 'name', 'tn', 'cr', 'lf', 'run')
  if not f[1] then
    if zk then redis.call('ZREM', zk, id) end
    stale[#stale + 1] = id
    return
  end
  if f[1] == st and (fq == '' or f[2] == fq) and (fname == '' or f[3] == fname)
      and (ftn == '' or f[4] == opt(ftn)) then
    found[#found + 1] = {id = id, cr = tonumber(f[5]), lf = f[6], run = f[7]}
  end
end
if st == 'running' then
  for _, id in ipairs(redis.call('ZRANGE', P .. ':running', 0, -1)) do consider(id) end
  queues = {}
end
for _, q in ipairs(queues) do
  if LIVE[st] then
    for _, m in ipairs(redis.call('ZRANGE', P .. ':ready:' .. q, 0, -1)) do
      consider(string.sub(m, 28))
    end
    for _, id in ipairs(redis.call('ZRANGE', P .. ':sched:' .. q, 0, -1)) do consider(id) end
  else
    local tk = P .. ':term:' .. q .. ':' .. st
    for _, id in ipairs(redis.call('ZRANGE', tk, 0, -1)) do consider(id, tk) end
  end
end
forget(stale)
table.sort(found, function(a, b)
  if a.cr ~= b.cr then return a.cr < b.cr end
  return a.id < b.id
end)
local rows = {}
if action == 'promote' then
  for _, r in ipairs(found) do
    if promotable(st, r.run) then rows[#rows + 1] = r end
  end
elseif action == 'requeue' then
  -- Per key no live row holds, its oldest row (the others then find it held).
  local taken = {}
  for _, r in ipairs(found) do
    if not taken[r.lf] and not live_holder(r.lf) then
      taken[r.lf] = true
      rows[#rows + 1] = r
    end
  end
else
  rows = found
end
if not apply then
  local out = {}
  for k = 1, math.min(sample, #rows) do
    local v = view(rows[k].id, true)
    if #v > 0 then out[#out + 1] = v end
  end
  return {#rows, out}
end
local moved = 0
for _, r in ipairs(rows) do
  if moved >= most then break end
  if action == 'remove' then drop_row(r.id)
  elseif action == 'promote' then promote_row(r.id)
  else requeue_row(r.id) end
  moved = moved + 1
end
local remaining = #rows - moved
if action == 'requeue' then
  remaining = 0
  for _, r in ipairs(found) do
    if redis.call('HGET', jobkey(r.id), 'st') == st and not live_holder(r.lf) then
      remaining = remaining + 1
    end
  end
end
return {moved, remaining}

-- name: resolve_step
-- ARGV[A] the id, ARGV[A + 1] the step, ARGV[A + 2] its record as the driver
-- read it, ARGV[A + 3] the record to write ('' deletes it): written only when
-- the row is not running and the record is still the one read. Answers 'ok',
-- 'running', 'gone' or 'changed'.
fault = first(need(ARGV[A], 'job_id'), need(ARGV[A + 1], 'the step'),
  need(ARGV[A + 2], 'the record read'), need_str(ARGV[A + 3], 'the record'))
if fault then return refuse('X_INVARIANT', fault) end
local st = redis.call('HGET', jobkey(ARGV[A]), 'st')
if not st then return 'gone' end
if st == 'running' then return 'running' end
local sk = P .. ':steps:' .. ARGV[A]
if redis.call('HGET', sk, ARGV[A + 1]) ~= ARGV[A + 2] then return 'changed' end
if ARGV[A + 3] == '' then
  redis.call('HDEL', sk, ARGV[A + 1])
else
  redis.call('HSET', sk, ARGV[A + 1], ARGV[A + 3])
  redis.call('HDEL', jobkey(ARGV[A]), 'ns')
end
return 'ok'

-- name: worker_put
-- ARGV[A] the worker's id, ARGV[A + 1] its info (JSON), ARGV[A + 2] seconds
-- it stays listed without another record.
fault = first(need(ARGV[A], 'the worker id'), need(ARGV[A + 1], 'the info'),
  need_positive(ARGV[A + 2], 'the ttl'))
if fault then return refuse('X_INVARIANT', fault) end
redis.call('HSET', P .. ':workers', ARGV[A], fmt(NOW) .. '\n' .. ARGV[A + 1])
redis.call('ZADD', P .. ':wexp', fmt(NOW + tonumber(ARGV[A + 2])), ARGV[A])
return 1

-- name: worker_remove
fault = need(ARGV[A], 'the worker id')
if fault then return refuse('X_INVARIANT', fault) end
redis.call('HDEL', P .. ':workers', ARGV[A])
redis.call('ZREM', P .. ':wexp', ARGV[A])
return 1

-- name: workers
-- The live workers ('<recorded at>\n<json>' each); the expired are dropped.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. ':wexp', '-inf', fmt(NOW))) do
  redis.call('HDEL', P .. ':workers', id)
  redis.call('ZREM', P .. ':wexp', id)
end
return redis.call('HVALS', P .. ':workers')

-- name: purge
-- Retention: delete up to ARGV[A + 2] settled rows and their steps, done ones
-- settled before ARGV[A], dead/failed/cancelled ones before ARGV[A + 1].
-- Answers how many went. A live row never goes (only settled rows are in
-- the sets read).
fault = first(need_instant_or_empty(ARGV[A], 'done_before') or need(ARGV[A], 'done_before'),
  need_instant_or_empty(ARGV[A + 1], 'dead_before') or need(ARGV[A + 1], 'dead_before'),
  need_whole(ARGV[A + 2], 'the limit', 0))
if fault then return refuse('X_INVARIANT', fault) end
local limit = tonumber(ARGV[A + 2])
local gone = 0
for _, q in ipairs(redis.call('SMEMBERS', P .. ':queues')) do
  for _, st in ipairs({'done', 'failed', 'dead', 'cancelled'}) do
    if gone >= limit then return gone end
    local cut = tonumber(ARGV[A + 1])
    local ttl = DEAD_TTL
    if st == 'done' then cut, ttl = tonumber(ARGV[A]), DONE_TTL end
    local tk = P .. ':term:' .. q .. ':' .. st
    -- A row settled at t is scored t + ttl: those settled before the cut.
    local ids = redis.call('ZRANGEBYSCORE', tk, '-inf', '(' .. fmt(cut + ttl), 'LIMIT', 0, limit - gone)
    for _, id in ipairs(ids) do
      local f = redis.call('HMGET', jobkey(id), 'st', 'upd')
      if not f[1] then
        redis.call('ZREM', tk, id)
        forget({id})
      elseif f[1] == st and tonumber(f[2]) < cut then
        drop_row(id)
        gone = gone + 1
      end
    end
  end
end
return gone

-- The Redis driver's task store (scheduled tasks): the leaders' leases, the
-- fires and the pauses. Each script runs after queue.lua's `prelude` (the same
-- four leading arguments, its checks, NOW, insert_row, holder, announce).
--
-- Keys (P is the prefix):
--   P:task:<name>   hash: sch (schedule), tz, cu (catch-up), q (queue), wm (the
--                   watermark: occurrences at or before it are decided), arm,
--                   lf / fa (the last occurrence fired, when), ld / le (the
--                   leader and its lease's expiry, on the server's clock)
--   P:tasks         set: every registered task name
--   P:task_paused   hash: paused task name -> when it was paused

-- name: task_lead
-- ARGV[A] leader, ARGV[A + 1] ttl, ARGV[A + 2] n, then n x (name, schedule, tz,
-- catch_up, queue). Registers each task (armed at NOW when new) and takes its
-- lease for the leader when free, lapsed or already the leader's. Answers per
-- task {name, leader, lease expiry, watermark, last fire, paused}.
local leader, ttl, n = ARGV[A], ARGV[A + 1], whole(ARGV[A + 2])
fault = first(need(leader, 'the leader'), need_positive(ttl, 'the ttl'),
  (n == nil or n < 0) and 'the task count must be a whole number' or nil,
  n and #ARGV ~= A + 2 + 5 * n and 'the tasks are incomplete' or nil)
if fault then return refuse('X_INVARIANT', fault) end
for i = 0, n - 1 do
  local b = A + 3 + 5 * i
  fault = first(need(ARGV[b], 'task ' .. (i + 1) .. ': name'),
    need(ARGV[b + 1], 'task ' .. (i + 1) .. ': schedule'),
    need(ARGV[b + 2], 'task ' .. (i + 1) .. ': tz'),
    need(ARGV[b + 3], 'task ' .. (i + 1) .. ': catch_up'),
    need(ARGV[b + 4], 'task ' .. (i + 1) .. ': queue'))
  if fault then return refuse('X_INVARIANT', fault) end
end
ttl = tonumber(ttl)
local out = {}
for i = 0, n - 1 do
  local b = A + 3 + 5 * i
  local name = ARGV[b]
  local tk = P .. ':task:' .. name
  if redis.call('EXISTS', tk) == 0 then
    redis.call('HSET', tk, 'wm', fmt(NOW), 'arm', fmt(NOW))
    redis.call('SADD', P .. ':tasks', name)
  end
  local f = redis.call('HMGET', tk, 'ld', 'le')
  if not f[1] or f[1] == leader or not f[2] or tonumber(f[2]) <= NOW then
    redis.call('HSET', tk, 'sch', ARGV[b + 1], 'tz', ARGV[b + 2], 'cu', ARGV[b + 3],
      'q', ARGV[b + 4], 'ld', leader, 'le', fmt(NOW + ttl))
  end
  local s = redis.call('HMGET', tk, 'ld', 'le', 'wm', 'lf')
  local paused = redis.call('HEXISTS', P .. ':task_paused', name)
  out[#out + 1] = {name, s[1] or '', s[2] or '', s[3], s[4] or '', paused}
end
return out

-- name: task_fire
-- ARGV[A] leader, ARGV[A + 1] the fire count, then per fire: name, the
-- watermark the leader holds, the new watermark, the last fire ('' or =<at>),
-- the row count and that many rows (insert_row's arguments). A fire lands only
-- while the leader holds the task's lease, its stored watermark is the one
-- given and it is not paused: then its rows are inserted (deduped on their
-- live key) and the watermark moves, in this one script. Answers {the names
-- that landed, the queues with rows due now}.
local leader, n = ARGV[A], whole(ARGV[A + 1])
fault = first(need(leader, 'the leader'),
  (n == nil or n < 0) and 'the fire count must be a whole number' or nil)
if fault then return refuse('X_INVARIANT', fault) end
local fires = {}
local i = A + 2
for k = 1, n do
  local name, wm, through, lf, rows = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], whole(ARGV[i + 4])
  fault = first(need(name, 'fire ' .. k .. ': name'),
    need_instant_or_empty(wm, 'fire ' .. k .. ': watermark') or need(wm, 'fire ' .. k .. ': watermark'),
    need_instant_or_empty(through, 'fire ' .. k .. ': through') or need(through, 'fire ' .. k .. ': through'),
    need_instant_opt(lf, 'fire ' .. k .. ': last_fire'),
    (rows == nil or rows < 0) and ('fire ' .. k .. ': the row count must be a whole number') or nil)
  if fault then return refuse('X_INVARIANT', fault) end
  fault = rows_fault(rows, i + 5)
  if fault then return refuse('X_JOB_INPUT_INVALID', 'fire ' .. k .. ': ' .. fault) end
  fires[k] = {name = name, wm = tonumber(wm), through = through, lf = lf, rows = rows, at = i + 5}
  i = i + 5 + rows * ROW
end
if #ARGV ~= i - 1 then return refuse('X_INVARIANT', 'extra arguments after the fires') end
local landed = {}
local woke = {}
for _, fire in ipairs(fires) do
  local tk = P .. ':task:' .. fire.name
  local f = redis.call('HMGET', tk, 'ld', 'le', 'wm')
  if f[1] == leader and f[2] and tonumber(f[2]) > NOW and f[3]
      and math.abs(tonumber(f[3]) - fire.wm) < 0.0000005
      and redis.call('HEXISTS', P .. ':task_paused', fire.name) == 0 then
    for r = 0, fire.rows - 1 do
      local at = fire.at + r * ROW
      local _, q = enqueue_row(at)
      if q then woke[q] = true end
    end
    redis.call('HSET', tk, 'wm', fmt(tonumber(fire.through)))
    if fire.lf ~= '' then
      redis.call('HSET', tk, 'lf', fmt(tonumber(opt(fire.lf))), 'fa', fmt(NOW))
    end
    landed[#landed + 1] = fire.name
  end
end
announce(woke)
local queues = {}
for q, _ in pairs(woke) do queues[#queues + 1] = q end
return {landed, queues}

-- name: task_release
-- ARGV[A] leader, then the task names: give up the leader's leases of them.
fault = need(ARGV[A], 'the leader')
if fault then return refuse('X_INVARIANT', fault) end
for i = A + 1, #ARGV do
  local tk = P .. ':task:' .. ARGV[i]
  if redis.call('HGET', tk, 'ld') == ARGV[A] then
    redis.call('HDEL', tk, 'ld', 'le')
  end
end
return 1

-- name: task_pause
fault = need(ARGV[A], 'the task name')
if fault then return refuse('X_INVARIANT', fault) end
redis.call('HSETNX', P .. ':task_paused', ARGV[A], fmt(NOW))
return 1

-- name: task_resume
fault = need(ARGV[A], 'the task name')
if fault then return refuse('X_INVARIANT', fault) end
redis.call('HDEL', P .. ':task_paused', ARGV[A])
return 1

-- name: task_rows
-- Every registered task: {name, sch, tz, cu, q, paused, wm, arm, lf, fa, ld, le}.
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', P .. ':tasks')) do
  local f = redis.call('HMGET', P .. ':task:' .. name, 'sch', 'tz', 'cu', 'q', 'wm', 'arm', 'lf', 'fa', 'ld', 'le')
  if f[5] then
    out[#out + 1] = {name, f[1] or '', f[2] or '', f[3] or '', f[4] or '',
      redis.call('HEXISTS', P .. ':task_paused', name), f[5], f[6] or f[5],
      f[7] or '', f[8] or '', f[9] or '', f[10] or ''}
  end
end
return out

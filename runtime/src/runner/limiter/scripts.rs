//! The limiter's Lua. Times are Redis's own clock (`TIME`, in ms), so
//! processes on machines whose clocks differ still share one window.

/// Checks every limit of a job and, only if all have room, takes them
/// all: all or nothing, in one script.
///
/// `KEYS[1]`: the plugin's `overrated` HASH; then per limit *i* two keys:
/// its ZSET (`KEYS[2i]`) and its turn counter (`KEYS[2i+1]`, a string of
/// Redis ms; unused by a concurrency limit). `ARGV[1]`: the member to add
/// (`identity:n`, unique); `ARGV[2]`: the horizon, ms; then per limit
/// three values: kind (`rate` or `concurrency`), the limit, and the window
/// (rate) or lease time (concurrency) in ms.
///
/// A rate ZSET is a sliding-window log of starts, **including starts
/// reserved in the next `horizon` ms**: a job need not start now to be
/// admitted, it is given the earliest start the window allows (the
/// `limit`-th newest entry's score plus the window, and never before the
/// newest entry, so each log only grows at its end and no window ever
/// holds more than `limit` entries). A start that has to wait is also at
/// least `window / limit` after the newest: an idle limit lets a burst of
/// `limit` jobs start at once, a backlog starts evenly spaced (rather than
/// in bursts of `limit` at each window's edge, which any clock jitter
/// would show as twice the rate). The first rate limit (the plugin's
/// own, if set) decides the start; every other limit must have room at
/// that start. Admitted, the job's start is logged in every rate ZSET and
/// it waits in its process until then.
///
/// A start beyond the horizon is a refusal with a *turn*: the rate's turn
/// counter hands out times one `window / limit` apart, so the jobs sent
/// back to `schedule` return at the rate instead of all at once. A
/// concurrency ZSET holds leases scored by their expiry: expired ones are
/// dropped (so a dead process's leases free themselves), and with `limit`
/// left every slot is taken.
///
/// Returns `{0, wait_ms}` when taken (the job starts in `wait_ms`, at most
/// the horizon), else `{i, wait_ms}` for the first limit *i* (1-based)
/// that refused: `wait_ms` until its turn for a rate, -1 for a
/// concurrency limit; the refusal is counted in the `overrated` HASH
/// under the kind.
pub(super) const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member = ARGV[1]
local horizon = tonumber(ARGV[2])
local n = (#KEYS - 1) / 2
local function kind(i) return ARGV[3 * i] end
local function limit(i) return tonumber(ARGV[3 * i + 1]) end
local function span(i) return tonumber(ARGV[3 * i + 2]) end
-- The earliest start, not before `from`, that rate log i allows; a start
-- that must wait (`even`) is also one window/limit after the newest.
local function earliest(i, from, even)
  local key = KEYS[2 * i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - span(i))
  local at = from
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) > at then at = tonumber(last[2]) end
  if redis.call('ZCARD', key) >= limit(i) then
    local nth = redis.call('ZRANGE', key, -limit(i), -limit(i), 'WITHSCORES')
    local free = tonumber(nth[2]) + span(i)
    if free > at then at = free end
  end
  if even and at > now and last[2] then
    local spaced = tonumber(last[2]) + span(i) / limit(i)
    if spaced > at then at = spaced end
  end
  return at
end
local function refuse(i, wait)
  redis.call('HINCRBY', KEYS[1], kind(i), 1)
  return {i, wait}
end
-- A turn in rate i's line, not before `from`: turns are one
-- window/limit apart, so jobs waiting in `schedule` come back at the rate.
local function turn(i, from)
  local key = KEYS[2 * i + 1]
  local at = tonumber(redis.call('GET', key)) or 0
  if from > at then at = from end
  local after = at + math.max(1, math.ceil(span(i) / limit(i)))
  redis.call('SET', key, string.format('%d', after), 'PX', after - now + span(i))
  return refuse(i, at - now)
end
local lead = 0
for i = 1, n do
  if kind(i) == 'rate' then lead = i break end
end
local start = now
if lead > 0 then
  start = earliest(lead, now, true)
  if start - now > horizon then return turn(lead, start) end
end
for i = 1, n do
  if i ~= lead then
    if kind(i) == 'rate' then
      local at = earliest(i, start, false)
      if at > start then return turn(i, at) end
    else
      local key = KEYS[2 * i]
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      if redis.call('ZCARD', key) >= limit(i) then return refuse(i, -1) end
    end
  end
end
for i = 1, n do
  local key = KEYS[2 * i]
  if kind(i) == 'rate' then
    redis.call('ZADD', key, start, member)
    redis.call('PEXPIRE', key, start - now + span(i))
  else
    redis.call('ZADD', key, now + span(i), member)
    redis.call('PEXPIRE', key, 2 * span(i))
  end
end
return {0, start - now}
";

/// Renews leases this process holds: `KEYS[i]` holds `ARGV[i + 1]`, its
/// expiry becomes now + `ARGV[1]` ms. A lease already gone (expired and
/// dropped) is not taken again (`XX`).
pub(super) const RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', now + ttl, ARGV[i + 1])
  redis.call('PEXPIRE', key, 2 * ttl)
end
return 0
";

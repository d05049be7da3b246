//! The limiter's Lua. Times are Redis's own clock (`TIME`, in ms), so
//! processes on machines whose clocks differ still share one window.

/// Checks every limit of a job and, only if all have room, takes them
/// all: all or nothing, in one script.
///
/// `KEYS[1]`: the plugin's `overrated` HASH; `KEYS[2..]`: one ZSET per
/// limit. `ARGV[1]`: the member to add (`identity:n`, unique); then per
/// limit *i* three values: kind (`rate` or `concurrency`), the limit, and
/// the window (rate) or lease time (concurrency) in ms.
///
/// A rate ZSET is a sliding-window log: entries older than the window are
/// dropped, and with `limit` entries left the window is full. A
/// concurrency ZSET holds leases scored by their expiry: expired ones are
/// dropped (so a dead process's leases free themselves), and with `limit`
/// left every slot is taken.
///
/// Returns `{0, 0}` when taken, else `{i, wait_ms}` for the first full
/// limit *i* (1-based; `wait_ms` until the oldest start leaves a rate's
/// window, -1 for a concurrency limit), after counting the refusal in the
/// `overrated` HASH under the kind.
pub(super) const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member = ARGV[1]
local n = #KEYS - 1
for i = 1, n do
  local key = KEYS[i + 1]
  local kind = ARGV[3 * i - 1]
  local limit = tonumber(ARGV[3 * i])
  local span = tonumber(ARGV[3 * i + 1])
  if kind == 'rate' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - span)
    if redis.call('ZCARD', key) >= limit then
      redis.call('HINCRBY', KEYS[1], kind, 1)
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      local wait = span
      if oldest[2] then wait = tonumber(oldest[2]) + span - now end
      return {i, wait}
    end
  else
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    if redis.call('ZCARD', key) >= limit then
      redis.call('HINCRBY', KEYS[1], kind, 1)
      return {i, -1}
    end
  end
end
for i = 1, n do
  local key = KEYS[i + 1]
  local span = tonumber(ARGV[3 * i + 1])
  if ARGV[3 * i - 1] == 'rate' then
    redis.call('ZADD', key, now, member)
    redis.call('PEXPIRE', key, span)
  else
    redis.call('ZADD', key, now + span, member)
    redis.call('PEXPIRE', key, 2 * span)
  end
end
return {0, 0}
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

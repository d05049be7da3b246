//! Every Lua script of the work protocol, in one place.
//!
//! Each runs atomically in Redis, which is what makes a move between two
//! keys safe when several processes race for the same job: whoever removes
//! the entry is the one who writes it elsewhere.

/// Moves up to ARGV[1] jobs from KEYS[2..] (in order) to KEYS[1] (reliable),
/// or pops them (basic, when ARGV[2] == "0"). Returns [queue index, job,
/// cancel mark, …].
///
/// The cancel mark saves a round trip per job. It is about the jid found
/// at the first `"jid":"` in the payload (compact JSON, as Sidekiq and
/// wasmjobs write it; [`crate::runner::fetched::script_jid`] finds the same
/// one): empty when there is none (the runner looks the job up itself),
/// `-` when no cancel is requested, `k…` with the value of
/// `cancelled-<jid>` (the Sidekiq wiki's key, which `wasmjobs cancel`
/// writes), `i…` with the `cancelled` field of `it-<jid>` (Sidekiq
/// 7.3.3+'s `cancel!`). The runner trusts a mark only if that jid is the
/// one it parses. One `EXISTS` per job in the common case (measured: the
/// script costs Redis ~2.5 µs per job against ~1 µs without marks);
/// `redis.pcall`: a key of another type is someone else's, not a reason
/// to fail a fetch.
pub const FETCH: &str = r#"
local max = tonumber(ARGV[1])
local keep = ARGV[2] == "1"
local function mark(job)
  local _, open = string.find(job, '"jid":"', 1, true)
  if not open then return '' end
  local close = string.find(job, '"', open + 1, true)
  if not close or close - open > 129 then return '' end
  local jid = string.sub(job, open + 1, close - 1)
  local asked, iteration = 'cancelled-' .. jid, 'it-' .. jid
  if redis.call('EXISTS', asked, iteration) == 0 then return '-' end
  local request = redis.pcall('GET', asked)
  if type(request) == 'string' then return 'k' .. request end
  local at = redis.pcall('HGET', iteration, 'cancelled')
  if type(at) == 'string' then return 'i' .. at end
  return '-'
end
local out = {}
local got = 0
for i = 2, #KEYS do
  local need = max - got
  if need <= 0 then break end
  local jobs = redis.call('RPOP', KEYS[i], need)
  if jobs then
    if keep then redis.call('LPUSH', KEYS[1], unpack(jobs)) end
    for _, job in ipairs(jobs) do
      out[#out + 1] = tostring(i - 2)
      out[#out + 1] = job
      out[#out + 1] = mark(job)
    end
    got = got + #jobs
  end
end
return out
"#;

/// Puts ARGV[2] at the front of the queue KEYS[2] (the next job fetched)
/// and adds ARGV[3] to the queue set KEYS[3] if ARGV[1] is still in the
/// in-progress list KEYS[1] (removing it); so a job acked at the same
/// moment is not requeued as well. Returns 1 if it moved.
pub(super) const REQUEUE: &str = r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return 1
end
return 0
"#;

/// Moves ARGV[1] from the sorted set KEYS[1] (`schedule`, `retry`) to the
/// back of the queue KEYS[2] as ARGV[2], and adds ARGV[3] to the queue set
/// KEYS[3], if it is still in the set. Returns 1 if it moved.
pub(super) const ENQUEUE_DUE: &str = r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return 1
end
return 0
"#;

/// The one bury. Adds ARGV[1] to the dead set KEYS[1] with score ARGV[2],
/// then trims the set as Sidekiq does: entries scored at or before ARGV[3]
/// (now − dead timeout) go, and only the newest ARGV[4] stay.
///
/// With a second key, the job is first removed from where it is: the
/// member ARGV[6] of the list (ARGV[5] == "list") or sorted set ("zset")
/// KEYS[2]; if it is no longer there (someone else moved it), nothing is
/// written and 0 is returned.
pub(super) const BURY: &str = r#"
if #KEYS == 2 then
  local removed
  if ARGV[5] == 'zset' then
    removed = redis.call('ZREM', KEYS[2], ARGV[6])
  else
    removed = redis.call('LREM', KEYS[2], -1, ARGV[6])
  end
  if removed == 0 then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
return 1
"#;

/// Forgets the dead owner ARGV[1] (in the owner set KEYS[2] and the origin
/// hash KEYS[3]) if its in-progress list KEYS[1] is empty. Returns 1 if it
/// did.
pub(super) const FORGET: &str = r#"
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 1
end
return 0
"#;

//! Every Lua script of the work protocol, in one place.
//!
//! Each runs atomically in Redis, which is what makes a move between two
//! keys safe when several processes race for the same job: whoever removes
//! the entry is the one who writes it elsewhere.

/// The Lua function `jid_of(text)`: the value of the first `"jid"` key in
/// the JSON text, with any whitespace around its colon (`"jid":"…"` as
/// Sidekiq and wasmjobs write it, `"jid": "…"` as Python's `json.dumps`
/// and many other clients do), at most 128 bytes; nil when there is none.
/// A `"jid"` inside an argument may come first: the runner compares the
/// jid with the one it parses ([`crate::runner::fetched::script_jid`] is
/// this function, byte for byte).
///
/// `"jid"` (starting at or after `from`) is found as `jid"` preceded by
/// a quote: Lua's plain `string.find` looks for the first byte with
/// `memchr` and compares the rest at each hit, and a `"` starts every key
/// and string of a payload while a `j` is rare. (An ActiveJob wrapper has
/// its `jid` after its `args`: about 70 quotes in, 3 `j`s.)
macro_rules! jid_of_lua {
    () => {
        r#"
local function jid_of(text)
  local from = 1
  while true do
    local at, key = string.find(text, 'jid"', from + 1, true)
    if not at then return nil end
    if string.byte(text, at - 1) == 34 then
      local _, open = string.find(text, '^%s*:%s*"', key + 1)
      if open then
        local close = string.find(text, '"', open + 1, true)
        if not close or close - open > 129 then return nil end
        return string.sub(text, open + 1, close - 1)
      end
      from = key + 1
    else
      from = at
    end
  end
end
"#
    };
}

/// The Lua function `bury_oversized(job, dead, at)` the scripts that take
/// jobs share: it adds the job `job`, larger than the limit, to the dead
/// set `dead` without it ever leaving Redis, and trims the set as
/// [`BURY`] does. Its settings are four arguments from ARGV[at]: the
/// limit in bytes, the time now, the dead set's oldest score kept and its
/// most entries (`DeadSet::cap_args`). The entry keeps every byte: a JSON
/// object gets the error fields appended before its closing brace (a key
/// that appears twice is read as its last value by Sidekiq and
/// wasmjobs), anything else is wrapped whole as `payload`; `failed_at`
/// is in the payload's own style (integer milliseconds when its
/// `created_at` is, as Sidekiq 8 writes it). Returns
/// `o<size> <jid>` (the jid found near either end, else empty) for the
/// runner's log.
macro_rules! bury_oversized_lua {
    () => {
        concat!(
            jid_of_lua!(),
            r#"
local function bury_oversized(job, dead, at)
  local max, now, before, keep = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local size = #job
  local jid = jid_of(string.sub(job, -4096)) or jid_of(string.sub(job, 1, 4096)) or ''
  -- failed_at in the payload's own style: integer milliseconds when its
  -- created_at (else enqueued_at) is (Sidekiq 8), float seconds otherwise.
  -- Sidekiq writes them after args, so the last one near the end is the
  -- job's own, not one inside its arguments.
  local failed_at = now
  local last_4k = string.sub(job, -4096)
  local function last_stamp(key)
    local found
    for value in string.gmatch(last_4k, '"' .. key .. '"%s*:%s*([%d%.eE+-]+)') do
      found = value
    end
    return found
  end
  local stamp = last_stamp('created_at') or last_stamp('enqueued_at') or
    string.match(string.sub(job, 1, 4096), '"created_at"%s*:%s*([%d%.eE+-]+)')
  if stamp and not string.find(stamp, '[%.eE]') and #stamp >= 12 then
    failed_at = string.format('%.0f', math.floor(tonumber(now) * 1000))
  end
  local reason = 'payload of ' .. size .. ' bytes is larger than the ' .. max ..
    ' a job may have (wasmjobs run --max-payload); not run, kept whole'
  local entry
  local tail = string.sub(job, -64)
  local close = string.find(tail, '}%s*$')
  if string.sub(job, 1, 1) == '{' and close then
    local cut = size - #tail + close - 1
    entry = string.sub(job, 1, cut) .. ',"error_class":"wasmjobs::PayloadTooLarge","error_message":' ..
      cjson.encode(reason) .. ',"failed_at":' .. failed_at .. ',"payload_bytes":' .. size .. '}'
  else
    entry = cjson.encode({class = 'wasmjobs::PayloadTooLarge', args = {}, jid = jid,
      error_class = 'wasmjobs::PayloadTooLarge', error_message = reason, failed_at = tonumber(now),
      payload_bytes = size, payload = job})
  end
  redis.call('ZADD', dead, now, entry)
  redis.call('ZREMRANGEBYSCORE', dead, '-inf', before)
  redis.call('ZREMRANGEBYRANK', dead, 0, -(tonumber(keep) + 1))
  return 'o' .. size .. ' ' .. jid
end
"#
        )
    };
}

/// Moves up to ARGV[1] jobs from the queues KEYS[4..] (in order) to the
/// in-progress list KEYS[1] (reliable), or pops them (basic, when ARGV[2]
/// == "0"). Returns `[runs, marks, job, …]`: `runs` lists where the jobs
/// came from as pairs (position of the queue among KEYS[4..] from 0, how
/// many jobs in a row came from it); `marks` is `0` when no job has a
/// mark, else one mark per job. Sending the queue and the mark once per
/// fetch instead of once per job keeps the reply to one value a job, as
/// it was before cancel marks (each value costs the script a table entry
/// and both sides a RESP element).
///
/// **Sorted** (reliable, ARGV[4] == "1", and no marks to look for): the
/// jobs of the first queue that has any go to the empty batch list
/// KEYS[3] instead (`runner/source/batches.rs`), without their bytes
/// entering Lua: `SORT … BY nosort DESC LIMIT 0 n STORE` copies the
/// oldest *n* (a list's tail is its oldest end), and `LTRIM` cuts them
/// off the queue. The reply is then `[[position, count], -1, note, …]`:
/// the jobs are read with an `LRANGE` of KEYS[3] pipelined behind the
/// script, and the notes are those of the jobs buried as oversized.
///
/// A queue key of another type (any client can write one) is left as it
/// was and skipped, and the other queues are fetched: the runs name it as
/// `(position, -1)`, in either reply. One that `SORT` reads anyway (a
/// set) has its copy deleted. A Redis that
/// refuses `SORT` (renamed, or denied by an ACL) gets the jobs moved the
/// old way, and one whose `MEMORY USAGE` is refused has Lua look at each
/// payload's size.
///
/// A job larger than ARGV[5] bytes (0 or absent: no limit) is not taken:
/// it goes to the dead set KEYS[#KEYS] from inside Redis
/// (`bury_oversized`, settings from ARGV[5]), and its entry in the
/// reply is an empty job with the mark `o<size> <jid>`. A huge payload
/// never crosses the network, so it cannot swell the runner's memory, and
/// is never written into the heartbeat's `work` hash. The sorted path
/// looks at payloads only when the batch list's `MEMORY USAGE` is above
/// the limit (then Lua reads the list, buries the large ones and drops
/// them from it).
///
/// The cancel mark saves a round trip per job, and is only looked for
/// when a request may exist that this process would not hear of: when
/// ARGV[3] == "1" (`run --sidekiq-cancels`: Ruby clients write requests
/// and announce nothing), or when the ZSET KEYS[2] holds a request of
/// `wasmjobs cancel` that is not resolved yet (score: when it expires, by
/// Redis's clock, as `wasmjobs cancel` scores it). One `ZCARD` a call
/// tells, in the common case of none; when there are some, the expired
/// ones are dropped first (so one left by a request that never closed
/// costs this only until it expires). Otherwise no job has a mark (`n`,
/// none to look for) and the script does no work per job for cancels. A
/// mark is about the jid `jid_of`
/// finds (`"jid":"…"` with or without spaces around the colon;
/// [`crate::runner::fetched::script_jid`] finds the same one): empty when
/// there is none (the runner looks the job up itself), `-` when no cancel
/// is requested, `k…` with the value of `cancelled-<jid>` (the Sidekiq
/// wiki's key, which `wasmjobs cancel` writes), `i…` with the `cancelled`
/// field of `it-<jid>` (Sidekiq 7.3.3+'s `cancel!`). The runner trusts a
/// mark only if that jid is the one it parses. One `EXISTS` over both keys
/// of every job taken (up to 1,000 keys a call) answers the common case,
/// no request for any of them; only when one exists is each job looked at
/// alone. `redis.pcall`: a key of another type is someone else's, not a
/// reason to fail a fetch (a KEYS[2] of another type turns the marks on).
/// The runner reads the reply with `crate::runner::source::take`'s
/// `read_reply`.
pub const FETCH: &str = concat!(
    bury_oversized_lua!(),
    r#"
local max = tonumber(ARGV[1])
local keep = ARGV[2] == "1"
local marks = ARGV[3] == "1"
if not marks then
  local open = redis.pcall('ZCARD', KEYS[2])
  if type(open) ~= 'number' then
    marks = true
  elseif open > 0 then
    marks = open - redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', redis.call('TIME')[1]) > 0
  end
end
local most = tonumber(ARGV[5]) or 0
local queues = #KEYS
if most > 0 then queues = #KEYS - 1 end
local sorted = keep and not marks and ARGV[4] == "1"
-- Queue keys of another type (another client's): left alone and skipped,
-- each named in the runs as (position, -1); the other queues are fetched.
local wrong = {}
if sorted then
  for i = 4, queues do
    local n = redis.pcall('SORT', KEYS[i], 'BY', 'nosort', 'DESC', 'LIMIT', 0, max, 'STORE', KEYS[3])
    if type(n) ~= 'number' then
      -- A SORT this Redis refuses (renamed, denied by an ACL) leaves the
      -- jobs to the path below.
      if not string.find(n.err, 'WRONGTYPE', 1, true) then
        sorted = false
        wrong = {}
        break
      end
      wrong[#wrong + 1] = i - 4
      wrong[#wrong + 1] = -1
      n = 0
    end
    local trimmed = n > 0 and redis.pcall('LTRIM', KEYS[i], 0, -(n + 1))
    if type(trimmed) == 'table' and trimmed.err then
      -- SORT reads a set too: its copy goes, the set stays as it was.
      redis.call('DEL', KEYS[3])
      wrong[#wrong + 1] = i - 4
      wrong[#wrong + 1] = -1
    elseif n > 0 then
      wrong[#wrong + 1] = i - 4
      wrong[#wrong + 1] = n
      local out = {wrong, -1}
      if most > 0 then
        local usage = redis.pcall('MEMORY', 'USAGE', KEYS[3], 'SAMPLES', 0)
        if type(usage) ~= 'number' or usage > most then
          for _, job in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
            if #job > most then
              redis.call('LREM', KEYS[3], 1, job)
              out[#out + 1] = bury_oversized(job, KEYS[#KEYS], 5)
            end
          end
          wrong[#wrong] = n - (#out - 2)
        end
      end
      return out
    end
  end
  if sorted then return {wrong, -1} end
end
local function request_of(jid)
  local asked, iteration = 'cancelled-' .. jid, 'it-' .. jid
  if redis.call('EXISTS', asked, iteration) == 0 then return '-' end
  local request = redis.pcall('GET', asked)
  if type(request) == 'string' then return 'k' .. request end
  local at = redis.pcall('HGET', iteration, 'cancelled')
  if type(at) == 'string' then return 'i' .. at end
  return '-'
end
local runs = wrong
local out = {runs, 0}
local notes = {}
local noted = marks
local jids = {}
local keys = {}
local got = 0
for i = 4, queues do
  local need = max - got
  if need <= 0 then break end
  local jobs = redis.pcall('RPOP', KEYS[i], need)
  if type(jobs) == 'table' and jobs.err then
    if not string.find(jobs.err, 'WRONGTYPE', 1, true) then return jobs end
    runs[#runs + 1] = i - 4
    runs[#runs + 1] = -1
    jobs = false
  end
  if jobs then
    local held = jobs
    if most > 0 then
      for _, job in ipairs(jobs) do
        if #job > most then
          held = {}
          for _, kept in ipairs(jobs) do
            if #kept <= most then held[#held + 1] = kept end
          end
          break
        end
      end
    end
    if keep and #held > 0 then redis.call('LPUSH', KEYS[1], unpack(held)) end
    runs[#runs + 1] = i - 4
    runs[#runs + 1] = #jobs
    for _, job in ipairs(jobs) do
      got = got + 1
      if most > 0 and #job > most then
        out[got + 2] = ''
        notes[got] = bury_oversized(job, KEYS[#KEYS], 5)
        noted = true
      else
        out[got + 2] = job
        if marks then
          notes[got] = ''
          local jid = jid_of(job)
          if jid then
            jids[got] = jid
            keys[#keys + 1] = 'cancelled-' .. jid
            keys[#keys + 1] = 'it-' .. jid
          end
        end
      end
    end
  end
end
local asked = false
for first = 1, #keys, 1000 do
  if redis.call('EXISTS', unpack(keys, first, math.min(first + 999, #keys))) > 0 then
    asked = true
    break
  end
end
for at, jid in pairs(jids) do
  if asked then notes[at] = request_of(jid) else notes[at] = '-' end
end
if noted then
  for at = 1, got do
    if not notes[at] then notes[at] = 'n' end
  end
  out[2] = notes
end
return out
"#
);

/// The lengths of the queues KEYS, summed; a key of another type counts
/// as empty (`--exit-when-empty`).
pub(super) const WAITING: &str = r#"
local n = 0
for i = 1, #KEYS do
  local len = redis.pcall('LLEN', KEYS[i])
  if type(len) == 'number' then n = n + len end
end
return n
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

/// The next due members of the sorted set KEYS[1] (`schedule`, `retry`):
/// up to ARGV[1] scored at or before ARGV[3] (the time now, which the
/// settings from ARGV[2] carry). A member larger than ARGV[2] bytes (0: no
/// limit) is moved to the dead set KEYS[2] inside Redis instead
/// (`bury_oversized`) and not returned, so the poller never reads it.
/// Returns the members.
pub(super) const DUE: &str = concat!(
    bury_oversized_lua!(),
    r#"
local most = tonumber(ARGV[2]) or 0
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3], 'LIMIT', 0, tonumber(ARGV[1]))
if most == 0 then return members end
local out = {}
for _, member in ipairs(members) do
  if #member > most then
    redis.call('ZREM', KEYS[1], member)
    bury_oversized(member, KEYS[2], 2)
  else
    out[#out + 1] = member
  end
end
return out
"#
);

/// Buries a job over the limit that a blocking wait moved into the list
/// KEYS[2] (an in-progress list), found there by its length ARGV[1], its
/// first bytes ARGV[2] and its last bytes ARGV[3], so its bytes need not
/// be sent back: it is removed and buried inside Redis (`bury_oversized`,
/// dead set KEYS[1], settings from ARGV[4]). A blocking move pushes to the
/// list's head, so the search starts there. Returns the mark, or false if
/// no such entry is there any more.
pub(super) const BURY_OVERSIZED_HELD: &str = concat!(
    bury_oversized_lua!(),
    r#"
local size, head, tail = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local n = redis.call('LLEN', KEYS[2])
for i = 0, n - 1 do
  local item = redis.call('LINDEX', KEYS[2], i)
  if item and #item == size and string.sub(item, 1, #head) == head and string.sub(item, -#tail) == tail then
    redis.call('LREM', KEYS[2], 1, item)
    return bury_oversized(item, KEYS[1], 4)
  end
end
return false
"#
);

/// Buries ARGV[1], a job over the limit that a blocking wait popped (basic
/// fetch: it is nowhere in Redis any more), with `bury_oversized` (dead
/// set KEYS[1], settings from ARGV[2]). Returns the mark.
pub(super) const BURY_OVERSIZED_POPPED: &str = concat!(
    bury_oversized_lua!(),
    r#"
return bury_oversized(ARGV[1], KEYS[1], 2)
"#
);

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

/// Forgets the dead owner ARGV[1] (in the owner sets KEYS[#KEYS - 2] and
/// KEYS[#KEYS - 1], and the origin hash KEYS[#KEYS]) if its lists
/// KEYS[1..#KEYS - 3] (its in-progress list and batch lists) are all
/// empty. Returns 1 if it did.
pub(super) const FORGET: &str = r#"
for i = 1, #KEYS - 3 do
  if redis.call('LLEN', KEYS[i]) > 0 then return 0 end
end
redis.call('SREM', KEYS[#KEYS - 2], ARGV[1])
redis.call('SREM', KEYS[#KEYS - 1], ARGV[1])
redis.call('HDEL', KEYS[#KEYS], ARGV[1])
return 1
"#;

#[cfg(test)]
mod tests {
    use crate::redis::Target;
    use crate::runner::fetched::script_jid;

    /// The Lua `jid_of` and the runner's [`script_jid`] find the same jid
    /// (the runner trusts a cancel mark only then), run on a real Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_scripts_jid_is_the_runners() {
        let data = tempfile::tempdir().expect("tempdir");
        let redis = crate::redis::connect(&Target::Embedded(data.path().to_path_buf()))
            .await
            .expect("the embedded redis-server");
        let mut conn = redis.conn();
        let script = redis::Script::new(concat!(jid_of_lua!(), "return jid_of(ARGV[1]) or false"));
        let long = format!(r#"{{"jid":"{}"}}"#, "x".repeat(129));
        let longest = format!(r#"{{"jid":"{}"}}"#, "x".repeat(128));
        let wrapper = r#"{"class":"Sidekiq::ActiveJob::Wrapper","wrapped":"J","args":[{"job_class":"J","job_id":"u","arguments":["jid",{"jid":5}]}],"jid":"real"}"#;
        for text in [
            r#"{"jid":"abc"}"#,
            r#"{"jid": "abc"}"#,
            "{\"jid\" \t:\n \"abc\"}",
            r#"{"args": ["jid", "jid"], "jid" : "real"}"#,
            r#"{"jid": 5}"#,
            r#"{"jid":"unterminated"#,
            r#""jid"jid": "x""#,
            r#"jid"jid":"x""#,
            r#""jid""jid":"y""#,
            r#"{"xjid":"no","jid":"yes"}"#,
            r#"jid":"a""#,
            r#""jid":"first""#,
            "",
            "jid",
            long.as_str(),
            longest.as_str(),
            wrapper,
        ] {
            let lua: Option<String> = script.arg(text).invoke_async(&mut conn).await.expect("EVAL");
            assert_eq!(lua, script_jid(text.as_bytes()), "{text:?}");
        }
        assert_eq!(script_jid(wrapper.as_bytes()).as_deref(), Some("real"));
    }
}

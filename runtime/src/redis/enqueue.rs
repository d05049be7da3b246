//! The one way a job moves from a sorted set into its queue.
//!
//! The job source's poller moving due jobs out of `schedule` and `retry`
//! (`runner::source::due`) and the dashboard's "Retry now" / "Add to queue"
//! (`super::admin::enqueue_now`) run the same script: remove the exact
//! member from the set and, only if this call removed it, push the job
//! (possibly rewritten: a fresh `enqueued_at`) and register its queue. So
//! when several processes or clicks race, a job is enqueued exactly once.

/// KEYS: the sorted set, the queue's list, `queues`. ARGV: the member's
/// bytes, the payload to push, the queue's name. Moves ARGV[1] from
/// KEYS[1] to the back of the queue KEYS[2] as ARGV[2] and adds ARGV[3] to
/// KEYS[3], if it is still in the set. Returns 1 if it moved, 0 if another
/// mover took it first.
pub(crate) const ENQUEUE_DUE: &str = r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return 1
end
return 0
"#;

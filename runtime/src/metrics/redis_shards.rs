//! Whether each Redis shard answers (`wasmjobs_shard_up{shard}`), as the
//! heartbeat of each shard last found it. Empty with one Redis: the
//! family is then not shown.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Each shard's health, by name.
#[derive(Debug, Default)]
pub struct RedisShards {
    up: Mutex<BTreeMap<String, bool>>,
}

impl RedisShards {
    /// Notes whether shard `name` answered its last heartbeat.
    pub fn set(&self, name: &str, up: bool) {
        let mut shards = self.up.lock().unwrap_or_else(PoisonError::into_inner);
        match shards.get_mut(name) {
            Some(was) => *was = up,
            None => {
                shards.insert(name.to_owned(), up);
            }
        }
    }

    /// (name, up), sorted by name.
    pub fn snapshot(&self) -> Vec<(String, bool)> {
        let shards = self.up.lock().unwrap_or_else(PoisonError::into_inner);
        shards.iter().map(|(name, up)| (name.clone(), *up)).collect()
    }
}

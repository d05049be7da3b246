//! Jobs rescheduled because a cluster limit refused them
//! (`runner::limiter`), by plugin and reason. Recorded once per refusal,
//! never on the path of a job that runs; always on (it costs nothing
//! when no plugin has limits). Labels are bounded: plugin names come from
//! the plugins directory, reasons are `rate`, `concurrency` and
//! `unavailable` (Redis did not answer the check).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Refusal counts.
#[derive(Debug, Default)]
pub struct LimitedCounts {
    counts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl LimitedCounts {
    /// Counts one refusal of a job of `plugin` for `reason`.
    pub fn add(&self, plugin: &str, reason: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        match counts.get_mut(&(plugin.to_owned(), reason)) {
            Some(count) => *count += 1,
            None => {
                counts.insert((plugin.to_owned(), reason), 1);
            }
        }
    }

    /// (plugin, reason, count), sorted.
    pub fn snapshot(&self) -> Vec<(String, &'static str, u64)> {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .iter()
            .map(|((plugin, reason), count)| (plugin.clone(), *reason, *count))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_plugin_and_reason() {
        let counts = LimitedCounts::default();
        counts.add("b", "rate");
        counts.add("a", "concurrency");
        counts.add("b", "rate");
        assert_eq!(
            counts.snapshot(),
            [("a".to_owned(), "concurrency", 1), ("b".to_owned(), "rate", 2)]
        );
    }
}

//! Which queues to fetch from, and in what order (`--queues`).
//!
//! As in Sidekiq: `a,b,c` is strict priority (drain `a` before looking at
//! `b`); `a:3,b:1` is weighted (each fetch takes a random order in which `a`
//! comes first three times as often as `b`), so no queue starves.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Result, bail};
use rand::Rng;

/// The queues a process serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queues {
    entries: Vec<(String, u32)>,
    weighted: bool,
}

impl Default for Queues {
    fn default() -> Self {
        Self {
            entries: vec![(crate::job::DEFAULT_QUEUE.into(), 1)],
            weighted: false,
        }
    }
}

impl FromStr for Queues {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        let mut entries: Vec<(String, u32)> = Vec::new();
        let mut weighted = false;
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = match part.rsplit_once(':') {
                Some((name, weight)) => {
                    let weight: u32 = weight
                        .parse()
                        .map_err(|_| anyhow::anyhow!("queue {part:?}: the weight after ':' must be a whole number"))?;
                    if weight == 0 {
                        bail!("queue {part:?}: weight must be at least 1");
                    }
                    weighted = true;
                    (name.trim(), weight)
                }
                None => (part, 1),
            };
            if name.is_empty() || name.contains(char::is_whitespace) {
                bail!("queue name {name:?} is empty or contains spaces");
            }
            if entries.iter().any(|(n, _)| n == name) {
                bail!("queue {name:?} is listed twice");
            }
            entries.push((name.to_owned(), weight));
        }
        if entries.is_empty() {
            bail!("--queues lists no queue");
        }
        Ok(Self { entries, weighted })
    }
}

impl fmt::Display for Queues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .entries
            .iter()
            .map(|(n, w)| if self.weighted { format!("{n}:{w}") } else { n.clone() })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl Queues {
    /// Queue names, in configured order.
    pub fn names(&self) -> Vec<String> {
        self.entries.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Queue names, in configured order, each to be shared (not copied)
    /// by the jobs fetched from it.
    pub(crate) fn shared_names(&self) -> Vec<Arc<str>> {
        self.entries.iter().map(|(n, _)| Arc::from(n.as_str())).collect()
    }

    /// These queues, keeping their order and weights, without those
    /// `keep` refuses; `None` if none is left.
    pub fn only(&self, keep: impl Fn(&str) -> bool) -> Option<Queues> {
        let entries: Vec<(String, u32)> = self.entries.iter().filter(|(name, _)| keep(name)).cloned().collect();
        (!entries.is_empty()).then_some(Queues {
            entries,
            weighted: self.weighted,
        })
    }

    /// Whether the order is weighted-random rather than strict.
    pub fn is_weighted(&self) -> bool {
        self.weighted
    }

    /// The order to look at the queues in for one fetch.
    pub fn fetch_order(&self) -> Vec<usize> {
        if !self.weighted {
            return (0..self.entries.len()).collect();
        }
        // Weighted sampling without replacement: repeatedly pick a queue with
        // probability proportional to its weight among those left.
        let mut left: Vec<usize> = (0..self.entries.len()).collect();
        let mut order = Vec::with_capacity(left.len());
        let mut rng = rand::rng();
        while !left.is_empty() {
            // In u64: the weights are u32s given by the user, their sum is not.
            let total: u64 = left.iter().map(|&i| u64::from(self.entries[i].1)).sum();
            let mut pick = rng.random_range(0..total);
            let position = left
                .iter()
                .position(|&i| {
                    let w = u64::from(self.entries[i].1);
                    if pick < w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .unwrap_or(0);
            order.push(left.remove(position));
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_weights_do_not_overflow() {
        let queues: Queues = format!("a:{max},b:{max},c:1", max = u32::MAX).parse().unwrap();
        for _ in 0..100 {
            let mut order = queues.fetch_order();
            order.sort_unstable();
            assert_eq!(order, [0, 1, 2]);
        }
    }

    #[test]
    fn strict_and_weighted_forms_parse() {
        let strict: Queues = "critical, default ,low".parse().unwrap();
        assert_eq!(strict.names(), ["critical", "default", "low"]);
        assert!(!strict.is_weighted());
        assert_eq!(strict.fetch_order(), [0, 1, 2]);
        assert_eq!(strict.to_string(), "critical,default,low");

        let weighted: Queues = "a:3,b:1".parse().unwrap();
        assert!(weighted.is_weighted());
        assert_eq!(weighted.to_string(), "a:3,b:1");
    }

    #[test]
    fn bad_lists_are_refused() {
        assert!("".parse::<Queues>().is_err());
        assert!("a:0".parse::<Queues>().is_err());
        assert!("a:x".parse::<Queues>().is_err());
        assert!("a,a".parse::<Queues>().is_err());
    }

    #[test]
    fn weights_shape_the_order() {
        let weighted: Queues = "a:3,b:1".parse().unwrap();
        let firsts = (0..4000).filter(|_| weighted.fetch_order()[0] == 0).count();
        // Expect ~3000 of 4000 with `a` first.
        assert!((2700..3300).contains(&firsts), "{firsts}");
        let mut order = weighted.fetch_order();
        order.sort();
        assert_eq!(order, [0, 1]);
    }
}

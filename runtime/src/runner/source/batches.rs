//! Batch lists: where a reliable fetch leaves the jobs it takes, without
//! their bytes passing through Lua.
//!
//! Redis's Lua makes a string of every value a command returns to a
//! script, copying and hashing its bytes, so a script that pops jobs and
//! pushes them into the in-progress list pays twice for every byte of
//! every payload. The fetch script ([`super::scripts::FETCH`]) instead
//! copies the oldest jobs of a queue into an empty *batch list* with
//! `SORT queue BY nosort DESC LIMIT 0 n STORE list` and trims them off
//! the queue with `LTRIM` — neither hands a payload to Lua — and the
//! runner reads the list with an `LRANGE` pipelined behind the script,
//! in the same round trip. A batch list holds its oldest job at its head
//! (an in-progress list, at its tail).
//!
//! A process has [`keys::BATCH_LISTS`] batch lists
//! (`wasmjobs:inprogress:<identity>:b<slot>`, [`keys::batch_list`]) beside
//! its in-progress list. A fetch claims a free slot; its jobs stay in that
//! list until each leaves it (acked, retried, buried or requeued), and the
//! transaction that writes the last ones' outcomes deletes the list
//! instead of removing each job ([`super::record`]). Only then, once Redis
//! confirmed it, is the slot free again: a fetch overwrites its list, so
//! a slot is never reused while a job may be in it. When no slot is free,
//! or the fetch must read payloads anyway (cancel marks), the jobs go to
//! the in-progress list as before.
//!
//! A fetch whose reply was lost leaves its slot *suspect*: its jobs may be
//! in the list though nobody here runs them. The reconcile that follows
//! (doubt, [`super::doubt`]) puts them back and frees the slot. Recovery
//! ([`super::orphans`]), shutdown and reconcile look in every list of
//! [`keys::held_lists`].

use std::sync::{Arc, Mutex, PoisonError};

use crate::redis::keys;
use crate::runner::fetched::Held;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// A fetch holds it, or jobs are in its list.
    Busy,
    /// Its fetch's reply was lost: it waits for a reconcile.
    Suspect,
}

/// The batch lists of one process, and which are free.
pub(super) struct Batches {
    keys: Vec<Arc<str>>,
    slots: Mutex<Vec<Slot>>,
}

impl Batches {
    pub(super) fn new(identity: &str) -> Self {
        Self {
            keys: (0..keys::BATCH_LISTS)
                .map(|slot| keys::batch_list(identity, slot).into())
                .collect(),
            slots: Mutex::new(vec![Slot::Free; keys::BATCH_LISTS]),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims a free slot for a fetch (the lowest), if there is one.
    pub(super) fn claim(&self) -> Option<usize> {
        let mut slots = self.slots();
        let slot = slots.iter().position(|&s| s == Slot::Free)?;
        slots[slot] = Slot::Busy;
        Some(slot)
    }

    /// The list of `slot`.
    pub(super) fn key(&self, slot: usize) -> &str {
        &self.keys[slot]
    }

    /// The fetch on `slot` put `jobs` jobs in its list: they share the
    /// returned [`Held`]; with none, the slot is free again (a `SORT …
    /// STORE` of nothing deletes its list).
    pub(super) fn filled(&self, slot: usize, jobs: usize) -> Option<Held> {
        if jobs == 0 {
            self.free(slot);
            return None;
        }
        Some(Held::new(self.keys[slot].clone(), slot, jobs))
    }

    /// The fetch on `slot` did not use its list (it took jobs into the
    /// in-progress list instead): free again.
    pub(super) fn unused(&self, slot: usize) {
        self.free(slot);
    }

    /// The fetch on `slot` failed after Redis may have run it.
    pub(super) fn suspect(&self, slot: usize) {
        self.slots()[slot] = Slot::Suspect;
    }

    /// `jobs` jobs of `held` left its list, as Redis confirmed: when it is
    /// empty, its slot is free.
    pub(super) fn leave(&self, held: &Held, jobs: usize) {
        if held.leave(jobs) {
            self.free(held.slot());
        }
    }

    /// A reconcile emptied every list of what nobody here holds: the
    /// suspect slots are free, but those in `kept` (whose lists still hold
    /// an entry with the text of a job held here: a payload pushed twice,
    /// which one copy is which cannot be told) until a later reconcile.
    pub(super) fn reconciled(&self, kept: &[usize]) {
        for (at, slot) in self.slots().iter_mut().enumerate() {
            if *slot == Slot::Suspect && !kept.contains(&at) {
                *slot = Slot::Free;
            }
        }
    }

    fn free(&self, slot: usize) {
        self.slots()[slot] = Slot::Free;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot is claimed lowest first, free again only when its jobs are
    /// all gone (or none came), and a suspect one only after a reconcile.
    #[test]
    fn a_slot_is_reused_only_once_its_list_is_empty() {
        let batches = Batches::new("host:1:abc");
        assert_eq!(batches.key(3), "wasmjobs:inprogress:host:1:abc:b3");
        assert_eq!(batches.claim(), Some(0));
        assert_eq!(batches.claim(), Some(1));
        let held = batches.filled(0, 3).expect("three jobs");
        assert_eq!(
            (held.key(), held.slot(), held.left()),
            ("wasmjobs:inprogress:host:1:abc:b0", 0, 3)
        );
        assert!(batches.filled(1, 0).is_none(), "nothing fetched");
        assert_eq!(batches.claim(), Some(1), "an empty fetch frees its slot");
        batches.leave(&held, 2);
        assert_eq!(batches.claim(), Some(2), "slot 0 still holds a job");
        batches.leave(&held, 1);
        assert_eq!(batches.claim(), Some(0), "its last job gone, slot 0 is free");
        batches.suspect(1);
        batches.unused(2);
        assert_eq!(batches.claim(), Some(2));
        for slot in 3..keys::BATCH_LISTS {
            assert_eq!(batches.claim(), Some(slot));
        }
        batches.suspect(3);
        assert_eq!(batches.claim(), None, "all busy or suspect");
        batches.reconciled(&[3]);
        assert_eq!(batches.claim(), Some(1), "a reconcile frees the suspect slot");
        assert_eq!(batches.claim(), None, "but not one whose list kept an entry");
        batches.reconciled(&[]);
        assert_eq!(batches.claim(), Some(3));
    }
}

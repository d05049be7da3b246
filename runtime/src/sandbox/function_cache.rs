//! Cranelift's incremental compilation cache, one compile at a time.
//!
//! A one-line edit to a Python or JavaScript job changes a handful of the
//! ~23,000 functions in its component (the interpreter's do not change),
//! yet compiling it anew costs the whole 6–8 s. With an incremental cache,
//! Cranelift hashes each function (its IR, the target and its flags) and
//! asks the cache for the machine code of an identical function compiled
//! before; measured on a one-line edit to a Python job, 90–95% of its
//! ~13,200 functions are found and the compile takes 2 s instead of 7 s
//! (`docs/polyglot.md`, *The edit loop*).
//!
//! Every engine (`sandbox::engine`) is built with this process's store
//! ([`store`]), which is inert outside a compile [`Session`]: it answers
//! nothing and keeps nothing. The compile cache (`plugin::function_pack`)
//! opens a session per compile with the functions of that plugin's last
//! compile, read from disk, and writes back what the session used: the
//! functions found and those compiled anew, exactly the functions of this
//! version. So what is kept per plugin never grows past one version, and
//! nothing lives in memory between compiles. Sessions take turns: a
//! compile already uses every core (Cranelift compiles functions in
//! parallel), so serialising them costs nothing, and what a session used
//! is then exactly its own compile's.
//!
//! This module holds no file and trusts no file: the bytes it is given
//! come from the private cache directory, checked by the caller. The pack
//! format ([`encode`], [`decode`]) carries a SHA-256 of its contents, so a
//! damaged pack is refused whole rather than half-used; an entry itself is
//! checked by Cranelift (a version marker, then the function's own shape)
//! before use, and any entry it cannot use is compiled again.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use anyhow::{Result, bail, ensure};
use sha2::{Digest, Sha256};
use wasmtime::CacheStore;

/// Functions by Cranelift's cache key (a hash of the function and target).
pub(crate) type Functions = HashMap<Vec<u8>, Vec<u8>>;

/// How many distinct functions a compile took from the cache and how
/// many it compiled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reuse {
    pub(crate) reused: usize,
    pub(crate) compiled: usize,
}

/// The process's store: one open session at most.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// Held by the open session, so sessions take turns.
    turn: Mutex<()>,
    open: Mutex<Option<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    /// The last compile's functions not asked for yet.
    known: Functions,
    /// The functions this compile used, found or compiled.
    used: Functions,
    reuse: Reuse,
}

static SESSIONS: LazyLock<Sessions> = LazyLock::new(Sessions::default);

/// The store every engine of this process is built with.
pub(crate) fn store() -> Arc<dyn CacheStore> {
    Arc::new(Shared)
}

/// This process's sessions, for the compile cache.
pub(crate) fn sessions() -> &'static Sessions {
    &SESSIONS
}

/// What the engines hold: the process-wide [`Sessions`].
#[derive(Debug)]
struct Shared;

impl CacheStore for Shared {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        SESSIONS.get(key).map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        SESSIONS.insert(key, value)
    }
}

impl Sessions {
    /// Opens a session whose compiles may reuse `known`; waits for the
    /// open one, if any, to finish.
    pub(crate) fn begin(&self, known: Functions) -> Session<'_> {
        let turn = lock(&self.turn);
        *lock(&self.open) = Some(Open {
            known,
            ..Open::default()
        });
        Session {
            sessions: self,
            _turn: turn,
        }
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut open = lock(&self.open);
        let open = open.as_mut()?;
        if let Some(value) = open.used.get(key) {
            return Some(value.clone());
        }
        match open.known.remove(key) {
            Some(value) => {
                open.reuse.reused += 1;
                open.used.insert(key.to_vec(), value.clone());
                Some(value)
            }
            None => None,
        }
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        match lock(&self.open).as_mut() {
            Some(open) => {
                open.used.insert(key.to_vec(), value);
                true
            }
            None => false,
        }
    }
}

/// An open session; [`Session::finish`] (or dropping it) closes it.
pub(crate) struct Session<'a> {
    sessions: &'a Sessions,
    _turn: MutexGuard<'a, ()>,
}

impl Session<'_> {
    /// Closes the session: the functions it used, and how many were reused.
    pub(crate) fn finish(self) -> (Functions, Reuse) {
        let mut open = lock(&self.sessions.open).take().unwrap_or_default();
        // Counted here, by distinct function: two threads may compile the
        // same function (identical trampolines) at once.
        open.reuse.compiled = open.used.len() - open.reuse.reused;
        (open.used, open.reuse)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        lock(&self.sessions.open).take();
    }
}

/// A poisoned lock only means a compile panicked; the maps stay usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

const MAGIC: &[u8] = b"wasmjobs functions 1\n";

/// The bytes of a pack: a header, each entry as two length-prefixed byte
/// strings (little-endian `u32` lengths), and a SHA-256 of all before it.
pub(crate) fn encode(functions: &Functions) -> Vec<u8> {
    let size = functions.iter().map(|(k, v)| 8 + k.len() + v.len()).sum::<usize>();
    let mut out = Vec::with_capacity(MAGIC.len() + size + 32);
    out.extend_from_slice(MAGIC);
    for (key, value) in functions {
        for part in [key, value] {
            // Cranelift's entries are keys of 32 bytes and functions of a
            // few KiB; nothing it makes comes near 4 GiB.
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part);
        }
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// The entries of a pack [`encode`] wrote; an error if it is not one, is
/// truncated or was changed.
pub(crate) fn decode(bytes: &[u8]) -> Result<Functions> {
    ensure!(bytes.len() >= MAGIC.len() + 32, "too short to be a function pack");
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    ensure!(body.starts_with(MAGIC), "not a function pack of this version");
    ensure!(Sha256::digest(body).as_slice() == digest, "its checksum does not match");
    let mut rest = &body[MAGIC.len()..];
    let mut functions = Functions::new();
    while !rest.is_empty() {
        let key = take(&mut rest)?;
        let value = take(&mut rest)?;
        functions.insert(key.to_vec(), value.to_vec());
    }
    Ok(functions)
}

/// One length-prefixed byte string from the front of `rest`.
fn take<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8]> {
    let Some((len, after)) = rest.split_first_chunk::<4>() else {
        bail!("an entry is cut short");
    };
    let len = u32::from_le_bytes(*len) as usize;
    ensure!(after.len() >= len, "an entry is cut short");
    let (part, after) = after.split_at(len);
    *rest = after;
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: u8, value: &str) -> (Vec<u8>, Vec<u8>) {
        (vec![key; 32], value.as_bytes().to_vec())
    }

    #[test]
    fn a_session_reuses_what_it_was_given_and_keeps_what_it_used() {
        let sessions = Sessions::default();
        let known = Functions::from([entry(1, "one"), entry(2, "two, unchanged?")]);
        let session = sessions.begin(known);
        assert_eq!(sessions.get(&[1; 32]), Some(b"one".to_vec()));
        assert_eq!(sessions.get(&[1; 32]), Some(b"one".to_vec()), "asked twice");
        assert_eq!(sessions.get(&[3; 32]), None);
        assert!(sessions.insert(&[3; 32], b"three".to_vec()));
        let (used, reuse) = session.finish();
        assert_eq!(reuse, Reuse { reused: 1, compiled: 1 });
        // Function 2 was not in this version: it is not kept.
        assert_eq!(used, Functions::from([entry(1, "one"), entry(3, "three")]));
    }

    #[test]
    fn outside_a_session_the_store_answers_nothing_and_keeps_nothing() {
        let sessions = Sessions::default();
        drop(sessions.begin(Functions::from([entry(1, "one")])));
        assert_eq!(sessions.get(&[1; 32]), None);
        assert!(!sessions.insert(&[2; 32], b"two".to_vec()));
        let (used, reuse) = sessions.begin(Functions::new()).finish();
        assert!(used.is_empty());
        assert_eq!(reuse, Reuse::default());
    }

    #[test]
    fn packs_round_trip_and_damaged_ones_are_refused() {
        let functions = Functions::from([entry(1, "one"), entry(2, ""), entry(3, "three")]);
        let pack = encode(&functions);
        assert_eq!(decode(&pack).expect("a pack"), functions);
        assert_eq!(
            decode(&encode(&Functions::new())).expect("an empty pack"),
            Functions::new()
        );

        let mut flipped = pack.clone();
        flipped[MAGIC.len() + 40] ^= 1;
        assert!(format!("{:#}", decode(&flipped).unwrap_err()).contains("checksum"));
        assert!(decode(&pack[..pack.len() - 1]).is_err(), "truncated");
        assert!(decode(b"").is_err());
        assert!(decode(&[b"wasmjobs functions 2\n".as_slice(), &[0; 32]].concat()).is_err());

        // A well-formed checksum over lengths that run past the end.
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&1000u32.to_le_bytes());
        body.extend_from_slice(b"short");
        let digest = Sha256::digest(&body);
        body.extend_from_slice(&digest);
        assert!(format!("{:#}", decode(&body).unwrap_err()).contains("cut short"));
    }
}

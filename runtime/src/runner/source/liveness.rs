//! Whether another process is alive, without false deaths.
//!
//! A process is dead only when its heartbeat has expired — or when it
//! provably ran on this machine, in this boot and this PID namespace, and
//! its PID is gone (or now belongs to a process started at another time).
//! The proof is the process's [`Origin`], written with every heartbeat:
//! the kernel's boot id (`/proc/sys/kernel/random/boot_id`), the PID
//! namespace (`/proc/self/ns/pid`), the PID and the process's start time
//! (field 22 of `/proc/PID/stat`). A host name proves nothing: containers
//! share host names, and two containers' PIDs mean different processes.
//!
//! So a runner restarted after `kill -9` on the same machine recovers the
//! old process's jobs at once, a live process whose heartbeat key vanished
//! keeps its jobs, and a process elsewhere is judged by its heartbeat only.

use std::path::Path;

/// Where a process runs, as far as this machine can check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    boot_id: String,
    pid_ns: String,
    pid: u32,
    start_time: u64,
}

impl Origin {
    /// This process's origin, if `/proc` tells it consistently.
    pub(crate) fn current() -> Option<Self> {
        Self::read(Path::new("/proc"), std::process::id())
    }

    fn read(proc: &Path, pid: u32) -> Option<Self> {
        let boot_id = std::fs::read_to_string(proc.join("sys/kernel/random/boot_id")).ok()?;
        let pid_ns = std::fs::read_link(proc.join("self/ns/pid")).ok()?;
        // `/proc` mounted from another PID namespace would show someone else.
        let (own_pid, start_time) = stat(&std::fs::read_to_string(proc.join("self/stat")).ok()?)?;
        if own_pid != pid {
            return None;
        }
        Some(Self {
            boot_id: boot_id.trim().to_owned(),
            pid_ns: pid_ns.to_string_lossy().into_owned(),
            pid,
            start_time,
        })
    }

    /// The text stored in Redis.
    pub(crate) fn encode(&self) -> String {
        format!("1 {} {} {} {}", self.boot_id, self.pid_ns, self.pid, self.start_time)
    }

    /// Reads [`Origin::encode`]'s text; anything else (written by someone
    /// else, or a future format) is `None`, which proves nothing.
    pub(crate) fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split(' ');
        if parts.next()? != "1" {
            return None;
        }
        let origin = Self {
            boot_id: parts.next()?.to_owned(),
            pid_ns: parts.next()?.to_owned(),
            pid: parts.next()?.parse().ok()?,
            start_time: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(origin)
    }

    /// Whether the process of `self` is alive, seen from `here`: `Some`
    /// when this machine can tell (same boot, same PID namespace), `None`
    /// when only its heartbeat can.
    pub(crate) fn alive_seen_from(&self, here: &Origin) -> Option<bool> {
        if self.boot_id != here.boot_id || self.pid_ns != here.pid_ns {
            return None;
        }
        let now = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| stat(&s));
        Some(now == Some((self.pid, self.start_time)))
    }
}

/// The PID and start time (clock ticks after boot) in a `/proc/PID/stat`
/// line. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted after its last `)`.
fn stat(line: &str) -> Option<(u32, u64)> {
    let pid = line.split(' ').next()?.parse().ok()?;
    let rest = &line[line.rfind(')')? + 1..];
    // rest: " state ppid ..." — field 3 is the first, field 22 the 20th.
    let start_time = rest.split_whitespace().nth(19)?.parse().ok()?;
    Some((pid, start_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_round_trips() {
        let me = Origin::current().expect("/proc is readable here");
        assert_eq!(Origin::decode(&me.encode()), Some(me.clone()));
        assert_eq!(me.alive_seen_from(&me), Some(true));
    }

    #[test]
    fn a_gone_or_reused_pid_is_dead_only_where_it_can_be_checked() {
        let me = Origin::current().expect("/proc is readable here");
        let gone = Origin {
            pid: u32::MAX - 1,
            ..me.clone()
        };
        assert_eq!(gone.alive_seen_from(&me), Some(false));
        let reused = Origin {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert_eq!(reused.alive_seen_from(&me), Some(false), "same pid, another process");
        let elsewhere = Origin {
            pid_ns: "pid:[1]".into(),
            ..gone.clone()
        };
        assert_eq!(
            elsewhere.alive_seen_from(&me),
            None,
            "another PID namespace proves nothing"
        );
        let rebooted = Origin {
            boot_id: "another-boot".into(),
            ..gone
        };
        assert_eq!(rebooted.alive_seen_from(&me), None);
    }

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "42 (a) b (c) R 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10";
        assert_eq!(stat(line), Some((42, 12345)));
        assert_eq!(stat("nonsense"), None);
        assert_eq!(Origin::decode("1 a b c d"), None, "pid must be a number");
        assert_eq!(Origin::decode("2 a b 1 2"), None, "unknown format");
        assert_eq!(Origin::decode("1 a b 1 2 extra"), None);
    }
}

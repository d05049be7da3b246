//! Raising the open-file limit at start-up.
//!
//! Every job in flight may hold a socket (an HTTP request, a database
//! connection) and the runner itself holds Redis connections, so
//! `--concurrency 10000` needs well over 10,000 descriptors. Distributions
//! ship a soft limit of 1,024 and a much higher hard limit; like most servers
//! (nginx, PostgreSQL, Redis itself) the runner raises its soft limit to the
//! hard one, and warns when even that is too low for the concurrency asked
//! for, rather than failing jobs with "too many open files" later.

/// Descriptors the runner keeps for itself: Redis connections, the plugin
/// directory, log files, the compile cache.
const RESERVED: u64 = 256;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the new
/// soft limit; warns if it is below what `concurrency` jobs may need.
pub fn raise_for(concurrency: u32) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        tracing::warn!("cannot read the open-file limit: {}", std::io::Error::last_os_error());
        return 0;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        } else {
            tracing::warn!("cannot raise the open-file limit: {}", std::io::Error::last_os_error());
        }
    }
    let soft: u64 = limit.rlim_cur;
    let needed = u64::from(concurrency) + RESERVED;
    if soft < needed {
        tracing::warn!(
            limit = soft,
            needed,
            "the open-file limit is below what {concurrency} concurrent jobs may need; raise it \
             (`ulimit -n`, LimitNOFILE= in a systemd unit) or jobs may fail with \"too many open files\""
        );
    }
    soft
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let soft = super::raise_for(1);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reads into the struct passed.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        assert_eq!(soft, limit.rlim_cur);
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}

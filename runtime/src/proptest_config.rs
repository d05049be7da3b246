//! The configuration every property test of this crate runs with.

use proptest::test_runner::Config;

/// `cases` per property unless `PROPTEST_CASES` says otherwise; failures are
/// not persisted to files (a crash found becomes a named regression test).
pub(crate) fn config(cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config.failure_persistence = None;
    config
}

//! Property tests of the args decoding ([`decode_args`]): whatever args
//! text the host hands a job, decoding it into a typical `Job::Args` type
//! never panics, and either yields the value or a dead [`JobError`] saying
//! the args could not be decoded. Run natively (`cargo test
//! --manifest-path guest-sdk/Cargo.toml`, as `scripts/test.sh` does).
//!
//! Case counts are small so the suite stays fast; `PROPTEST_CASES=100000`
//! runs a longer search.

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;

/// `cases` per property unless `PROPTEST_CASES` says otherwise; failures are
/// not persisted to files (a crash found becomes a named regression test).
fn config(cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config.failure_persistence = None;
    config
}

/// A struct with optional fields, read from an array by field order.
#[derive(Debug, Deserialize, PartialEq)]
#[allow(dead_code)]
struct Options {
    name: String,
    count: Option<u64>,
    tags: Option<Vec<String>>,
}

/// Decodes `args` as `T`: Ok, or a dead error that names the class and
/// says the args are invalid, quoting at most a bounded preview of them.
fn check<T: DeserializeOwned>(args: &str) -> Option<T> {
    match decode_args::<T>("FuzzJob", args) {
        Ok(value) => Some(value),
        Err(error) => {
            assert_eq!(error.kind(), JobErrorKind::Dead);
            assert!(
                error.message().starts_with("invalid args for FuzzJob "),
                "{}",
                error.message()
            );
            assert!(
                error.message().len() < ARGS_IN_MESSAGE + 2000,
                "{} bytes",
                error.message().len()
            );
            None
        }
    }
}

fn check_all(args: &str) {
    check::<(String, u64)>(args);
    check::<Options>(args);
    check::<(u32,)>(args);
    check::<Vec<Value>>(args);
    check::<Value>(args);
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,300}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((".{0,6}", inner), 0..4)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn arbitrary_text_decodes_or_is_dead(args in prop_oneof![any::<String>(), r#"[\[\]{}",:0-9a-z.eE+\- \\]{0,80}"#]) {
        check_all(&args);
    }

    #[test]
    fn arbitrary_json_decodes_or_is_dead(value in any_json()) {
        check_all(&value.to_string());
    }

    /// Args of the right shape decode to what was encoded.
    #[test]
    fn well_typed_args_round_trip(name in ".{0,300}", count in any::<u64>(), tags in prop::option::of(prop::collection::vec(".{0,8}", 0..3))) {
        let text = json!([name, count]).to_string();
        prop_assert_eq!(check::<(String, u64)>(&text), Some((name.clone(), count)));
        // serde reads a struct from an array by position: a missing
        // trailing `Option` is an error (dead), an explicit `null` is `None`.
        prop_assert_eq!(check::<Options>(&json!([name, count]).to_string()), None);
        let text = json!([name, count, tags]).to_string();
        prop_assert_eq!(check::<Options>(&text), Some(Options { name, count: Some(count), tags }));
    }
}

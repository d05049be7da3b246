//! Which bucket a job's limits count in: the value at the plugin's
//! `limits.per_key.key` path, hashed into a key-name segment. Pure. For
//! an ActiveJob job, `args` is its decoded arguments (what its plugin
//! reads), not the wrapper's.
//!
//! Every byte of a job is hostile, so no part of the value is ever put in
//! a key name: a string counts by its bytes, anything else by its JSON
//! text (so `"7"` and `7` share a bucket), hashed with SHA-256 and cut to
//! 32 hex digits. A job without the path (or with `null` there) counts in
//! the one bucket [`NONE`]. Plugin names (directory names, chosen by the
//! operator) are used as they are when they are plain, hashed otherwise.

use std::borrow::Cow;

use serde_json::Value;
use sha2::{Digest, Sha256};

use wasmjobs_client::activejob;

use crate::plugin::cluster_limits::KeyPath;
use crate::redis::payload::{Payload, to_job};

/// The bucket of jobs that lack the key path.
pub(crate) const NONE: &str = "none";

/// The bucket of `payload` for `path`.
pub(crate) fn bucket(payload: &Payload, path: &KeyPath) -> String {
    let Some((first, rest)) = path.segments().split_first() else {
        return NONE.to_owned();
    };
    // An ActiveJob job's `args` are its decoded arguments, as its plugin
    // sees them, not the wrapper's one ActiveJob hash.
    let decoded = (first == "args" && activejob::is_wrapper(payload.class()))
        .then(|| serde_json::from_str::<Value>(&to_job(payload).args).ok())
        .flatten();
    let mut value = match &decoded {
        Some(arguments) => Some(arguments),
        None => payload.get(first),
    };
    for segment in rest {
        value = match value {
            Some(Value::Object(map)) => map.get(segment),
            Some(Value::Array(items)) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
    }
    match value {
        None | Some(Value::Null) => NONE.to_owned(),
        Some(Value::String(text)) => digest(text.as_bytes()),
        Some(other) => digest(other.to_string().as_bytes()),
    }
}

/// The plugin's segment in limit keys: its name if plain (1-64 letters,
/// digits, `_`, `-`, `.`), else `h-` and a hash of it.
pub(crate) fn plugin_segment(name: &str) -> Cow<'_, str> {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if plain {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(format!("h-{}", digest(name.as_bytes())))
    }
}

fn digest(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(args: &str) -> Payload {
        Payload::parse(&format!(r#"{{"class":"X","args":{args},"tenant":"t1"}}"#)).unwrap()
    }

    fn path(text: &str) -> KeyPath {
        KeyPath::parse(text).unwrap()
    }

    #[test]
    fn values_are_found_by_path_and_hashed() {
        let a = bucket(&job(r#"["alice", 2]"#), &path("args.0"));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(a, bucket(&job(r#"["alice", 3]"#), &path("args.0")));
        assert_ne!(a, bucket(&job(r#"["bob", 2]"#), &path("args.0")));
        assert_eq!(
            bucket(&job(r#"[{"user_id": 7}]"#), &path("args.0.user_id")),
            bucket(&job(r#"["7"]"#), &path("args.0"))
        );
        assert_eq!(
            bucket(&job("[]"), &path("tenant")),
            bucket(&job(r#"["t1"]"#), &path("args.0"))
        );
        assert_ne!(bucket(&job(r#"[[1,2]]"#), &path("args.0")), NONE);
    }

    #[test]
    fn an_activejob_job_counts_by_its_decoded_arguments() {
        let wrapper = |arguments: &str| {
            Payload::parse(&format!(
                r#"{{"class":"Sidekiq::ActiveJob::Wrapper","wrapped":"W","args":[{{"job_class":"W","arguments":{arguments}}}]}}"#
            ))
            .unwrap()
        };
        let by_symbol = wrapper(r#"[{"_aj_serialized":"ActiveJob::Serializers::SymbolSerializer","value":"acme"}]"#);
        assert_eq!(
            bucket(&by_symbol, &path("args.0")),
            bucket(&job(r#"["acme"]"#), &path("args.0"))
        );
        let by_key = wrapper(r#"[{"tenant":"t1","_aj_symbol_keys":["tenant"]}]"#);
        assert_eq!(
            bucket(&by_key, &path("args.0.tenant")),
            bucket(&job(r#"["t1"]"#), &path("args.0"))
        );
    }

    #[test]
    fn a_job_without_the_path_goes_to_none() {
        for (args, p) in [
            ("[]", "args.0"),
            (r#"[null]"#, "args.0"),
            (r#"["x"]"#, "args.0.user_id"),
            (r#"[{"a":1}]"#, "args.0.b"),
            (r#"[[1]]"#, "args.0.x"),
            (r#"["x"]"#, "missing"),
        ] {
            assert_eq!(bucket(&job(args), &path(p)), NONE, "{args} {p}");
        }
    }

    #[test]
    fn hostile_values_never_reach_key_names() {
        let nasty = format!(r#"["{}\r\n*1\r\n$4\r\nQUIT\r\n:\u0000"]"#, "a".repeat(100_000));
        let b = bucket(&job(&nasty), &path("args.0"));
        assert_eq!(b.len(), 32);
        assert_eq!(plugin_segment("my-plugin_2.v"), "my-plugin_2.v");
        for name in ["", "a b", "x:y", "é", &"p".repeat(65)] {
            let s = plugin_segment(name);
            assert!(s.starts_with("h-") && s.len() == 34, "{name:?} -> {s}");
        }
    }
}

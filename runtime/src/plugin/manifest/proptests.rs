//! Property tests of the manifest parser: whatever text a plugin ships as
//! `wasmjobs.toml`, parsing never panics, every error names the manifest
//! file, and an accepted manifest never grants a host path outside the
//! plugin directory unless it says `outside = true`.
//!
//! Case counts are small so the suite stays fast; `PROPTEST_CASES=100000`
//! runs a longer search.

use proptest::prelude::*;

use super::*;
use crate::proptest_config::config;

const PATH: &str = "/plugins/fuzz/wasmjobs.toml";

/// Parses `text`; an error must name the manifest, an accepted manifest
/// must keep its host paths inside the plugin root unless `outside`.
fn check(text: &str) {
    match Manifest::parse(Path::new(PATH), text) {
        Err(error) => {
            let message = format!("{error:#}");
            assert!(message.contains(PATH), "error does not name the manifest: {message}");
        }
        Ok(manifest) => {
            let root = Path::new("/plugins/fuzz");
            assert_eq!(manifest.root, root);
            assert!(!manifest.classes.is_empty());
            let inside = |path: &Path| {
                path.starts_with(root)
                    && !path
                        .components()
                        .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
            };
            assert!(inside(&manifest.component), "{:?}", manifest.component);
            for file in &manifest.files {
                assert!(file.outside || inside(&file.host), "{file:?} leaves the plugin root");
                assert!(file.guest.starts_with('/') && !file.guest.contains("/../"));
            }
        }
    }
}

/// A TOML string literal (basic, escaped) holding `text`.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// Hostile strings: traversal, absolute paths, NUL, unicode, huge.
fn hostile_text() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        3 => "[a-z0-9_./-]{0,24}",
        1 => Just("..".to_owned()),
        1 => Just("a/../../etc".to_owned()),
        1 => Just("/etc/passwd".to_owned()),
        1 => Just("data\0/x".to_owned()),
        1 => Just("C:\\windows".to_owned()),
        1 => Just("./data/./in".to_owned()),
        1 => ".{0,16}",
        1 => (1usize..3).prop_map(|n| "a".repeat(n * 40_000)),
    ]
}

/// A TOML value for a key: usually a string, sometimes any other type.
fn value(good: impl Strategy<Value = String> + Clone) -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        6 => good,
        1 => hostile_text().prop_map(|t| toml_string(&t)),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => Just("18446744073709551616".to_owned()),
        1 => Just("-1".to_owned()),
        1 => any::<bool>().prop_map(|b| b.to_string()),
        1 => Just("1.5e300".to_owned()),
        1 => Just("[]".to_owned()),
        1 => Just("{}".to_owned()),
        1 => Just("1979-05-27T07:32:00Z".to_owned()),
    ]
}

fn string_value() -> impl Strategy<Value = String> + Clone {
    value(hostile_text().prop_map(|t| toml_string(&t)))
}

fn string_list() -> impl Strategy<Value = String> + Clone {
    value(prop::collection::vec(hostile_text(), 0..4).prop_map(|items| {
        format!(
            "[{}]",
            items.iter().map(|t| toml_string(t)).collect::<Vec<_>>().join(", ")
        )
    }))
}

fn size() -> impl Strategy<Value = String> + Clone {
    value(
        prop_oneof![
            "[0-9]{1,25}(B|KiB|MiB|GiB|TiB|kB|MB|)",
            Just("0".to_owned()),
            Just("-5MiB".to_owned()),
            ".{0,8}",
        ]
        .prop_map(|t| toml_string(&t)),
    )
}

fn duration() -> impl Strategy<Value = String> + Clone {
    value(
        prop_oneof![
            "[0-9]{1,25}(ms|s|m|h|d|)",
            Just("0s".to_owned()),
            Just("-1s".to_owned()),
            ".{0,8}"
        ]
        .prop_map(|t| toml_string(&t)),
    )
}

fn count() -> impl Strategy<Value = String> + Clone {
    value(prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0i64..100).prop_map(|n| n.to_string())
    ])
}

/// `key = value` lines, each present or not.
fn lines(items: Vec<(&'static str, Option<String>)>) -> String {
    items
        .into_iter()
        .filter_map(|(key, value)| value.map(|v| format!("{key} = {v}\n")))
        .collect()
}

fn files_table() -> impl Strategy<Value = String> {
    (
        prop::option::of(string_value()),
        prop::option::of(string_value()),
        prop::option::of(value(
            prop::sample::select(&["\"ro\"", "\"rw\""][..]).prop_map(str::to_owned),
        )),
        prop::option::of(value(any::<bool>().prop_map(|b| b.to_string()))),
    )
        .prop_map(|(host, guest, mode, outside)| {
            format!(
                "[[files]]\n{}",
                lines(vec![
                    ("host", host),
                    ("guest", guest),
                    ("mode", mode),
                    ("outside", outside)
                ])
            )
        })
}

fn sql_grant() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        hostile_text().prop_map(|t| toml_string(&t)),
        (
            hostile_text(),
            prop::option::of(prop::sample::select(&["ro", "rw", "wx"][..]))
        )
            .prop_map(|(name, mode)| {
                match mode {
                    Some(mode) => format!("{{ name = {}, mode = \"{mode}\" }}", toml_string(&name)),
                    None => format!("{{ name = {} }}", toml_string(&name)),
                }
            }),
        Just("{ mode = \"ro\" }".to_owned()),
        Just("7".to_owned()),
    ]
}

/// A manifest built from the known keys, each present or not, well-typed
/// or not, with hostile values.
fn manifest_text() -> impl Strategy<Value = String> {
    let top = (
        prop::option::of(string_value()),
        prop::option::of(string_list()),
        prop::option::of(string_list()),
        prop::option::of(value(
            prop::collection::vec(sql_grant(), 0..4).prop_map(|grants| format!("[{}]", grants.join(", "))),
        )),
    );
    let limits = (
        prop::option::of(size()),
        prop::option::of(duration()),
        prop::option::of(count()),
        prop::option::of(count()),
        prop::option::of(size()),
        prop::option::of((prop::option::of(size()), prop::option::of(count()))),
    );
    (
        top,
        prop::collection::vec(files_table(), 0..3),
        prop::option::of(string_list()),
        prop::option::of(limits),
    )
        .prop_map(|((component, classes, env, sql), files, http, limits)| {
            let mut text = lines(vec![
                ("component", component),
                ("classes", classes),
                ("env", env),
                ("sql", sql),
            ]);
            for table in files {
                text.push_str(&table);
            }
            if let Some(allow) = http {
                text.push_str(&format!("[http]\nallow = {allow}\n"));
            }
            if let Some((memory, timeout, concurrency, fuel, disk, log)) = limits {
                text.push_str("[limits]\n");
                let log = log.map(|(bytes, lines)| {
                    let mut parts = Vec::new();
                    if let Some(bytes) = bytes {
                        parts.push(format!("bytes = {bytes}"));
                    }
                    if let Some(lines) = lines {
                        parts.push(format!("lines = {lines}"));
                    }
                    format!("{{ {} }}", parts.join(", "))
                });
                text.push_str(&lines(vec![
                    ("memory", memory),
                    ("timeout", timeout),
                    ("concurrency", concurrency),
                    ("fuel", fuel),
                    ("disk", disk),
                    ("log", log),
                ]));
            }
            text
        })
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn arbitrary_text_parses_or_names_the_manifest(text in any::<String>()) {
        check(&text);
    }

    #[test]
    fn toml_looking_text_parses_or_names_the_manifest(text in r#"[a-z\[\]="'{},.\n 0-9/]{0,120}"#) {
        check(&text);
    }

    #[test]
    fn structured_manifests_parse_or_name_the_manifest(text in manifest_text()) {
        check(&text);
    }

    /// Well-typed manifests with hostile file grants: accepted ones stay
    /// inside the plugin root unless `outside = true`.
    #[test]
    fn accepted_grants_stay_inside_the_root(
        hosts in prop::collection::vec((hostile_text(), any::<bool>()), 1..4),
    ) {
        let mut text = String::from("component = \"x.wasm\"\nclasses = [\"X\"]\n");
        for (i, (host, outside)) in hosts.iter().enumerate() {
            text.push_str(&format!(
                "[[files]]\nhost = {}\nguest = \"/g{i}\"\nmode = \"rw\"\noutside = {outside}\n",
                toml_string(host)
            ));
        }
        check(&text);
    }

    /// `[[schedule]]` entries with hostile values: parsing never panics,
    /// errors name the manifest, and what is accepted is bounded and valid.
    #[test]
    fn schedules_parse_or_name_the_manifest(
        entries in prop::collection::vec((
            prop::option::of(value(prop_oneof![
                Just("\"*/5 * * * *\"".to_owned()),
                Just("\"*/1 * * * * *\"".to_owned()),
                "\"[0-9*/,LW#-]{0,4}( [0-9*/,A-Z-]{0,4}){0,7}\"",
            ])),
            prop::option::of(value(prop_oneof![
                Just("\"Europe/Berlin\"".to_owned()),
                Just("\"UTC\"".to_owned()),
            ])),
            prop::option::of(value(Just("\"X\"".to_owned()))),
            prop::option::of(string_list()),
            prop::option::of(string_value()),
            prop::option::of(string_value()),
            prop::option::of(value(any::<bool>().prop_map(|b| b.to_string()))),
        ), 0..4),
    ) {
        let mut text = String::from("component = \"x.wasm\"\nclasses = [\"X\"]\n");
        for (cron, timezone, class, args, queue, name, catch_up) in entries {
            text.push_str("[[schedule]]\n");
            text.push_str(&lines(vec![
                ("cron", cron),
                ("timezone", timezone),
                ("class", class),
                ("args", args),
                ("queue", queue),
                ("name", name),
                ("catch_up", catch_up),
            ]));
        }
        check(&text);
        if let Ok(manifest) = Manifest::parse(Path::new(PATH), &text) {
            for schedule in &manifest.schedules {
                prop_assert!(!schedule.name.is_empty() && schedule.name.len() <= super::super::schedule::MAX_NAME_LEN);
                prop_assert!(!schedule.queue.is_empty() && schedule.queue.len() <= super::super::schedule::MAX_QUEUE_LEN);
                prop_assert_eq!(schedule.class.as_str(), "X");
            }
        }
    }
}

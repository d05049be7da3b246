//! Development builds (`wasmjobs build --dev`): a component that carries
//! its sources in a custom section, which the host unpacks and grants
//! read-only. The section is as hostile as the rest of the component: a
//! name that would leave the unpack directory is refused at load, the
//! guest can read its own files and nothing else there, and can neither
//! write nor delete them; a manifest grant may not take the guest path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use wasmjobs::job::Outcome;
use wasmjobs::plugin::dev_sources::{self, DevSources};
use wasmjobs::plugin::{Catalog, CompileCache};
use wasmjobs_e2e::{copy_plugin, executor, messages, run, test_guests_dir};

/// The chaos guest copied into `dir` with `manifest_extra` appended to its
/// manifest (no grants of its own).
fn chaos(dir: &Path, manifest_extra: &str) -> PathBuf {
    let root = copy_plugin(&test_guests_dir().join("chaos"), dir);
    std::fs::write(
        root.join("wasmjobs.toml"),
        format!("component = \"chaos_job.wasm\"\nclasses = [\"ChaosJob\"]\n{manifest_extra}"),
    )
    .expect("write manifest");
    root
}

/// Appends a custom section named `name` holding `data` to the component,
/// byte by byte as the format says: written here, not with
/// `dev_sources::append`, which refuses the hostile names an attacker's
/// own tool would not.
fn append_raw_section(component: &Path, name: &str, data: &[u8]) {
    fn leb(out: &mut Vec<u8>, mut value: usize) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut payload = Vec::new();
    leb(&mut payload, name.len());
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(data);
    let mut bytes = std::fs::read(component).expect("read component");
    bytes.push(0);
    leb(&mut bytes, payload.len());
    bytes.extend_from_slice(&payload);
    std::fs::write(component, bytes).expect("write component");
}

#[test]
fn a_section_naming_a_path_outside_its_directory_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    let root = chaos(&plugins, "");
    let cache_dir = tmp.path().join("cache");
    for name in [
        "../../../escaped.py",
        "/tmp/escaped.py",
        "pkg/../../escaped.py",
        "escaped.sh",
    ] {
        let component = root.join("chaos_job.wasm");
        let original = std::fs::read(&component).unwrap();
        let data = serde_json::json!({ "version": 1, "files": { name: "import os\n" } });
        append_raw_section(&component, dev_sources::SECTION, data.to_string().as_bytes());
        let catalog = Catalog::load(&plugins, &executor(1), &CompileCache::new(&cache_dir)).expect("catalog");
        assert!(catalog.get("ChaosJob").is_none(), "{name}: loaded");
        let [broken] = catalog.broken() else {
            panic!("{name}: {:?}", catalog.broken())
        };
        assert!(
            broken.error.contains("refused") && broken.error.contains(&format!("{name:?}")),
            "{name}: {}",
            broken.error
        );
        std::fs::write(&component, original).unwrap();
    }
    let written: Vec<_> = walk(tmp.path())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "escaped.py" || n == "escaped.sh"))
        .collect();
    assert!(written.is_empty(), "{written:?}");
    assert!(!Path::new("/tmp/escaped.py").exists());
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_reads_its_sources_and_cannot_change_them_or_reach_past_them() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    let root = chaos(&plugins, "");
    let files: BTreeMap<String, String> = [("app.py", "x = 1\n"), ("pkg/util.py", "y = 2\n")]
        .into_iter()
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
        .collect();
    let component = root.join("chaos_job.wasm");
    let mut bytes = std::fs::read(&component).unwrap();
    dev_sources::append(&mut bytes, &DevSources::new(files).unwrap()).unwrap();
    std::fs::write(&component, bytes).unwrap();
    let cache_dir = tmp.path().join("cache");
    std::fs::write(tmp.path().join("secret"), "not yours").unwrap();
    let executor = executor(1);
    let catalog = Catalog::load(&plugins, &executor, &CompileCache::new(&cache_dir)).expect("catalog");
    assert!(catalog.broken().is_empty(), "{:?}", catalog.broken());

    let read = run(
        &executor,
        &catalog,
        "ChaosJob",
        r#"["read", "/.wasmjobs/app/pkg/util.py"]"#,
    )
    .await;
    assert_eq!(read.outcome, Outcome::Success, "{:?}", messages(&read));
    assert!(
        messages(&read).iter().any(|m| m == "read: y = 2\n"),
        "{:?}",
        messages(&read)
    );
    for (attempt, args) in [
        ("write", r#"["write", "/.wasmjobs/app/app.py", "x = 666"]"#),
        ("create", r#"["write", "/.wasmjobs/app/new.py", "x"]"#),
        ("remove", r#"["remove", "/.wasmjobs/app/app.py"]"#),
        ("read past", r#"["read", "/.wasmjobs/app/../../secret"]"#),
    ] {
        let outcome = run(&executor, &catalog, "ChaosJob", args).await;
        assert!(
            matches!(outcome.outcome, Outcome::Retry(_)),
            "{attempt}: {:?} {:?}",
            outcome.outcome,
            messages(&outcome)
        );
    }
    let unpacked = walk(&cache_dir.join("dev-sources"));
    let app = unpacked
        .iter()
        .find(|p| p.ends_with("app.py"))
        .expect("app.py unpacked in the cache");
    assert_eq!(
        std::fs::read_to_string(app).unwrap(),
        "x = 1\n",
        "the source is as carried"
    );
    assert!(!unpacked.iter().any(|p| p.ends_with("new.py")));
}

#[test]
fn a_manifest_grant_at_the_sources_guest_path_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    let root = chaos(
        &plugins,
        "[[files]]\nhost = \"data\"\nguest = \"/.wasmjobs/app\"\nmode = \"rw\"\n",
    );
    std::fs::create_dir_all(root.join("data")).unwrap();
    let component = root.join("chaos_job.wasm");
    let mut bytes = std::fs::read(&component).unwrap();
    let files = [("app.py".to_owned(), String::new())].into_iter().collect();
    dev_sources::append(&mut bytes, &DevSources::new(files).unwrap()).unwrap();
    std::fs::write(&component, bytes).unwrap();
    let catalog = Catalog::load(&plugins, &executor(1), &CompileCache::new(tmp.path().join("cache"))).expect("catalog");
    let [broken] = catalog.broken() else {
        panic!("{:?}", catalog.broken())
    };
    assert!(broken.error.contains("development build"), "{}", broken.error);
}

//! Filesystem escapes (issue 13 items 1 and 2): a guest that writes its own
//! manifest, component or the compile cache through a read-write grant, and
//! a guest (or anyone) that swaps a granted directory for a symlink after
//! the plugin loaded.

use std::path::{Path, PathBuf};

use wasmjobs::job::Outcome;
use wasmjobs::plugin::catalog::Change;
use wasmjobs::plugin::{Catalog, CompileCache};
use wasmjobs_e2e::{cache, catalog, copy_plugin, executor, messages, run, test_guests_dir};

/// The chaos guest copied into `dir`, with `files` (TOML `[[files]]`
/// tables) instead of its own grants, and `component` as its component path.
fn chaos_with(dir: &Path, component: &str, files: &str) -> PathBuf {
    let root = copy_plugin(&test_guests_dir().join("chaos"), dir);
    if component != "chaos_job.wasm" {
        let target = root.join(component);
        std::fs::create_dir_all(target.parent().expect("component dir")).expect("component dir");
        std::fs::rename(root.join("chaos_job.wasm"), target).expect("move component");
    }
    std::fs::write(
        root.join("wasmjobs.toml"),
        format!("component = {component:?}\nclasses = [\"ChaosJob\"]\n{files}"),
    )
    .expect("write manifest");
    root
}

/// Loads `dir` with `cache` and returns the single broken plugin's error.
fn refused(dir: &Path, cache: &CompileCache) -> String {
    let catalog = Catalog::load(dir, &executor(1), cache).expect("catalog");
    assert!(
        catalog.get("ChaosJob").is_none(),
        "the plugin loaded although it should be refused"
    );
    let [broken] = catalog.broken() else {
        panic!("expected one broken plugin, got {:?}", catalog.broken())
    };
    broken.error.clone()
}

fn rw(host: &str, guest: &str) -> String {
    format!("[[files]]\nhost = {host:?}\nguest = {guest:?}\nmode = \"rw\"\n")
}

#[test]
fn a_read_write_grant_of_the_plugin_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = chaos_with(tmp.path(), "chaos_job.wasm", &rw(".", "/data"));
    let error = refused(tmp.path(), &cache());
    assert!(error.contains("wasmjobs.toml"), "{error}");
    assert!(
        error.contains("plugin directory") && error.contains("read-write"),
        "{error}"
    );
    // Read-only, the same grant is fine.
    std::fs::write(
        root.join("wasmjobs.toml"),
        "component = \"chaos_job.wasm\"\nclasses = [\"ChaosJob\"]\n[[files]]\nhost = \".\"\nguest = \"/p\"\nmode = \"ro\"\n",
    )
    .unwrap();
    catalog(tmp.path(), &executor(1));
}

#[test]
fn a_read_write_grant_holding_the_component_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    chaos_with(tmp.path(), "data/chaos_job.wasm", &rw("data", "/data"));
    let error = refused(tmp.path(), &cache());
    assert!(error.contains("component"), "{error}");
}

#[test]
fn a_read_write_grant_reaching_the_compile_cache_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data-dir");
    let cache_dir = data_dir.join("cache");
    std::fs::create_dir_all(&cache_dir).unwrap();
    let plugins = tmp.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let redis_dir = data_dir.join("redis");
    for grant in [&data_dir, &cache_dir, &redis_dir] {
        chaos_with(
            &plugins,
            "chaos_job.wasm",
            &format!(
                "{}outside = true\n",
                rw(grant.to_str().expect("utf-8 temp path"), "/state")
            ),
        );
        let error = refused(&plugins, &CompileCache::new(&cache_dir));
        assert!(error.contains("cache"), "{error}");
    }
}

/// Plugins kept inside the data directory still get grants in their own
/// directories.
#[test]
fn a_plugins_directory_inside_the_data_directory_keeps_its_grants() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    chaos_with(&plugins, "chaos_job.wasm", &rw("data", "/data"));
    let catalog = Catalog::load(&plugins, &executor(1), &CompileCache::new(tmp.path().join("cache"))).unwrap();
    assert!(catalog.broken().is_empty(), "{:?}", catalog.broken());
    assert!(catalog.get("ChaosJob").is_some());
}

#[test]
fn a_read_write_grant_of_another_plugins_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("other")).unwrap();
    std::fs::write(tmp.path().join("other/wasmjobs.toml"), "not a manifest").unwrap();
    let other = tmp.path().join("other");
    chaos_with(
        tmp.path(),
        "chaos_job.wasm",
        &format!(
            "{}outside = true\n",
            rw(other.to_str().expect("utf-8 temp path"), "/other")
        ),
    );
    let catalog = Catalog::load(tmp.path(), &executor(1), &cache()).expect("catalog");
    assert!(catalog.get("ChaosJob").is_none());
    assert!(
        catalog
            .broken()
            .iter()
            .any(|b| b.manifest.ends_with("chaos/wasmjobs.toml") && b.error.contains("plugins directory")),
        "{:?}",
        catalog.broken()
    );
}

#[test]
fn nested_and_repeated_grants_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let nested = format!(
        "{}[[files]]\nhost = \"data/cfg\"\nguest = \"/cfg\"\nmode = \"ro\"\n",
        rw("data", "/data")
    );
    let root = chaos_with(tmp.path(), "chaos_job.wasm", &nested);
    std::fs::create_dir_all(root.join("data/cfg")).unwrap();
    let error = refused(tmp.path(), &cache());
    assert!(
        error.contains("overlap") && error.contains("/data") && error.contains("/cfg"),
        "{error}"
    );

    let twice = format!(
        "{}[[files]]\nhost = \"data/.\"\nguest = \"/again\"\nmode = \"ro\"\n",
        rw("data", "/data")
    );
    std::fs::write(
        root.join("wasmjobs.toml"),
        format!("component = \"chaos_job.wasm\"\nclasses = [\"ChaosJob\"]\n{twice}"),
    )
    .unwrap();
    let error = refused(tmp.path(), &cache());
    assert!(error.contains("overlap") && error.contains("/again"), "{error}");
}

/// The reload path: a manifest rewritten to grant its own directory
/// read-write is rejected, and the version already loaded keeps serving.
#[test]
fn a_reload_that_grants_the_plugin_directory_read_write_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let root = chaos_with(tmp.path(), "chaos_job.wasm", &rw("data", "/data"));
    let executor = executor(1);
    let loaded = catalog(tmp.path(), &executor);
    std::fs::write(
        root.join("wasmjobs.toml"),
        format!(
            "component = \"chaos_job.wasm\"\nclasses = [\"ChaosJob\"]\n{}",
            rw(".", "/data")
        ),
    )
    .unwrap();
    let (next, change) = loaded.rescan(&root, &executor, &cache());
    let Change::Rejected { error, kept } = change else {
        panic!("expected the new version to be rejected, got {change:?}")
    };
    assert!(error.contains("plugin directory"), "{error}");
    assert!(kept.is_some());
    assert!(next.get("ChaosJob").is_some());
}

/// Item 2: after load, the granted directory is swapped for a symlink to
/// `/`. Jobs keep seeing the directory that was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_a_granted_directory_for_a_symlink_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = chaos_with(
        tmp.path(),
        "chaos_job.wasm",
        "[[files]]\nhost = \"cfg\"\nguest = \"/cfg\"\nmode = \"ro\"\n",
    );
    std::fs::create_dir_all(root.join("cfg")).unwrap();
    std::fs::write(root.join("cfg/marker"), "original").unwrap();
    let executor = executor(1);
    let catalog = catalog(tmp.path(), &executor);

    std::fs::rename(root.join("cfg"), root.join("cfg.old")).unwrap();
    std::os::unix::fs::symlink("/", root.join("cfg")).unwrap();
    assert!(root.join("cfg/etc").is_dir(), "the swap took effect on the host");

    let escape = run(&executor, &catalog, "ChaosJob", r#"["read", "/cfg/etc/hostname"]"#).await;
    assert!(
        matches!(escape.outcome, Outcome::Retry(_)),
        "a job read the host's /etc/hostname through the swapped symlink: {:?} {:?}",
        escape.outcome,
        messages(&escape)
    );
    let original = run(&executor, &catalog, "ChaosJob", r#"["read", "/cfg/marker"]"#).await;
    assert_eq!(original.outcome, Outcome::Success, "{:?}", messages(&original));
    assert!(
        messages(&original).iter().any(|m| m == "read: original"),
        "{:?}",
        messages(&original)
    );
}

/// Item 2 as the issue reproduced it, with the guest doing the swap: a
/// read-write grant of the directory that holds a read-only grant is
/// refused at load, so the swap has no grant to go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_cannot_swap_a_nested_grant() {
    let tmp = tempfile::tempdir().unwrap();
    let nested = format!(
        "{}[[files]]\nhost = \"data/cfg\"\nguest = \"/cfg\"\nmode = \"ro\"\n",
        rw("data", "/data")
    );
    let root = chaos_with(tmp.path(), "chaos_job.wasm", &nested);
    std::fs::create_dir_all(root.join("data/cfg")).unwrap();
    let executor = executor(1);
    let catalog = Catalog::load(tmp.path(), &executor, &cache()).expect("catalog");
    let Some(_) = catalog.get("ChaosJob") else {
        // Refused at load: nothing to swap.
        assert!(catalog.broken()[0].error.contains("overlap"), "{:?}", catalog.broken());
        return;
    };
    let swap = run(
        &executor,
        &catalog,
        "ChaosJob",
        r#"["rename", "/data/cfg", "/data/cfg.old"]"#,
    )
    .await;
    assert_eq!(swap.outcome, Outcome::Success, "{:?}", messages(&swap));
    // The guest's second step (one chaos job does one operation, and with
    // `/data/cfg` renamed away, the old code fails every job at preopen
    // until the name is back): the symlink the guest would create.
    std::os::unix::fs::symlink("../../../../../../../../..", root.join("data/cfg")).unwrap();
    let escape = run(&executor, &catalog, "ChaosJob", r#"["read", "/cfg/etc/hostname"]"#).await;
    panic!(
        "nested grants loaded, and after the swap a job read /cfg/etc/hostname: {:?} {:?}",
        escape.outcome,
        messages(&escape)
    );
}

//! Loading plugin directories: good plugins load, broken ones are refused
//! with a reason naming the file, and never take the others down.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use wasmjobs::job::Outcome;

use wasmjobs::plugin::cache::UNUSED_FOR;
use wasmjobs::plugin::{CacheUse, Catalog, CompileCache};
use wasmjobs_e2e::{cache, copy_plugin, executor, messages, plugins_dir, run, test_guests_dir};

#[test]
fn the_example_plugins_all_load() {
    let executor = executor(1);
    let catalog = Catalog::load(&plugins_dir(), &executor, &cache()).expect("catalog");
    assert!(catalog.broken().is_empty(), "{:?}", catalog.broken());
    let classes: Vec<&str> = catalog.classes().map(|(c, _)| c).collect();
    assert_eq!(
        classes,
        [
            "AsyncHttpGetJob",
            "EchoJob",
            "FibJob",
            "FileAppendJob",
            "HttpGetJob",
            "JsEchoJob",
            "JsHttpGetJob",
            "JsNoopJob",
            "NoopJob",
            "PgSleepJob",
            "PyAsyncHttpGetJob",
            "PyHttpGetJob",
            "PyNoopJob",
            "PyReportJob",
            "SqlJob"
        ]
    );
}

#[test]
fn broken_plugins_are_refused_and_the_rest_still_load() {
    let temp = tempfile::tempdir().expect("tempdir");
    let root = temp.path();
    copy_plugin(&plugins_dir().join("noop"), root);

    // Garbage bytes where the component should be.
    let garbage = copy_plugin(&plugins_dir().join("echo"), root);
    std::fs::write(garbage.join("echo_job.wasm"), b"definitely not wasm").expect("write garbage");

    // A component of another world (a wasi:cli command).
    copy_plugin(&test_guests_dir().join("not-a-job"), root);

    // A manifest with an unknown key.
    let bad_manifest = copy_plugin(&plugins_dir().join("fib"), root);
    wasmjobs_e2e::append_to_manifest(&bad_manifest, "threads = 4");

    // A manifest naming a missing component.
    let missing = root.join("missing");
    std::fs::create_dir_all(&missing).expect("mkdir");
    std::fs::write(
        missing.join("wasmjobs.toml"),
        "component = \"gone.wasm\"\nclasses = [\"GoneJob\"]\n",
    )
    .expect("write");

    // A second plugin claiming an already served class.
    let twin = root.join("zz-twin");
    std::fs::create_dir_all(&twin).expect("mkdir");
    std::fs::copy(plugins_dir().join("noop/noop_job.wasm"), twin.join("noop_job.wasm")).expect("copy");
    std::fs::write(
        twin.join("wasmjobs.toml"),
        "component = \"noop_job.wasm\"\nclasses = [\"NoopJob\"]\n",
    )
    .expect("write");

    let executor = executor(1);
    let catalog = Catalog::load(root, &executor, &CompileCache::disabled()).expect("catalog");
    let classes: Vec<&str> = catalog.classes().map(|(c, _)| c).collect();
    assert_eq!(classes, ["NoopJob"]);

    let errors: Vec<&str> = catalog.broken().iter().map(|b| b.error.as_str()).collect();
    assert_eq!(errors.len(), 5, "{errors:#?}");
    let find = |needle: &str| errors.iter().find(|e| e.contains(needle)).copied();
    let echo = find("echo").expect("garbage echo refused");
    assert!(echo.contains("is not a WebAssembly component"), "{echo}");
    let world = find("not-a-job").expect("other world refused");
    assert!(world.contains("does not implement the wasmjobs:job/plugin"), "{world}");
    let manifest = find("fib").expect("bad manifest refused");
    assert!(
        manifest.contains("wasmjobs.toml") && manifest.contains("unknown field") && manifest.contains("threads"),
        "{manifest}"
    );
    let gone = find("gone.wasm").expect("missing component refused");
    assert!(
        gone.contains("is not built yet") && gone.contains("wasmjobs build "),
        "{gone}"
    );
    let twin = find("zz-twin").expect("duplicate class refused");
    assert!(twin.contains("already served"), "{twin}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_components_are_cached_on_disk() {
    let temp = tempfile::tempdir().expect("tempdir");
    let cache_dir = temp.path().join("cache");
    let cache = CompileCache::new(&cache_dir);
    let executor = executor(1);
    let first = Catalog::load(&plugins_dir().join("fib"), &executor, &cache).expect("catalog");
    assert_eq!(first.plugins()[0].cache, CacheUse::Compiled);
    let artifacts = files_in(&cache_dir, "cwasm");
    assert_eq!(artifacts.len(), 1);
    assert_eq!(
        files_in(&cache_dir, "functions").len(),
        1,
        "and its functions, for its next version"
    );

    let second = Catalog::load(&plugins_dir().join("fib"), &executor, &cache).expect("catalog");
    assert_eq!(second.plugins()[0].cache, CacheUse::Hit);
    assert_eq!(second.plugins()[0].version, first.plugins()[0].version);
    // Both serve from the mapped artifact, the compiling load included.
    for catalog in [&first, &second] {
        let execution = run(&executor, catalog, "FibJob", "[20]").await;
        assert!(
            messages(&execution).contains(&"fib(20) = 10946".to_owned()),
            "{:?}",
            execution.logs
        );
    }
    // Removing the file (as a cache cleanup would) does not disturb the
    // mappings in use: the plugin keeps running.
    std::fs::remove_file(&artifacts[0]).expect("remove artifact");
    let execution = run(&executor, &second, "FibJob", "[20]").await;
    assert_eq!(execution.outcome, Outcome::Success);
    drop((first, second));

    // A corrupt artifact is recompiled, not trusted, and replaced.
    std::fs::write(&artifacts[0], b"corrupt").expect("corrupt");
    let third = Catalog::load(&plugins_dir().join("fib"), &executor, &cache).expect("catalog");
    assert_eq!(third.plugins()[0].cache, CacheUse::Compiled);
    assert_eq!(run(&executor, &third, "FibJob", "[20]").await.outcome, Outcome::Success);
    let fourth = Catalog::load(&plugins_dir().join("fib"), &executor, &cache).expect("catalog");
    assert_eq!(fourth.plugins()[0].cache, CacheUse::Hit);
}

#[test]
fn loads_mark_artifacts_used_and_compiles_prune_the_unused() {
    let temp = tempfile::tempdir().expect("tempdir");
    let cache_dir = temp.path().join("cache");
    std::fs::create_dir_all(&cache_dir).expect("cache dir");
    let now = SystemTime::now();
    let age = |path: &Path, days: u64| {
        let file = std::fs::File::options().append(true).open(path).expect("open");
        file.set_modified(now - Duration::from_secs(days * 86_400))
            .expect("set mtime");
    };
    // An older plugin version nobody loaded for 8 days, one loaded 3 days
    // ago, and the temporary file of a write interrupted 2 days ago.
    let stale = cache_dir.join("old-version-0000000000000000.cwasm");
    let recent = cache_dir.join("recent-version-0000000000000000.cwasm");
    let abandoned = cache_dir.join(".tmpXYZ123");
    // And the function pack of a plugin no compile has used for 8 days.
    let stale_pack = cache_dir.join("0123456789abcdef-0000000000000000.functions");
    for (path, days) in [(&stale, 8), (&recent, 3), (&abandoned, 2), (&stale_pack, 8)] {
        std::fs::write(path, b"artifact").expect("write");
        age(path, days);
    }

    let executor = executor(1);
    let cache = CompileCache::new(&cache_dir);
    let first = Catalog::load(&plugins_dir().join("fib"), &executor, &cache).expect("catalog");
    assert_eq!(first.plugins()[0].cache, CacheUse::Compiled);
    assert!(!stale.exists(), "an artifact unused for over {UNUSED_FOR:?} is removed");
    assert!(!abandoned.exists(), "an interrupted write is removed");
    assert!(!stale_pack.exists(), "a function pack unused for as long is removed");
    assert!(recent.exists(), "an artifact used within the week is kept");

    let fib = files_in(&cache_dir, "cwasm")
        .into_iter()
        .find(|path| path != &recent)
        .expect("fib's artifact");
    age(&fib, 6);
    let second = Catalog::load(&plugins_dir().join("fib"), &executor, &cache).expect("catalog");
    assert_eq!(second.plugins()[0].cache, CacheUse::Hit);
    let used = std::fs::metadata(&fib).and_then(|m| m.modified()).expect("mtime");
    assert!(
        now.duration_since(used).unwrap_or_default() < Duration::from_secs(60),
        "a load marks its artifact as used"
    );
}

/// The files in `dir`.
/// The files in `dir` whose names end in `.{extension}`: compiled
/// artifacts (`cwasm`) or the function packs kept beside them (`functions`).
fn files_in(dir: &Path, extension: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect()
}

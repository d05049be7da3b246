//! Trust tests: the compile cache. Its artifacts are native code mapped
//! into the runner, so a cache directory (or artifact) that someone else
//! could write is never mapped from: the component is compiled in memory
//! instead.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use wasmjobs::plugin::{CacheUse, Catalog, CompileCache};
use wasmjobs_e2e::{executor, messages, plugins_dir, run};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_cache_directory_is_private() {
    let temp = tempfile::tempdir().expect("tempdir");
    let cache_dir = temp.path().join("data/cache");
    let executor = executor(1);
    let catalog =
        Catalog::load(&plugins_dir().join("fib"), &executor, &CompileCache::new(&cache_dir)).expect("catalog");
    assert_eq!(catalog.plugins()[0].cache, CacheUse::Compiled);
    assert_eq!(mode(&cache_dir), 0o700, "the cache directory is the runner's alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_writable_by_others_is_not_mapped_from() {
    let temp = tempfile::tempdir().expect("tempdir");
    let cache_dir = temp.path().join("cache");
    let cache = CompileCache::new(&cache_dir);
    let executor = executor(1);
    let fib = plugins_dir().join("fib");
    Catalog::load(&fib, &executor, &cache).expect("first load fills the cache");

    // World-writable: anyone could have replaced the artifact.
    chmod(&cache_dir, 0o777);
    let catalog = Catalog::load(&fib, &executor, &cache).expect("loads anyway");
    assert!(catalog.broken().is_empty(), "{:?}", catalog.broken());
    assert_ne!(
        catalog.plugins()[0].cache,
        CacheUse::Hit,
        "artifact mapped from a 0777 directory"
    );
    let execution = run(&executor, &catalog, "FibJob", "[20]").await;
    assert!(
        messages(&execution).contains(&"fib(20) = 10946".to_owned()),
        "{:?}",
        execution.logs
    );

    // A private directory again, but the artifact itself is group-writable.
    chmod(&cache_dir, 0o700);
    let artifact = std::fs::read_dir(&cache_dir)
        .expect("read cache")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("an artifact");
    chmod(&artifact, 0o664);
    let catalog = Catalog::load(&fib, &executor, &cache).expect("loads anyway");
    assert_ne!(
        catalog.plugins()[0].cache,
        CacheUse::Hit,
        "group-writable artifact mapped"
    );

    // A symlink in place of the artifact is not followed.
    let elsewhere = temp.path().join("elsewhere.cwasm");
    std::fs::rename(&artifact, &elsewhere).expect("move artifact");
    chmod(&elsewhere, 0o600);
    std::os::unix::fs::symlink(&elsewhere, &artifact).expect("symlink");
    let catalog = Catalog::load(&fib, &executor, &cache).expect("loads anyway");
    assert_ne!(
        catalog.plugins()[0].cache,
        CacheUse::Hit,
        "artifact mapped through a symlink"
    );

    // Back to private files: the cache is used again.
    std::fs::remove_file(&artifact).expect("remove symlink");
    Catalog::load(&fib, &executor, &cache).expect("recompiles and stores");
    let catalog = Catalog::load(&fib, &executor, &cache).expect("loads from cache");
    assert_eq!(catalog.plugins()[0].cache, CacheUse::Hit);
}

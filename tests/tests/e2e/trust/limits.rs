//! Trust tests: resource limits that a guest must not get around — memory
//! spread over several memories and tables (issue 13, item 4), and a
//! manifest asking for more than the runner's caps (item 9).

use std::path::Path;

use wasmjobs::job::Outcome;
use wasmjobs::plugin::Catalog;
use wasmjobs_e2e::{cache, executor_with, repo_root, run};

/// Writes a plugin built from `tests/guests/wat/memories.wat` into `dir`:
/// `memories` linear memories and `tables` tables, `perform` growing each
/// memory by `grow_pages` pages; `limits` is appended to its manifest.
fn wat_plugin(dir: &Path, memories: usize, tables: usize, grow_pages: u32, limits: &str) {
    let source = std::fs::read_to_string(repo_root().join("tests/guests/wat/memories.wat")).expect("memories.wat");
    let extra = memories.saturating_sub(1);
    let mut instances = String::new();
    let mut imports = String::new();
    let mut with = String::new();
    let mut grows = format!("(drop (memory.grow (i32.const {grow_pages})))\n");
    for n in 0..extra {
        instances += &format!("(core instance $m{n} (instantiate $memory))\n");
        imports += &format!("(import \"m{n}\" \"grow\" (func $grow{n} (param i32)))\n");
        with += &format!("(with \"m{n}\" (instance $m{n})) ");
        grows += &format!("(call $grow{n} (i32.const {grow_pages}))\n");
    }
    for n in 0..tables {
        instances += &format!("(core instance $t{n} (instantiate $table))\n");
    }
    let text = source
        .replace("@EXTRA_INSTANCES@", &instances)
        .replace("@IMPORTS@", &imports)
        .replace("@WITH@", &with)
        .replace("@GROWS@", &grows);
    let component = wat::parse_str(&text).expect("memories.wat compiles");
    std::fs::create_dir_all(dir).expect("plugin dir");
    std::fs::write(dir.join("memories.wasm"), component).expect("write component");
    std::fs::write(
        dir.join("wasmjobs.toml"),
        format!("component = \"memories.wasm\"\nclasses = [\"MemoriesJob\"]\n{limits}\n"),
    )
    .expect("write manifest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_applies_to_the_sum_of_memories() {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = temp.path().join("two");
    // Two memories of 3 MiB each under a 4 MiB limit: each alone fits.
    wat_plugin(&dir, 2, 0, 47, "[limits]\nmemory = \"4MiB\"");
    let executor = executor_with(4, std::time::Duration::from_secs(10), 128 << 20);
    let catalog = Catalog::load(&dir, &executor, &cache()).expect("catalog");
    assert!(catalog.broken().is_empty(), "{:?}", catalog.broken());
    let job = run(&executor, &catalog, "MemoriesJob", "[]").await;
    let Outcome::Retry(message) = &job.outcome else {
        panic!(
            "two 3 MiB memories under a 4 MiB limit must fail, got {:?}",
            job.outcome
        )
    };
    assert!(message.contains("memory limit of 4.0 MiB exceeded"), "{message}");

    // Within the limit in total, the same guest succeeds.
    let small = temp.path().join("small");
    wat_plugin(&small, 2, 0, 16, "[limits]\nmemory = \"4MiB\"");
    let catalog = Catalog::load(&small, &executor, &cache()).expect("catalog");
    let job = run(&executor, &catalog, "MemoriesJob", "[]").await;
    assert_eq!(job.outcome, Outcome::Success, "{:?}", job.logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_needing_more_than_a_pool_slot_are_refused_at_load() {
    let temp = tempfile::tempdir().expect("tempdir");
    let executor = executor_with(4, std::time::Duration::from_secs(10), 128 << 20);
    for (name, memories, tables, what) in [("memories", 3, 0, "linear memories"), ("tables", 1, 5, "tables")] {
        let dir = temp.path().join(name);
        wat_plugin(&dir, memories, tables, 0, "");
        let catalog = Catalog::load(&dir, &executor, &cache()).expect("catalog");
        assert!(catalog.get("MemoriesJob").is_none(), "{name}: loaded");
        let error = &catalog.broken().first().expect("refused").error;
        assert!(
            error.contains(what) && error.contains("pooling allocator"),
            "{name}: {error}"
        );
    }
    // Two memories and four tables fit a slot.
    let dir = temp.path().join("fits");
    wat_plugin(&dir, 2, 4, 0, "");
    let catalog = Catalog::load(&dir, &executor, &cache()).expect("catalog");
    assert!(catalog.broken().is_empty(), "{:?}", catalog.broken());
    let job = run(&executor, &catalog, "MemoriesJob", "[]").await;
    assert_eq!(job.outcome, Outcome::Success, "{:?}", job.logs);
}

/// Loads a copy of the chaos guest whose manifest has `top` (top-level keys)
/// put first and `tables` appended, on an executor whose caps are 128 MiB
/// and 10 s, and returns the load error.
fn chaos_refusal(top: &str, tables: &str) -> Option<String> {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = wasmjobs_e2e::copy_plugin(&wasmjobs_e2e::test_guests_dir().join("chaos"), temp.path());
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    std::fs::write(&manifest, format!("{top}\n{text}\n{tables}\n")).expect("write manifest");
    let executor = executor_with(2, std::time::Duration::from_secs(10), 128 << 20);
    let catalog = Catalog::load(&dir, &executor, &cache()).expect("catalog");
    catalog.broken().first().map(|b| b.error.clone())
}

#[test]
fn runner_flags_cap_what_a_manifest_may_ask_for() {
    let error = chaos_refusal("", "[limits]\nmemory = \"256MiB\"").expect("256 MiB over a 128 MiB cap must be refused");
    assert!(error.contains("--memory") && error.contains("128.0 MiB"), "{error}");
    let error = chaos_refusal("", "[limits]\ntimeout = \"10m\"").expect("10 min over a 10 s cap must be refused");
    assert!(error.contains("--job-timeout") && error.contains("10s"), "{error}");
    let error =
        chaos_refusal("", "[limits]\ndisk = \"2GiB\"").expect("2 GiB over the 1 GiB default cap must be refused");
    assert!(error.contains("--disk") && error.contains("1024.0 MiB"), "{error}");
    // At or under the caps is fine.
    assert_eq!(
        chaos_refusal("", "[limits]\nmemory = \"128MiB\"\ntimeout = \"10s\""),
        None
    );
}

#[test]
fn env_grants_cannot_pass_the_runners_own_secrets() {
    for name in ["REDIS_URL", "WASMJOBS_DB", "WASMJOBS_DATA_DIR", "DATABASE_URL"] {
        let error = chaos_refusal(&format!("env = [\"{name}\"]"), "")
            .unwrap_or_else(|| panic!("env = [{name:?}] must be refused"));
        assert!(error.contains(name), "{error}");
    }
    assert_eq!(chaos_refusal("env = [\"API_TOKEN\"]", ""), None);
}

//! Trust tests: http.
//!
//! A granted *name* must not lead to the host's own network: a plugin
//! author who controls the DNS of `*.example.org` can point it at
//! `127.0.0.1` or `169.254.169.254`. These tests use names that resolve
//! to loopback on any glibc machine without touching `/etc/hosts`: the
//! inet_aton spellings of `127.0.0.1` (`2130706433`, `127.1`), which are
//! names to the allow list and the URL parser but loopback to the
//! resolver, and a wildcard rule (`*.0.0.1`) that matches the IP literal
//! without naming it. And a job must not keep more than 100 responses
//! open by never reading them.

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use wasmjobs::job::Outcome;
use wasmjobs::plugin::Catalog;
use wasmjobs::sandbox::{Execution, Executor};
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::{catalog, copy_plugin, executor, messages, run, test_guests_dir};

/// A private copy of the chaos guest whose `http.allow` is `allow`.
fn chaos_allowing(allow: &[&str]) -> tempfile::TempDir {
    let quoted: Vec<String> = allow.iter().map(|rule| format!("{rule:?}")).collect();
    chaos_with_allow(&quoted.join(", "))
}

/// A private copy of the chaos guest whose `http.allow` list holds the
/// TOML items `items` (strings or `{ host = .., h2 = .. }` tables).
fn chaos_with_allow(items: &str) -> tempfile::TempDir {
    chaos_with_allow_as(items, None)
}

/// Like [`chaos_with_allow`], with the job class renamed to `class` (so
/// two copies can be loaded into one catalog as different plugins).
fn chaos_with_allow_as(items: &str, class: Option<&str>) -> tempfile::TempDir {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let stock = r#"allow = ["127.0.0.1:*"]"#;
    assert!(text.contains(stock), "the chaos manifest's http.allow line changed");
    let mut edited = text.replace(stock, &format!("allow = [{items}]"));
    if let Some(class) = class {
        let classes = r#"classes = ["ChaosJob"]"#;
        assert!(edited.contains(classes), "the chaos manifest's classes line changed");
        edited = edited.replace(classes, &format!("classes = [{class:?}]"));
    }
    std::fs::write(&manifest, edited).expect("write manifest");
    temp
}

/// Runs `n` jobs of `class` with `args` at once; their outcomes and logs.
async fn run_many(
    executor: &Arc<Executor>,
    catalog: &Arc<Catalog>,
    class: &str,
    args: &str,
    n: usize,
) -> Vec<Execution> {
    let mut jobs = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (executor, catalog) = (executor.clone(), catalog.clone());
        let (class, args) = (class.to_owned(), args.to_owned());
        jobs.spawn(async move { run(&executor, &catalog, &class, &args).await });
    }
    let mut done = Vec::with_capacity(n);
    while let Some(job) = jobs.join_next().await {
        done.push(job.expect("job task"));
    }
    done
}

/// Asserts that the system resolver maps `name` to 127.0.0.1, so that the
/// test below really exercises a name that reaches loopback (and fails
/// loudly, rather than passing vacuously, on a resolver that doesn't).
fn assert_resolves_to_loopback(name: &str) {
    let addrs: Vec<IpAddr> = (name, 80)
        .to_socket_addrs()
        .unwrap_or_else(|e| panic!("resolve {name}: {e}"))
        .map(|a| a.ip())
        .collect();
    assert!(
        addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
        "{name} resolves to {addrs:?}, not 127.0.0.1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_names_resolving_to_loopback_are_refused() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let port = server.addr.port();
    let executor = executor(2);
    // (rule, URL host): each rule grants the host as a name or a wildcard,
    // none names the IP literal 127.0.0.1 or `localhost`.
    let cases = [
        ("2130706433:*", "2130706433"),
        ("127.1:*", "127.1"),
        ("*.0.0.1:*", "127.0.0.1"),
    ];
    for (rule, host) in cases {
        assert_resolves_to_loopback(host);
        let dir = chaos_allowing(&[rule]);
        let chaos = catalog(dir.path(), &executor);
        let url = format!("http://{host}:{port}/ok");
        let job = run(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#)).await;
        let Outcome::Retry(message) = &job.outcome else {
            panic!(
                "{rule}: GET {url} must be refused, got {:?} {:?}",
                job.outcome,
                messages(&job)
            )
        };
        assert!(
            message.contains("destination IP address prohibited"),
            "{rule}: {message}"
        );
        let stats = &chaos.get("ChaosJob").expect("chaos").loaded.grants.http_stats;
        assert_eq!(stats.prohibited.load(Ordering::Relaxed), 1, "{rule}: counted");
    }
    assert_eq!(server.hits(), 0, "no refused request reached the loopback server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_naming_loopback_still_reach_it() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let port = server.addr.port();
    let executor = executor(2);
    for (rule, host) in [("127.0.0.1:*", "127.0.0.1"), ("localhost:*", "localhost")] {
        let dir = chaos_allowing(&[rule]);
        let chaos = catalog(dir.path(), &executor);
        let url = format!("http://{host}:{port}/ok");
        let job = run(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#)).await;
        assert_eq!(job.outcome, Outcome::Success, "{rule}: {:?}", messages(&job));
    }
    assert_eq!(server.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_held_unread_count_against_the_job_limit() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let executor = executor(2);
    let chaos = catalog(&test_guests_dir().join("chaos"), &executor);
    let job = run(
        &executor,
        &chaos,
        "ChaosJob",
        &format!(r#"["http-hold", 101, "{}", "/ok"]"#, server.addr),
    )
    .await;
    assert_eq!(job.outcome, Outcome::Success, "{:?}", job.outcome);
    let logged = messages(&job);
    assert!(
        logged.contains(&"hold: ok=100 failed=1".to_owned()),
        "a job may hold 100 responses open: {logged:?}"
    );
    assert!(
        logged.contains(&"hold error: ErrorCode::ConnectionLimitReached".to_owned()),
        "{logged:?}"
    );
    assert_eq!(server.hits(), 100, "the 101st request never left the process");

    // The held responses were dropped with the job: the next job has all
    // its slots (the count is per job, and nothing leaked into the pool).
    let again = run(
        &executor,
        &chaos,
        "ChaosJob",
        &format!(r#"["http-hold", 100, "{}", "/ok"]"#, server.addr),
    )
    .await;
    assert!(
        messages(&again).contains(&"hold: ok=100 failed=0".to_owned()),
        "{:?}",
        messages(&again)
    );
}

/// Over HTTP/2 (prior knowledge, granted by `h2 = true`), 1,000 jobs in
/// flight at once share a handful of connections; a rule without `h2`
/// keeps speaking HTTP/1.1 to an HTTP/1.1-only server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_rules_multiplex_and_h1_rules_keep_working() {
    let h2 = HttpServer::start_h2(Duration::from_millis(200), 1_000).await;
    let h1 = HttpServer::start(Duration::from_millis(1)).await;
    let executor = Arc::new(executor(1_000));
    let dir = chaos_with_allow(&format!(
        r#"{{ host = "127.0.0.1:{}", h2 = true }}, "127.0.0.1:{}""#,
        h2.addr.port(),
        h1.addr.port()
    ));
    let chaos = Arc::new(catalog(dir.path(), &executor));

    let url = h2.url("/sleep");
    let jobs = run_many(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#), 1_000).await;
    for job in &jobs {
        assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(job));
    }
    assert_eq!(h2.hits(), 1_000);
    assert!(
        h2.peak_open_requests() >= 100,
        "the requests overlapped: peak {}",
        h2.peak_open_requests()
    );
    // Lanes of 100 streams pack 1,000 requests into 10 connections; once,
    // under the whole suite's parallel load, the server counted 11 (cause
    // not established: a lane's second connection while its first was
    // being set up is the suspect). Over HTTP/1.1 it would be ~1,000.
    assert!(
        h2.connections() <= 16,
        "1,000 concurrent requests over HTTP/2 took {} connections",
        h2.connections()
    );

    let url = h1.url("/ok");
    let jobs = run_many(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#), 50).await;
    for job in &jobs {
        assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(job));
    }
    assert_eq!(h1.hits(), 50, "the HTTP/1.1-only server answered every job");
}

/// A server allows only so many streams per HTTP/2 connection (100 here,
/// as many servers do): past that, requests on one connection queue until
/// a stream frees. 300 jobs in flight must spread over a few connections
/// and all be open at the server at once, not wait in rounds of 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_opens_another_connection_when_the_streams_of_one_are_used_up() {
    let server = HttpServer::start_h2(Duration::from_millis(200), 100).await;
    let executor = Arc::new(executor(300));
    let dir = chaos_with_allow(&format!(
        r#"{{ host = "127.0.0.1:{}", h2 = true }}"#,
        server.addr.port()
    ));
    let chaos = Arc::new(catalog(dir.path(), &executor));

    let url = server.url("/sleep");
    let jobs = run_many(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#), 300).await;
    for job in &jobs {
        assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(job));
    }
    assert_eq!(server.hits(), 300);
    assert!(
        server.peak_open_requests() > 100,
        "300 requests in flight never had more than one connection's 100 streams open at once: peak {} over {} connections",
        server.peak_open_requests(),
        server.connections()
    );
    assert!(
        server.connections() <= 10,
        "300 concurrent requests over HTTP/2 took {} connections",
        server.connections()
    );
}

/// Connection pools are per plugin: a plugin holding every stream the
/// server allows on its connection does not make another plugin's
/// requests to the same host wait (in a shared pool they would queue
/// behind the first plugin's streams until those finish).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_holding_its_connections_does_not_delay_another() {
    let server = HttpServer::start_h2(Duration::from_millis(1), 10).await;
    let rule = format!(r#"{{ host = "127.0.0.1:{}", h2 = true }}"#, server.addr.port());
    let executor = Arc::new(executor(20));
    let plugins = tempfile::tempdir().expect("tempdir");
    for class in ["HoggerJob", "PoliteJob"] {
        let one = chaos_with_allow_as(&rule, Some(class));
        std::fs::rename(one.path().join("chaos"), plugins.path().join(class)).expect("move plugin copy");
    }
    let catalog = Arc::new(catalog(plugins.path(), &executor));

    // The hogger takes every stream of its connection: 10 jobs on /gate.
    let gate = server.url("/gate");
    let hogging = {
        let (executor, catalog) = (executor.clone(), catalog.clone());
        let args = format!(r#"["http", "{gate}"]"#);
        tokio::spawn(async move { run_many(&executor, &catalog, "HoggerJob", &args, 10).await })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.gate_hits() < 10 {
        assert!(
            Instant::now() < deadline,
            "the hogger's requests never arrived: {}",
            server.gate_hits()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The other plugin's request goes through while the gate is shut.
    let ok = server.url("/ok");
    let polite = tokio::time::timeout(
        Duration::from_secs(10),
        run(&executor, &catalog, "PoliteJob", &format!(r#"["http", "{ok}"]"#)),
    )
    .await;
    server.open_gate();
    let polite = polite.expect("the other plugin's request waited for the first plugin's connections");
    assert_eq!(polite.outcome, Outcome::Success, "{:?}", messages(&polite));
    for job in hogging.await.expect("hogger") {
        assert_eq!(job.outcome, Outcome::Success, "{:?}", messages(&job));
    }
}

/// The connected-address check holds for HTTP/2 connections too: a name
/// granted with `h2 = true` that resolves to loopback is refused before
/// the HTTP/2 preface is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_rules_granting_names_still_refuse_loopback() {
    let server = HttpServer::start_h2(Duration::from_millis(1), 100).await;
    let port = server.addr.port();
    let executor = executor(2);
    assert_resolves_to_loopback("2130706433");
    let dir = chaos_with_allow(r#"{ host = "2130706433:*", h2 = true }"#);
    let chaos = catalog(dir.path(), &executor);
    let url = format!("http://2130706433:{port}/ok");
    let job = run(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#)).await;
    let Outcome::Retry(message) = &job.outcome else {
        panic!("GET {url} must be refused, got {:?} {:?}", job.outcome, messages(&job))
    };
    assert!(message.contains("destination IP address prohibited"), "{message}");
    let stats = &chaos.get("ChaosJob").expect("chaos").loaded.grants.http_stats;
    assert_eq!(stats.prohibited.load(Ordering::Relaxed), 1);
    assert_eq!(server.connections(), 0, "refused at resolution, before any connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_names_the_rule_that_would_grant_it() {
    let server = HttpServer::start(Duration::from_millis(1)).await;
    let port = server.addr.port();
    let executor = executor(2);
    let dir = chaos_allowing(&["example.com"]);
    let chaos = catalog(dir.path(), &executor);
    let url = format!("http://127.0.0.1:{port}/ok");
    let job = run(&executor, &chaos, "ChaosJob", &format!(r#"["http", "{url}"]"#)).await;
    let Outcome::Retry(message) = &job.outcome else {
        panic!("GET {url} must be denied, got {:?} {:?}", job.outcome, messages(&job))
    };
    let advice = format!(r#"add "127.0.0.1:{port}" to [http] allow"#);
    assert!(message.contains(&advice), "{message}");
    assert!(
        message.starts_with(&format!("GET {url}")),
        "names the request: {message}"
    );
    let stats = &chaos.get("ChaosJob").expect("chaos").loaded.grants.http_stats;
    assert_eq!(stats.denied.load(Ordering::Relaxed), 1);
    assert_eq!(server.hits(), 0, "a denied request never leaves the process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_client_sends_method_headers_and_body_and_reads_the_whole_response() {
    for h2 in [false, true] {
        let server = if h2 {
            HttpServer::start_h2(Duration::from_millis(1), 100).await
        } else {
            HttpServer::start(Duration::from_millis(1)).await
        };
        let executor = executor(2);
        let dir = chaos_with_allow(&format!(r#"{{ host = "127.0.0.1:*", h2 = {h2} }}"#));
        let chaos = catalog(dir.path(), &executor);
        let url = server.url("/echo");
        let job = run(&executor, &chaos, "ChaosJob", &format!(r#"["http-echo", "{url}"]"#)).await;
        assert_eq!(job.outcome, Outcome::Success, "h2={h2}: {:?}", messages(&job));
        let logged = messages(&job);
        assert!(logged.contains(&"x-echo: yes".to_owned()), "h2={h2}: {logged:?}");
        let echoed = logged
            .iter()
            .find_map(|line| line.strip_prefix("echoed: "))
            .unwrap_or_else(|| panic!("h2={h2}: no echo in {logged:?}"));
        assert_eq!(
            echoed, r#"POST|x-test: chaos|content-type: application/json|content-length: 7||{"n":7}"#,
            "h2={h2}"
        );
        assert_eq!(server.hits(), 1);
    }
}

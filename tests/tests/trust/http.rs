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
use std::sync::atomic::Ordering;
use std::time::Duration;

use wasmjobs::job::Outcome;
use wasmjobs_e2e::http_server::HttpServer;
use wasmjobs_e2e::{catalog, copy_plugin, executor, messages, run, test_guests_dir};

/// A private copy of the chaos guest whose `http.allow` is `allow`.
fn chaos_allowing(allow: &[&str]) -> tempfile::TempDir {
    let temp = tempfile::tempdir().expect("tempdir");
    let dir = copy_plugin(&test_guests_dir().join("chaos"), temp.path());
    let manifest = dir.join("wasmjobs.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let quoted: Vec<String> = allow.iter().map(|rule| format!("{rule:?}")).collect();
    let stock = r#"allow = ["127.0.0.1:*"]"#;
    assert!(text.contains(stock), "the chaos manifest's http.allow line changed");
    let edited = text.replace(stock, &format!("allow = [{}]", quoted.join(", ")));
    std::fs::write(&manifest, edited).expect("write manifest");
    temp
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
        let stats = &chaos.get("ChaosJob").expect("chaos").http_stats;
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

//! What the dashboard trusts, tried as an attacker would: a page that
//! rebinds its own name to loopback (DNS rebinding), in a real Chromium
//! that resolves the foreign name itself; the same requests from a plain
//! client; the token typed into a form rather than put in a URL; and
//! clients that open a connection and never finish a request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{Value, json};
use wasmjobs::redis::payload::Payload;
use wasmjobs_e2e::browser::Browser;
use wasmjobs_e2e::dashboard::{Web, post_form, request};
use wasmjobs_e2e::redis_server::TestRedis;
use wasmjobs_e2e::runner::push;

/// An argument only the dashboard's pages show.
const SECRET: &str = "secret-arg-7f3a";

/// A dead job carrying [`SECRET`], and one job queued in `default`.
async fn something_to_steal(conn: &mut redis::aio::MultiplexedConnection) {
    let now = wasmjobs::redis::now_f64();
    let mut job = Payload::new("SecretJob", vec![json!(SECRET)], "default", now);
    job.set("error_message", json!("boom"));
    job.set("failed_at", json!(now));
    let _: () = conn.zadd("dead", job.to_json(), now).await.expect("ZADD");
    push(conn, "ChaosJob", "default", vec![json!(["ok"])]).await;
}

async fn queued(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    conn.llen("queue:default").await.expect("LLEN")
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().expect("a port")
}

/// What the page of a rebound name does: read `/dead` (payloads and the
/// CSRF token), then post `clear` for the queue with that token.
const REBOUND_PAGE: &str = r#"
(async () => {
  const read = await fetch('/dead');
  const page = await read.text();
  const token = (page.match(/name="csrf" value="([0-9a-f]{32})"/) || [])[1] || '';
  const post = await fetch('/queues/default/clear', {
    method: 'POST',
    headers: {'Content-Type': 'application/x-www-form-urlencoded'},
    body: 'csrf=' + token,
    redirect: 'manual',
  });
  done({read: read.status, leaked: page.includes(SECRET), token: token.length, post: post.status});
})().catch(err => done({error: String(err)}));
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_rebound_to_loopback_can_neither_read_nor_change_the_dashboard() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    something_to_steal(&mut conn).await;
    let (_web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let port = port(&addr);
    // Chromium itself resolves the attacker's name to the dashboard's
    // address, as it would once the attacker's DNS answered 127.0.0.1.
    let browser = Browser::start_with(
        "a_page_rebound_to_loopback_can_neither_read_nor_change_the_dashboard",
        &["--host-resolver-rules=MAP rebind.test 127.0.0.1"],
    )
    .await;
    browser.goto(&format!("http://rebind.test:{port}/")).await;
    let script = REBOUND_PAGE.replace("SECRET", &format!("{SECRET:?}"));
    let result = browser.execute_async(&script).await;
    assert_eq!(result["error"], Value::Null, "{result}");
    assert_eq!(result["read"], 421, "the rebound page read the dashboard: {result}");
    assert_eq!(result["leaked"], false, "{result}");
    assert_eq!(result["token"], 0, "a CSRF token reached the rebound page: {result}");
    assert_ne!(
        result["post"], 0,
        "the POST was answered with a redirect (done): {result}"
    );
    assert_eq!(queued(&mut conn).await, 1, "the queue was cleared: {result}");
    let dead: u64 = conn.zcard("dead").await.expect("ZCARD");
    assert_eq!(dead, 1);

    // The same browser under loopback's own names sees the dashboard.
    for name in ["127.0.0.1", "localhost"] {
        browser.goto(&format!("http://{name}:{port}/dead")).await;
        let text = browser.text("main").await;
        assert!(text.contains("SecretJob"), "{name}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_host_names_are_misdirected_unless_listed() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    something_to_steal(&mut conn).await;
    let (_web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);
    let port = port(&addr);
    let foreign = format!("rebind.attacker.example:{port}");
    let origin = format!("http://{foreign}");

    let read = request(&addr, "GET", "/dead", &[("Host", &foreign)], "");
    assert_eq!(read.status, 421, "{read:?}");
    assert!(!read.body.contains(SECRET), "{read:?}");
    assert!(read.body.contains("WASMJOBS_WEB_HOSTS"), "says what to do: {read:?}");
    let api = request(&addr, "GET", "/api/overview", &[("Host", &foreign)], "");
    assert_eq!(api.status, 421, "{api:?}");
    for path in [
        "/queues/default/clear",
        "/queues/default/pause",
        "/processes/signal",
        "/cancel",
        "/dead/act",
    ] {
        let post = request(
            &addr,
            "POST",
            path,
            &[
                ("Host", &foreign),
                ("Origin", &origin),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            "csrf=0123456789abcdef0123456789abcdef",
        );
        assert!(matches!(post.status, 421 | 403), "{path}: {post:?}");
    }
    assert_eq!(queued(&mut conn).await, 1);
    // A POST from loopback's name with a foreign Origin is refused too.
    let cross = request(
        &addr,
        "POST",
        "/queues/default/clear",
        &[
            ("Origin", &origin),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "",
    );
    assert_eq!(cross.status, 403, "{cross:?}");

    for name in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let page = request(&addr, "GET", "/dead", &[("Host", &name)], "");
        assert_eq!(page.status, 200, "{name}: {page:?}");
        assert!(page.body.contains(SECRET), "{name}");
    }
    // Another port of loopback is another origin.
    let other_port = request(&addr, "GET", "/", &[("Host", "127.0.0.1:1")], "");
    assert_eq!(other_port.status, 421, "{other_port:?}");

    // A name the operator lists (a reverse proxy's) is served.
    let (_proxied, proxied) = Web::start(&redis, "127.0.0.1:0", &[("WASMJOBS_WEB_HOSTS", "dash.example.com")]);
    let listed = request(&proxied, "GET", "/", &[("Host", "dash.example.com")], "");
    assert_eq!(listed.status, 200, "{listed:?}");
    let unlisted = request(&proxied, "GET", "/", &[("Host", "other.example.com")], "");
    assert_eq!(unlisted.status, 421, "{unlisted:?}");
}

/// The value of the `Set-Cookie` header setting `name`.
fn set_cookie(head: &str, name: &str) -> Option<String> {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(header, _)| header.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, value)| value.trim().to_owned())
        .find(|value| value.starts_with(&format!("{name}=")))
}

fn location(head: &str) -> Option<String> {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(header, _)| header.eq_ignore_ascii_case("location"))
        .map(|(_, value)| value.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_typed_into_a_form_and_never_travels_in_a_url() {
    let redis = TestRedis::start();
    let mut conn = redis.conn().await;
    something_to_steal(&mut conn).await;
    const TOKEN: &str = "t0ken for the tests; with spaces";
    let (_web, addr) = Web::start(&redis, "0.0.0.0:0", &[("WASMJOBS_WEB_TOKEN", TOKEN)]);

    let anonymous = request(&addr, "GET", "/dead?page=1", &[], "");
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert!(
        anonymous.body.contains(r#"name="token""#),
        "a sign-in form: {anonymous:?}"
    );
    assert!(!anonymous.body.contains(SECRET));
    let in_url = format!("/dead?token={}", url_encode(TOKEN));
    assert_eq!(
        request(&addr, "GET", &in_url, &[], "").status,
        401,
        "a token in the URL is no way in"
    );
    let wrong = post_form(&addr, "/login", "token=nope&next=%2Fdead");
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert!(set_cookie(&wrong.head, "wasmjobs_token").is_none());

    let signed_in = post_form(
        &addr,
        "/login",
        &format!("token={}&next=%2Fdead%3Fpage%3D1", url_encode(TOKEN)),
    );
    assert_eq!(signed_in.status, 303, "{signed_in:?}");
    assert_eq!(location(&signed_in.head).as_deref(), Some("/dead?page=1"));
    let cookie = set_cookie(&signed_in.head, "wasmjobs_token").expect("the sign-in cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().expect("name=value").to_owned();
    assert!(
        !pair.contains("t0ken"),
        "the cookie holds a digest, not the token: {pair}"
    );
    let page = request(&addr, "GET", "/dead", &[("Cookie", &pair)], "");
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains(SECRET));

    // Only paths on this site are followed back.
    let away = post_form(
        &addr,
        "/login",
        &format!("token={}&next=%2F%2Fevil.example%2F", url_encode(TOKEN)),
    );
    assert_eq!(location(&away.head).as_deref(), Some("/"), "{away:?}");

    // And in a real browser: the form, then the page asked for.
    let browser = Browser::start("the_token_is_typed_into_a_form_and_never_travels_in_a_url").await;
    browser.goto(&format!("http://{addr}/dead")).await;
    browser
        .find("input#token")
        .await
        .send_keys(TOKEN)
        .await
        .expect("type the token");
    browser.click_to_navigate("button#sign-in").await;
    assert_eq!(browser.path().await, "/dead");
    let text = browser.text("main").await;
    assert!(text.contains("SecretJob"), "{text}");
}

fn url_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Reads until the server closes the connection; how long that took, or
/// `None` if it was still open after `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    stream.set_read_timeout(Some(limit)).expect("read timeout");
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => continue,
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(_) => return Some(started.elapsed()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_holds_neither_a_connection_nor_a_shutdown() {
    let redis = TestRedis::start();
    let (mut web, addr) = Web::start(&redis, "127.0.0.1:0", &[]);

    // A head that never ends is cut off (the server's header timeout).
    let mut slow = TcpStream::connect(&addr).expect("connect");
    slow.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .expect("half a head");
    let closed = closed_within(&mut slow, Duration::from_secs(60));
    assert!(closed.is_some(), "a half-sent request held its connection for 60 s");

    // SIGTERM while a client holds another half-sent request: it stops.
    let mut held = TcpStream::connect(&addr).expect("connect");
    held.write_all(b"POST /queues/default/clear HTTP/1.1\r\nHost: ")
        .expect("half a head");
    // The server has the connection once a full request on another one is answered.
    assert_eq!(request(&addr, "GET", "/api/overview", &[], "").status, 200);
    let asked = Instant::now();
    web.signal("TERM");
    let status = web.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}:\n{}", web.log());
    eprintln!(
        "half-sent head closed after {closed:?}; stopped {:?} after SIGTERM",
        asked.elapsed()
    );
}

/// `run --metrics-addr` answered any `Host`: a page that rebinds its own
/// name to the endpoint read every class, queue and error count. It now
/// answers to loopback's names and IP addresses on its port, and to the
/// names in `WASMJOBS_WEB_HOSTS`; anything else is 421.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_refuses_foreign_host_names() {
    let redis = TestRedis::start();
    let dir = wasmjobs_e2e::runner::plugins(&["noop"], &[]);
    let addr = wasmjobs_e2e::runner::free_addr();
    let mut runner = wasmjobs_e2e::runner::Runner::start_with_env(
        &[("WASMJOBS_WEB_HOSTS", "prom.internal")],
        &redis.url(),
        dir.path(),
        &["--metrics-addr", &addr],
    );
    runner.wait_running();
    let port = port(&addr);
    for path in ["/metrics", "/stats"] {
        let foreign = request(
            &addr,
            "GET",
            path,
            &[("Host", &format!("rebind.attacker.example:{port}"))],
            "",
        );
        assert_eq!(foreign.status, 421, "{path}: {foreign:?}");
        assert!(!foreign.body.contains("wasmjobs_"), "{path}: {foreign:?}");
        assert!(
            foreign.body.contains("WASMJOBS_WEB_HOSTS"),
            "says what to do: {foreign:?}"
        );
        for admitted in [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("10.1.2.3:{port}"),
            "prom.internal".to_owned(),
        ] {
            let ok = request(&addr, "GET", path, &[("Host", &admitted)], "");
            assert_eq!(ok.status, 200, "{path} as {admitted}: {ok:?}");
        }
    }
    assert!(runner.stop().success(), "{}", runner.log());
}

//! A real browser for the dashboard's end-to-end tests: Debian's headless
//! `chromium`, driven over WebDriver by Debian's `chromedriver` through the
//! `fantoccini` client.
//!
//! Each [`Browser`] starts its own `chromedriver` on a free loopback port
//! (in a process group of its own, so the browser it launches goes with it)
//! and a Chromium session with a private profile. When the test fails, the
//! browser writes a screenshot and the HTML of every page the test acted on,
//! and of the page it was on at the failure, to
//! `target/web-screenshots/<test>-<n>.png` / `.html`, and prints the paths.
//!
//! The helpers panic with the page's URL on anything unexpected, so a test
//! reads as a list of steps.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
pub use fantoccini::elements::Element;
pub use fantoccini::{Client, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Where Debian's `chromium-driver` package puts the driver.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long `chromedriver` may take to answer `/status` after starting.
const DRIVER_START: Duration = Duration::from_secs(20);
/// How often waits poll the page.
const POLL: Duration = Duration::from_millis(50);
/// At most this many pages are kept for the failure report.
const TRAIL: usize = 40;

/// A page as the test saw it: where, a PNG and the HTML.
struct Snapshot {
    url: String,
    png: Option<Vec<u8>>,
    html: Option<String>,
}

/// A headless Chromium session of the test's own.
pub struct Browser {
    client: Client,
    name: String,
    session: String,
    port: u16,
    driver: Child,
    /// The pages the test acted on (captured before each navigation or click).
    trail: Mutex<Vec<Snapshot>>,
    /// The Chromium profile and the driver's log; removed last.
    _dir: tempfile::TempDir,
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium for the test `name`
    /// (used to name the failure screenshots). Panics, naming
    /// `scripts/setup.sh test`, if either is not installed.
    pub async fn start(name: &str) -> Browser {
        Self::start_with(name, &[]).await
    }

    /// The same, with `extra` command-line switches for Chromium (e.g.
    /// `--host-resolver-rules=MAP rebind.test 127.0.0.1`, so that the
    /// browser itself resolves a foreign name to loopback).
    pub async fn start_with(name: &str, extra: &[&str]) -> Browser {
        for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: the browser tests need Debian's {package} package; \
                 run `scripts/setup.sh test` (it installs chromium and chromium-driver)"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir for the browser");
        let log = dir.path().join("chromedriver.log");
        let (driver, port) = start_driver(&log);
        let profile = dir.path().join("profile");
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1280,900",
            "--no-first-run",
            "--no-default-browser-check",
            // No crash handler: it would leave the driver's process group.
            "--disable-breakpad",
            "--disable-crash-reporter",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": args,
            },
            // Leave alerts open, so a test can see that one opened (the
            // default dismisses them and reports an error on the next command).
            "unhandledPromptBehavior": "ignore",
            "timeouts": { "pageLoad": 30_000, "script": 30_000, "implicit": 0 },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("capabilities are an object")
        };
        // Plain HTTP: the driver is on loopback, and a TLS stack here would
        // also change the crypto provider features of the binary under test
        // (built in this package).
        let client = fantoccini::ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await;
        let mut driver = driver;
        let client = match client {
            Ok(client) => client,
            Err(e) => {
                let _ = driver.kill();
                let _ = driver.wait();
                panic!(
                    "chromedriver could not start {CHROMIUM}: {e}\nchromedriver's log:\n{}",
                    tail(&log, 40)
                );
            }
        };
        let session = client
            .session_id()
            .await
            .expect("session id")
            .expect("a WebDriver session");
        Browser {
            client,
            name: name.to_owned(),
            session,
            port,
            driver,
            trail: Mutex::new(Vec::new()),
            _dir: dir,
        }
    }

    /// The fantoccini client, for anything the helpers do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens `url` and waits for it to load. Panics if an alert opened
    /// while it loaded (the dashboard has none).
    pub async fn goto(&self, url: &str) {
        // The page being left, unless this reloads it (as polls do).
        if self
            .client
            .current_url()
            .await
            .is_ok_and(|current| current.as_str() != url)
        {
            self.remember().await;
        }
        if let Err(e) = self.client.goto(url).await {
            if let Ok(text) = self.client.get_alert_text().await {
                panic!("an alert opened while loading {url}: {text:?}");
            }
            panic!("cannot open {url}: {e}");
        }
        match self.client.get_alert_text().await {
            Err(e) if e.is_no_such_alert() => {}
            Ok(text) => panic!("an alert opened on {url}: {text:?}"),
            Err(e) => panic!("asking for an open alert on {url}: {e}"),
        }
    }

    /// The URL of the current page (for messages: never panics).
    pub async fn url(&self) -> String {
        match self.client.current_url().await {
            Ok(url) => url.to_string(),
            Err(e) => format!("(unknown URL: {e})"),
        }
    }

    /// The path of the current page (`/queues/default`).
    pub async fn path(&self) -> String {
        self.client.current_url().await.expect("current URL").path().to_owned()
    }

    /// The first element matching `css`, if any.
    pub async fn try_find(&self, css: &str) -> Option<Element> {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => Some(element),
            Err(e) if e.is_no_such_element() => None,
            Err(e) => panic!("finding {css} on {}: {e}", self.url().await),
        }
    }

    /// The first element matching `css`; panics if there is none.
    pub async fn find(&self, css: &str) -> Element {
        match self.try_find(css).await {
            Some(element) => element,
            None => panic!("no element matches {css} on {}", self.url().await),
        }
    }

    /// Every element matching `css`.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("finding {css}: {e}"))
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        element
            .text()
            .await
            .unwrap_or_else(|e| panic!("the text of {css}: {e}"))
    }

    /// The text of the first element matching `css` once `accept` holds
    /// for it (the element may appear, change or be replaced meanwhile);
    /// panics after `timeout` with the last text seen.
    pub async fn wait_text(&self, css: &str, timeout: Duration, accept: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = element.text().await
            {
                if accept(&text) {
                    return text;
                }
                last = Some(text);
            }
            assert!(
                Instant::now() < deadline,
                "{css} on {} not as expected within {timeout:?}; last text: {last:?}",
                self.url().await
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Clicks the first element matching `css` (for clicks that stay on
    /// the page; see [`Browser::click_to_navigate`]).
    pub async fn click(&self, css: &str) {
        self.remember().await;
        let element = self.find(css).await;
        element.click().await.unwrap_or_else(|e| panic!("clicking {css}: {e}"));
    }

    /// Types `text` into the first field matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.remember().await;
        let element = self.find(css).await;
        element
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("typing into {css}: {e}"));
    }

    /// Clicks the first element matching `css` (a link, or a form's
    /// button) and waits until the page it leads to has loaded, following
    /// redirects. Returns the new page's path.
    pub async fn click_to_navigate(&self, css: &str) -> String {
        self.remember().await;
        let element = self.find(css).await;
        self.mark_page().await;
        element.click().await.unwrap_or_else(|e| panic!("clicking {css}: {e}"));
        self.wait_for(
            Duration::from_secs(15),
            || format!("a new page to load after clicking {css}"),
            async |browser| !browser.page_is_marked().await,
        )
        .await;
        self.path().await
    }

    /// Marks the current document, so [`Browser::page_is_marked`] tells
    /// whether the browser has navigated since (a new document, reload or
    /// not, has no mark).
    pub async fn mark_page(&self) {
        self.execute("window.__wasmjobsTestMark = true; return null;").await;
    }

    /// Whether the document is still the one [`Browser::mark_page`] marked
    /// (and has finished loading, if it is a new one).
    pub async fn page_is_marked(&self) -> bool {
        let script = "return window.__wasmjobsTestMark === true \
                      || document.readyState !== 'complete';";
        match self.client.execute(script, vec![]).await {
            Ok(value) => value.as_bool().unwrap_or(true),
            // Mid-navigation the old document may be gone: not loaded yet.
            Err(_) => true,
        }
    }

    /// Runs `script` (a function body; `return` gives the value) on the page.
    pub async fn execute(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("running {script:?}: {e}"))
    }

    /// Runs `script` asynchronously on the page: a function body that
    /// calls `done(value)` (bound for it) when it has a result.
    pub async fn execute_async(&self, script: &str) -> Value {
        let wrapped = format!("const done = arguments[arguments.length - 1];\n{script}");
        self.client
            .execute_async(&wrapped, vec![])
            .await
            .unwrap_or_else(|e| panic!("running {script:?}: {e}"))
    }

    /// Panics if an alert, confirm or prompt is open.
    pub async fn assert_no_alert(&self) {
        match self.client.get_alert_text().await {
            Err(e) if e.is_no_such_alert() => {}
            Ok(text) => panic!("an alert is open on {}: {text:?}", self.url().await),
            Err(e) => panic!("asking for an open alert: {e}"),
        }
    }

    /// Polls `check` until it holds; panics with `what()` after `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        what: impl Fn() -> String,
        mut check: impl AsyncFnMut(&Browser) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !check(self).await {
            assert!(
                Instant::now() < deadline,
                "not within {timeout:?}: {} (on {})",
                what(),
                self.url().await
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Keeps the current page (screenshot and HTML) for the failure report.
    async fn remember(&self) {
        let Ok(url) = self.client.current_url().await else {
            return;
        };
        if matches!(url.scheme(), "about" | "chrome") {
            return;
        }
        let png = self.client.screenshot().await.ok();
        let html = self.client.source().await.ok();
        let mut trail = self.trail.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if trail.len() == TRAIL {
            trail.remove(0);
        }
        trail.push(Snapshot {
            url: url.to_string(),
            png,
            html,
        });
    }

    /// Writes the pages the test acted on and the current one to
    /// `target/web-screenshots/`, printing the paths. Called on failure.
    fn write_failure_report(&mut self) {
        let dir = screenshot_dir();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("cannot create {}: {e}", dir.display());
            return;
        }
        // Files of an earlier failure of the same test would mislead.
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let prefix = format!("{}-", self.name);
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if let Some(rest) = file.strip_prefix(&prefix)
                    && rest.split('.').next().is_some_and(|n| n.parse::<u32>().is_ok())
                {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let mut pages = std::mem::take(self.trail.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner));
        pages.push(self.snapshot_now());
        eprintln!("{}: the pages of the failed test:", self.name);
        let last = pages.len();
        for (n, page) in pages.into_iter().enumerate() {
            let n = n + 1;
            let stem = dir.join(format!("{}-{n}", self.name));
            let what = if n == last {
                "at the failure"
            } else {
                "before an action"
            };
            let png = stem.with_extension("png");
            let html = stem.with_extension("html");
            let mut written = Vec::new();
            if let Some(bytes) = page.png
                && std::fs::write(&png, bytes).is_ok()
            {
                written.push(png.display().to_string());
            }
            if let Some(text) = page.html
                && std::fs::write(&html, text).is_ok()
            {
                written.push(html.display().to_string());
            }
            eprintln!("  {n}. {} ({what}): {}", page.url, written.join(", "));
        }
    }

    /// The current page, read synchronously from the driver (the test's
    /// async runtime may be unwinding). A dialog left open is dismissed
    /// after its text is noted, so the page can be captured.
    fn snapshot_now(&self) -> Snapshot {
        let base = format!("/session/{}", self.session);
        let alert = self
            .driver_request("GET", &format!("{base}/alert/text"))
            .and_then(|v| v.as_str().map(str::to_owned));
        if alert.is_some() {
            self.driver_request("POST", &format!("{base}/alert/dismiss"));
        }
        let mut url = self
            .driver_request("GET", &format!("{base}/url"))
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "(unknown URL)".to_owned());
        if let Some(text) = alert {
            url.push_str(&format!(" (an alert was open: {text:?})"));
        }
        let png = self
            .driver_request("GET", &format!("{base}/screenshot"))
            .and_then(|v| v.as_str().map(str::to_owned))
            .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok());
        let html = self
            .driver_request("GET", &format!("{base}/source"))
            .and_then(|v| v.as_str().map(str::to_owned));
        Snapshot { url, png, html }
    }

    /// One blocking WebDriver request to the driver; its `value`, or None
    /// on any error.
    fn driver_request(&self, method: &str, path: &str) -> Option<Value> {
        let body = if method == "POST" { "{}" } else { "" };
        let (status, body) = driver_exchange(self.port, method, path, body)?;
        if status != 200 {
            return None;
        }
        let mut value: Value = serde_json::from_str(&body).ok()?;
        Some(value.get_mut("value")?.take())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.write_failure_report();
        }
        // Ends the session (Chromium quits), then the driver's whole
        // process group, in case the browser did not.
        self.driver_request("DELETE", &format!("/session/{}", self.session));
        if let Ok(pid) = libc::pid_t::try_from(self.driver.id()) {
            // SAFETY: signalling the process group of the driver this
            // struct started (its own group, see `start_driver`).
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Starts `chromedriver` on a free loopback port, in a process group of its
/// own, and waits until it answers; returns it and the port.
fn start_driver(log: &Path) -> (Child, u16) {
    let mut last_error = String::new();
    // Another process may take the free port first: a few tries.
    for _ in 0..3 {
        let port = free_port();
        let mut driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {CHROMEDRIVER}: {e}; run `scripts/setup.sh test` to install chromium-driver")
            });
        let deadline = Instant::now() + DRIVER_START;
        loop {
            if status_ready(port) {
                return (driver, port);
            }
            if let Ok(Some(status)) = driver.try_wait() {
                last_error = format!("chromedriver exited ({status}):\n{}", tail(log, 20));
                break;
            }
            if Instant::now() >= deadline {
                let _ = driver.kill();
                let _ = driver.wait();
                panic!(
                    "chromedriver did not answer on port {port} within {DRIVER_START:?}:\n{}",
                    tail(log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("cannot start chromedriver: {last_error}");
}

/// Whether a driver on `port` answers `/status` as ready.
fn status_ready(port: u16) -> bool {
    driver_exchange(port, "GET", "/status", "")
        .is_some_and(|(status, body)| status == 200 && body.contains("\"ready\":true"))
}

/// One blocking HTTP request to the driver on `port`: the status and body,
/// or None on any error. The body is read by its length (chromedriver keeps
/// the connection open whatever the request asks).
fn driver_exchange(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut received = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut buffer).ok()?;
        if n == 0 {
            return None;
        }
        received.extend_from_slice(&buffer[..n]);
    };
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })?;
    while received.len() < head_end + length {
        let n = stream.read(&mut buffer).ok()?;
        if n == 0 {
            return None;
        }
        received.extend_from_slice(&buffer[..n]);
    }
    let body = String::from_utf8_lossy(&received[head_end..head_end + length]).into_owned();
    Some((status, body))
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// `target/web-screenshots`, in `CARGO_TARGET_DIR` if set, else in the
/// target directory the test executable was built in.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            // target/<profile>/deps/<test executable>
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| crate::repo_root().join("target"));
    target.join("web-screenshots")
}

/// The last `lines` lines of a log file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

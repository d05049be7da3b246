//! What a failed job's message adds when the guest tried the network on
//! its own.
//!
//! A job has no sockets and no resolver: every request goes through the
//! host's HTTP (`wasi:http`, checked against `[http] allow`). A library
//! that opens its own socket fails in ways that name nothing of that —
//! Python's `urllib.request` and `requests` with `LookupError: unknown
//! encoding: idna` or `[Errno -4]`/`Temporary failure in name resolution`
//! (the guest's `getaddrinfo`), others with `Connection refused` on a
//! socket call the sandbox does not provide. [`note`] recognises those
//! and names the client that works: a pure function of the message, as
//! [`super::file_hint`] is for files.

/// How the guests' libraries report a network call the sandbox has not.
const MARKERS: &[&str] = &[
    "unknown encoding: idna",
    "[Errno -2]",
    "[Errno -3]",
    "[Errno -4]",
    "Temporary failure in name resolution",
    "Name or service not known",
    "NameResolutionError",
    "getaddrinfo",
];

/// The note for a failure `message` that looks like a network call made
/// without the host, if it does.
pub(crate) fn note(message: &str) -> Option<String> {
    if !MARKERS.iter().any(|m| message.contains(m)) {
        return None;
    }
    Some(
        "network: a job has no sockets of its own, so libraries that open them (Python's urllib.request and requests, raw sockets) fail; \
         send HTTP through the host: wasmjobs_guest.http in Python (http.get(url)), fetch in JavaScript, wasmjobs_guest::http in Rust, \
         for hosts its wasmjobs.toml lists in [http] allow"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_network_failures_name_the_hosts_http() {
        for message in [
            "LookupError: unknown encoding: idna",
            "URLError: <urlopen error [Errno -4] Temporary failure in name resolution>",
            "ConnectionError: HTTPConnectionPool(host='example.com', port=80): Max retries exceeded (Caused by NameResolutionError(\"getaddrinfo failed\"))",
        ] {
            let note = note(message).expect("a note");
            assert!(note.contains("wasmjobs_guest.http"), "{note}");
        }
        assert_eq!(note("ValueError: kaboom"), None);
        assert_eq!(note("HTTP 503 from upstream"), None);
    }
}

//! Which names the dashboard and the metrics endpoint answer to: the
//! defence against DNS rebinding.
//!
//! A dashboard on loopback without credentials trusts whoever can reach
//! it, and a browser on the same machine can be made to reach it: a page
//! on `attacker.example` re-points its own name to 127.0.0.1, and its
//! scripts are then *same-origin* with the dashboard, read its pages and
//! post its forms (CSRF tokens included). What gives the attack away is the
//! name: the browser still sends `Host: attacker.example:9494`. So without
//! credentials the dashboard answers only to the names loopback has —
//! `localhost`, `127.x.x.x`, `[::1]` — on the port it listens on, plus the
//! names the operator lists in `WASMJOBS_WEB_HOSTS` (e.g. a reverse
//! proxy's), and refuses anything else with 421 before any handler runs.
//! A request without `Host` (HTTP/1.0 tools) is not a browser and is let
//! through. With credentials every name is accepted: a rebound page has no
//! way to present them.
//!
//! The metrics endpoint (`--metrics-addr`) has no credentials: it answers
//! to the same names, and to any IP address on its port as well (a
//! scraper that addresses it by IP cannot be a rebound page, whose name
//! is a DNS name).

use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, bail};

/// The names (and port) requests may address.
#[derive(Debug, Clone)]
pub(crate) struct AllowedHosts {
    /// Any name (credentials are required instead).
    any: bool,
    /// The port the dashboard listens on.
    port: u16,
    /// Names the operator added, lowercase, each with its port if given.
    extra: Vec<(String, Option<u16>)>,
    /// Any IP address on the port too (the metrics endpoint).
    ip_literals: bool,
}

/// A `Host` value or an origin's authority, taken apart.
#[derive(Debug, PartialEq)]
struct Authority {
    /// Lowercase; an IPv6 address without its brackets.
    host: String,
    /// As given, or 80 when absent.
    port: u16,
    /// Whether the port was written out.
    explicit_port: bool,
}

impl Authority {
    /// Parses `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for
    /// anything else (user info, paths, empty names, bad ports).
    fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        if value.is_empty() || value.contains(['@', '/', '\\', '?', '#', ' ']) {
            return None;
        }
        let (host, port) = if let Some(rest) = value.strip_prefix('[') {
            let (v6, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':')?),
            };
            (v6.to_owned(), port)
        } else {
            match value.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (value.to_owned(), None),
            }
        };
        if host.is_empty() {
            return None;
        }
        let explicit_port = port.is_some();
        let port = match port {
            Some(port) => port.parse().ok().filter(|p| *p != 0)?,
            None => 80,
        };
        Some(Self {
            host: host.trim_end_matches('.').to_ascii_lowercase(),
            port,
            explicit_port,
        })
    }

    /// Whether the name is one of loopback's: `localhost`, 127.0.0.0/8,
    /// `::1` (or an IPv4-mapped loopback).
    fn is_loopback(&self) -> bool {
        if self.host == "localhost" {
            return true;
        }
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => v4.is_loopback(),
            Ok(IpAddr::V6(v6)) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
            Err(_) => false,
        }
    }
}

impl AllowedHosts {
    /// The names a dashboard listening on `bound` answers to: any with
    /// `credentials`, else loopback's and `extra` (`name` or `name:port`).
    pub(crate) fn new(bound: SocketAddr, credentials: bool, extra: &[String]) -> Self {
        let extra = extra
            .iter()
            .filter_map(|name| Authority::parse(name))
            .map(|a| (a.host, a.explicit_port.then_some(a.port)))
            .collect();
        Self {
            any: credentials,
            port: bound.port(),
            extra,
            ip_literals: false,
        }
    }

    /// The same, admitting any IP address on the port as well.
    pub(crate) fn and_ip_addresses(mut self) -> Self {
        self.ip_literals = true;
        self
    }

    /// Whether a request naming `authority` (its `Host`, or the host and
    /// port of its `Origin`) is for this dashboard.
    pub(crate) fn admits(&self, authority: &str) -> bool {
        if self.any {
            return true;
        }
        let Some(asked) = Authority::parse(authority) else {
            return false;
        };
        if asked.is_loopback() && asked.port == self.port {
            return true;
        }
        if self.ip_literals && asked.port == self.port && asked.host.parse::<IpAddr>().is_ok() {
            return true;
        }
        self.extra
            .iter()
            .any(|(host, port)| *host == asked.host && port.is_none_or(|p| p == asked.port))
    }

    /// What a refused request is told.
    pub(crate) fn refusal(&self) -> String {
        format!(
            "misdirected request: without credentials this dashboard answers only to localhost:{port}, \
             127.0.0.1:{port} and [::1]:{port} (a page under another name may be a DNS rebinding attack); \
             list other names in WASMJOBS_WEB_HOSTS or set credentials",
            port = self.port
        )
    }
}

/// Parses `WASMJOBS_WEB_HOSTS` (names separated by commas or spaces).
pub(crate) fn parse_list(value: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for name in value.split([',', ' ']).map(str::trim).filter(|n| !n.is_empty()) {
        if Authority::parse(name).is_none() {
            bail!("WASMJOBS_WEB_HOSTS: {name:?} is not a host name or host:port");
        }
        names.push(name.to_owned());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> AllowedHosts {
        AllowedHosts::new("127.0.0.1:9494".parse().unwrap(), false, &[])
    }

    #[test]
    fn loopback_names_on_our_port_are_admitted() {
        let hosts = loopback();
        for ok in [
            "127.0.0.1:9494",
            "localhost:9494",
            "LOCALHOST:9494",
            "localhost.:9494",
            "[::1]:9494",
            "127.0.0.2:9494",
            "[::ffff:127.0.0.1]:9494",
        ] {
            assert!(hosts.admits(ok), "{ok}");
        }
    }

    #[test]
    fn the_metrics_endpoint_also_answers_to_ip_addresses_on_its_port() {
        let hosts = loopback().and_ip_addresses();
        for ok in ["10.0.0.5:9494", "[fd00::5]:9494", "127.0.0.1:9494", "localhost:9494"] {
            assert!(hosts.admits(ok), "{ok}");
        }
        for refused in [
            "rebind.attacker.example:9494",
            "10.0.0.5.attacker.example:9494",
            "10.0.0.5:9495",
            "0x7f.1:9494",
        ] {
            assert!(!hosts.admits(refused), "{refused}");
        }
        assert!(!loopback().admits("10.0.0.5:9494"), "the dashboard does not");
    }

    #[test]
    fn other_names_ports_and_junk_are_refused() {
        let hosts = loopback();
        for refused in [
            "rebind.attacker.example:9494",
            "127.0.0.1.attacker.example:9494",
            "localhost.attacker.example:9494",
            "127.0.0.1:9495",
            "127.0.0.1",
            "localhost",
            "10.0.0.1:9494",
            "user@127.0.0.1:9494",
            "127.0.0.1:9494/x",
            "",
            ":9494",
            "[::1",
            "[::1]x",
            "127.0.0.1:0",
            "127.0.0.1:99999",
        ] {
            assert!(!hosts.admits(refused), "{refused:?}");
        }
    }

    #[test]
    fn port_80_may_be_left_out() {
        let hosts = AllowedHosts::new("127.0.0.1:80".parse().unwrap(), false, &[]);
        assert!(hosts.admits("localhost"));
        assert!(hosts.admits("127.0.0.1:80"));
    }

    #[test]
    fn listed_names_are_admitted_with_their_port_if_given() {
        let extra = parse_list("dash.example.com, proxy.local:8443").unwrap();
        let hosts = AllowedHosts::new("127.0.0.1:9494".parse().unwrap(), false, &extra);
        assert!(hosts.admits("dash.example.com"));
        assert!(hosts.admits("Dash.Example.com:443"));
        assert!(hosts.admits("proxy.local:8443"));
        assert!(!hosts.admits("proxy.local:9494"));
        assert!(!hosts.admits("example.com"));
        assert!(parse_list("a b/c").is_err());
    }

    #[test]
    fn credentials_admit_every_name() {
        let hosts = AllowedHosts::new("0.0.0.0:9494".parse().unwrap(), true, &[]);
        assert!(hosts.admits("rebind.attacker.example:9494"));
    }
}

//! `http.allow`: which hosts a plugin may call.
//!
//! Patterns are `host`, `host:port`, `host:*`, and `*.domain` (any
//! subdomain of `domain`, at any depth, not `domain` itself), optionally
//! prefixed with `http://` or `https://` to restrict the scheme. Hosts
//! compare case-insensitively. Without a port a pattern allows only the
//! scheme's default port (80 or 443), as in Spin: reaching `host:8080`
//! must be granted as such. IP addresses are hosts like any other, and a
//! bare `*` is refused — granting everything must be spelled out per host.
//!
//! A grant also says whether the request may reach non-public addresses
//! (loopback, private, link-local, metadata: [`super::address`]): only a
//! rule that names the host exactly as an IP literal (`127.0.0.1:*`,
//! `[::1]:8080`) or as `localhost` may. A rule naming any other host, or a
//! `*.domain` wildcard, reaches public addresses only, whatever its DNS
//! says. Other spellings of an address (`127.1`, `2130706433`) are names.
//!
//! A rule may also say `h2`: a plain `http://` request it grants speaks
//! HTTP/2 with prior knowledge (`https://` negotiates by ALPN whatever the
//! rule says). The manifest writes it `{ host = "api.internal:8080", h2 = true }`.

use std::fmt;

use anyhow::{Result, bail};

/// One parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    scheme: Option<String>,
    host: HostPattern,
    port: PortPattern,
    h2: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// `*.example.org` stores `.example.org`.
    Suffix(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    Default,
    Any,
    Is(u16),
}

/// The rule that allowed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant<'a> {
    /// The pattern as the manifest wrote it.
    pub rule: &'a str,
    /// Whether the request may reach loopback, private, link-local and
    /// other non-public addresses: only when the rule names the host
    /// exactly and it is an IP literal or `localhost`.
    pub private: bool,
    /// Whether plain `http://` speaks HTTP/2 with prior knowledge.
    pub h2: bool,
}

impl Rule {
    /// Whether this rule names an IP literal or `localhost`, and so may
    /// reach non-public addresses.
    fn names_local(&self) -> bool {
        match &self.host {
            HostPattern::Exact(host) => host == "localhost" || host.parse::<std::net::IpAddr>().is_ok(),
            HostPattern::Suffix(_) => false,
        }
    }
}

/// A plugin's outgoing-HTTP grants. Empty (the default) denies everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<Rule>,
    patterns: Vec<String>,
}

impl AllowList {
    /// Parses manifest patterns; the error names the offending pattern.
    pub fn parse(patterns: &[String]) -> Result<Self> {
        let rules: Vec<(String, bool)> = patterns.iter().map(|p| (p.clone(), false)).collect();
        Self::parse_rules(&rules)
    }

    /// Parses manifest rules: each a pattern and whether plain `http://`
    /// requests it grants speak HTTP/2 with prior knowledge.
    pub fn parse_rules(rules: &[(String, bool)]) -> Result<Self> {
        let parsed = rules
            .iter()
            .map(|(pattern, h2)| parse_rule(pattern).map(|rule| Rule { h2: *h2, ..rule }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            rules: parsed,
            patterns: rules.iter().map(|(pattern, _)| pattern.clone()).collect(),
        })
    }

    /// Whether a request to `scheme://host:port` is allowed.
    pub fn allows(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.grant(scheme, host, port).is_some()
    }

    /// The grant for a request to `scheme://host:port`, or `None` if no
    /// rule allows it. When several rules match, one that may reach private
    /// addresses wins (it names the host exactly).
    pub fn grant(&self, scheme: &str, host: &str, port: u16) -> Option<Grant<'_>> {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let default_port = match scheme {
            "https" => 443,
            _ => 80,
        };
        let mut matching = self.rules.iter().zip(&self.patterns).filter(|(rule, _)| {
            rule.scheme.as_deref().is_none_or(|s| s == scheme)
                && match &rule.host {
                    HostPattern::Exact(h) => *h == host,
                    HostPattern::Suffix(suffix) => host.ends_with(suffix.as_str()) && host.len() > suffix.len(),
                }
                && match rule.port {
                    PortPattern::Default => port == default_port,
                    PortPattern::Any => true,
                    PortPattern::Is(p) => p == port,
                }
        });
        let first = matching.next()?;
        let (rule, pattern) = std::iter::once(first)
            .chain(matching)
            .find(|(rule, _)| rule.names_local())
            .unwrap_or(first);
        Some(Grant {
            rule: pattern.trim(),
            private: rule.names_local(),
            h2: rule.h2,
        })
    }

    /// Each rule as written in the manifest, with whether plain `http://`
    /// requests it grants speak HTTP/2.
    pub fn rules(&self) -> impl Iterator<Item = (&str, bool)> {
        self.patterns
            .iter()
            .zip(&self.rules)
            .map(|(pattern, rule)| (pattern.trim(), rule.h2))
    }

    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.patterns.is_empty() {
            f.write_str("nothing")
        } else {
            for (i, (pattern, h2)) in self.rules().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                let h2 = if h2 { " (h2)" } else { "" };
                write!(f, "{sep}{pattern}{h2}")?;
            }
            Ok(())
        }
    }
}

fn parse_rule(pattern: &str) -> Result<Rule> {
    let text = pattern.trim();
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (Some(scheme.to_owned()), rest),
        Some((other, _)) => bail!("http.allow {pattern:?}: scheme {other:?} is not http or https"),
        None => (None, text),
    };
    if rest.contains('/') || rest.contains('@') || rest.contains('?') {
        bail!("http.allow {pattern:?}: give a host[:port], not a URL with a path or credentials");
    }
    let (host, port) = split_port(rest).ok_or_else(|| anyhow::anyhow!("http.allow {pattern:?}: bad port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    let host = if let Some(domain) = host.strip_prefix("*.") {
        if domain.is_empty() || domain.contains('*') {
            bail!("http.allow {pattern:?}: a wildcard must be '*.domain'");
        }
        HostPattern::Suffix(format!(".{domain}"))
    } else {
        if host.is_empty() || host.contains('*') {
            bail!("http.allow {pattern:?}: only '*.domain' wildcards are allowed; list hosts explicitly");
        }
        HostPattern::Exact(host)
    };
    Ok(Rule {
        scheme,
        host,
        port,
        h2: false,
    })
}

/// Splits `host[:port]` (IPv6 in brackets); `None` for an invalid port.
fn split_port(text: &str) -> Option<(&str, PortPattern)> {
    let colon = if text.starts_with('[') {
        text.find("]:").map(|i| i + 1)
    } else {
        text.rfind(':')
    };
    match colon {
        None => Some((text, PortPattern::Default)),
        Some(i) => {
            let port = &text[i + 1..];
            let port = if port == "*" {
                PortPattern::Any
            } else {
                PortPattern::Is(port.parse().ok().filter(|&p| p > 0)?)
            };
            Some((&text[..i], port))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(patterns: &[&str]) -> AllowList {
        AllowList::parse(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn hosts_ports_and_wildcards() {
        let allow = list(&[
            "127.0.0.1:9292",
            "api.example.com",
            "*.example.org",
            "https://secure.test",
            "any.test:*",
        ]);
        assert!(allow.allows("http", "127.0.0.1", 9292));
        assert!(!allow.allows("http", "127.0.0.1", 9293));
        assert!(allow.allows("https", "API.example.com", 443));
        assert!(allow.allows("http", "api.example.com", 80));
        assert!(
            !allow.allows("http", "api.example.com", 8080),
            "no port means the default port"
        );
        assert!(allow.allows("https", "a.example.org", 443));
        assert!(allow.allows("https", "b.a.example.org", 443));
        assert!(
            !allow.allows("https", "example.org", 443),
            "*.domain is subdomains only"
        );
        assert!(!allow.allows("https", "evilexample.org", 443));
        assert!(allow.allows("https", "secure.test", 443));
        assert!(!allow.allows("http", "secure.test", 80), "scheme-restricted");
        assert!(allow.allows("http", "any.test", 12345));
        assert!(!allow.allows("http", "other.test", 80));
        assert!(
            !AllowList::default().allows("http", "127.0.0.1", 80),
            "nothing by default"
        );
    }

    #[test]
    fn only_rules_naming_ip_literals_or_localhost_reach_private_addresses() {
        let allow = list(&[
            "127.0.0.1:*",
            "localhost:*",
            "[::1]:*",
            "*.example.org:*",
            "127.1:*",
            "*.0.0.1:*",
        ]);
        let private = |host: &str| allow.grant("http", host, 8080).map(|g| (g.private, g.rule));
        assert_eq!(private("127.0.0.1"), Some((true, "127.0.0.1:*")));
        assert_eq!(private("LOCALHOST"), Some((true, "localhost:*")));
        assert_eq!(private("[::1]"), Some((true, "[::1]:*")));
        assert_eq!(private("metadata.example.org"), Some((false, "*.example.org:*")));
        assert_eq!(private("127.1"), Some((false, "127.1:*")), "not an IP literal");
        assert_eq!(
            private("10.0.0.1"),
            Some((false, "*.0.0.1:*")),
            "a wildcard names no address"
        );
        assert_eq!(private("localhost.example.org"), Some((false, "*.example.org:*")));
        assert_eq!(private("example.com"), None);
    }

    #[test]
    fn h2_is_the_matching_rules_own() {
        let allow = AllowList::parse_rules(&[
            ("127.0.0.1:8080".to_owned(), true),
            ("127.0.0.1:9090".to_owned(), false),
        ])
        .unwrap();
        assert_eq!(allow.grant("http", "127.0.0.1", 8080).map(|g| g.h2), Some(true));
        assert_eq!(allow.grant("http", "127.0.0.1", 9090).map(|g| g.h2), Some(false));
        assert_eq!(allow.to_string(), "127.0.0.1:8080 (h2), 127.0.0.1:9090");
        assert!(!list(&["x.test"]).grant("http", "x.test", 80).unwrap().h2);
    }

    #[test]
    fn ipv6_hosts() {
        let allow = list(&["[::1]:8080"]);
        assert!(allow.allows("http", "[::1]", 8080));
        assert!(!allow.allows("http", "::1", 80));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["*", "a.*.com", "ftp://x", "x/path", "x:0", "x:notaport", "user@x", "*."] {
            assert!(AllowList::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
    }
}

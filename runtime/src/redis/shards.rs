//! Several Redis servers, each a complete Sidekiq keyspace ("shards"), and
//! which one holds each queue.
//!
//! The default shard is `--redis` (`REDIS_URL`, else the embedded server),
//! named `default`; `--shard NAME=URL` adds one (repeatable, or
//! `WASMJOBS_SHARDS`, space-separated) and `--route QUEUE[,QUEUE…]=NAME`
//! puts queues on it (`WASMJOBS_ROUTES`). A queue routed nowhere lives on
//! the default shard. The routing itself is the client crate's
//! ([`wasmjobs_client::shards::Routes`]), so producers linking that crate
//! and every command route the same way. `docs/shards.md` says what lives
//! where.

use std::fmt;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use wasmjobs_client::shards::Routes;

use super::{Redis, Target, connect, redact};

/// The default shard's name.
pub const DEFAULT: &str = "default";

/// `--shard NAME=URL`: a Redis server beside the default one.
#[derive(Clone)]
pub struct ShardSpec {
    /// Its name in routes, logs and stats.
    pub name: String,
    /// Its URL.
    pub url: String,
}

impl fmt::Debug for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, redact(&self.url))
    }
}

impl FromStr for ShardSpec {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        const EXPECTED: &str = "expected NAME=URL (e.g. mail=redis://10.0.0.2:6379)";
        let Some((name, url)) = text.split_once('=') else {
            bail!(EXPECTED);
        };
        let (name, url) = (name.trim(), url.trim());
        // What is left of the first '=' may be a URL whose password holds
        // one: a name that is not one is refused without being shown.
        let name_ok = !name.is_empty()
            && name.len() <= wasmjobs_client::shards::MAX_NAME_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && !name.bytes().all(|b| b == b'.');
        if !name_ok {
            bail!(
                "{EXPECTED}; a shard's name is 1 to {} letters, digits, '_', '.' or '-', not only dots",
                wasmjobs_client::shards::MAX_NAME_LEN
            );
        }
        if name == DEFAULT {
            bail!("the shard name {DEFAULT:?} is --redis's (REDIS_URL)");
        }
        if redis::parse_redis_url(url).is_none() {
            bail!("shard {name}: {} is not a Redis URL", redact(url));
        }
        Ok(Self {
            name: name.to_owned(),
            url: url.to_owned(),
        })
    }
}

/// `--route QUEUE[,QUEUE…]=SHARD`.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// The queues.
    pub queues: Vec<String>,
    /// The shard holding them.
    pub shard: String,
}

impl FromStr for RouteSpec {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Self> {
        let Some((queues, shard)) = text.rsplit_once('=') else {
            bail!("expected QUEUE[,QUEUE...]=SHARD (e.g. mail,reports=mail)");
        };
        let queues: Vec<String> = queues.split(',').map(|q| q.trim().to_owned()).collect();
        for queue in &queues {
            // No '=' either: `a=b=c` is a typo, not queue `a=b`.
            if queue.contains('=') {
                bail!("a route's queue cannot hold '=': {text:?} (QUEUE[,QUEUE...]=SHARD)");
            }
            super::control::valid_queue(queue).with_context(|| format!("in route {text:?}"))?;
        }
        Ok(Self {
            queues,
            shard: shard.trim().to_owned(),
        })
    }
}

/// The shards a command uses: where each is and which queues it holds.
#[derive(Debug, Clone)]
pub struct ShardMap {
    /// Where each shard is, in the order of `routes.names()`.
    pub targets: Vec<Target>,
    /// Which shard holds each queue.
    pub routes: Routes,
}

impl ShardMap {
    /// The default shard at `default` plus `shards`, routed by `routes`.
    /// Two shards at one URL are refused: one keyspace would be counted
    /// (and served) twice.
    pub fn new(default: Target, shards: &[ShardSpec], routes: &[RouteSpec]) -> Result<Self> {
        if matches!(default, Target::Embedded(_)) && (!shards.is_empty() || !routes.is_empty()) {
            bail!(
                "--shard and --route need --redis (or REDIS_URL) for the default shard: \
                 a fleet's queues do not belong in this directory's embedded Redis"
            );
        }
        let mut names = vec![DEFAULT.to_owned()];
        let mut targets = vec![default];
        let mut places = Vec::new();
        for shard in shards {
            names.push(shard.name.clone());
            targets.push(Target::Url(shard.url.clone()));
        }
        for (name, target) in names.iter().zip(&targets) {
            let Target::Url(url) = target else { continue };
            let place = place(url);
            if let Some((other, _)) = places.iter().find(|(_, p)| *p == place) {
                bail!(
                    "shards {other} and {name} are one Redis database ({}): its keyspace would be counted twice",
                    redact(url)
                );
            }
            places.push((name.clone(), place));
        }
        let pairs = routes
            .iter()
            .flat_map(|route| route.queues.iter().map(|queue| (queue.clone(), route.shard.clone())));
        let routes = Routes::new(names, pairs).context("invalid --route (or WASMJOBS_ROUTES)")?;
        Ok(Self { targets, routes })
    }

    /// Whether there is more than the default shard.
    pub fn is_sharded(&self) -> bool {
        self.targets.len() > 1
    }

    /// The shard holding `queue`: its index, name and target.
    pub fn for_queue(&self, queue: &str) -> (usize, &str, &Target) {
        let index = self.routes.shard_of(queue);
        (index, &self.routes.names()[index], &self.targets[index])
    }

    /// Each shard: index, name, target.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &str, &Target)> {
        self.routes
            .names()
            .iter()
            .zip(&self.targets)
            .enumerate()
            .map(|(index, (name, target))| (index, name.as_str(), target))
    }

    /// `WASMJOBS_SHARDS` and `WASMJOBS_ROUTES` as another process must
    /// set them to route the same way (passwords included: for a shell's
    /// environment), or `None` with a single shard.
    pub fn env(&self) -> Option<(String, String)> {
        if !self.is_sharded() {
            return None;
        }
        let shards = self
            .iter()
            .skip(1)
            .filter_map(|(_, name, target)| match target {
                Target::Url(url) => Some(format!("{name}={url}")),
                Target::Embedded(_) => None,
            })
            .collect::<Vec<_>>()
            .join(" ");
        let routes = (0..self.routes.len())
            .filter_map(|index| {
                let queues = self.routes.routed_to(index);
                (!queues.is_empty()).then(|| format!("{}={}", queues.join(","), self.routes.names()[index]))
            })
            .collect::<Vec<_>>()
            .join(" ");
        Some((shards, routes))
    }
}

/// Where a URL's keyspace is, as far as the URL says: host (lower case)
/// and port (6379 by default) or socket path, and database (0 by default);
/// user and password left out. Two names of one host (`localhost`,
/// `127.0.0.1`) are not resolved.
fn place(url: &str) -> String {
    let Some(parsed) = redis::parse_redis_url(url) else {
        return url.to_owned();
    };
    let query_db = parsed
        .query_pairs()
        .find(|(k, _)| k == "db")
        .map(|(_, v)| v.into_owned());
    match parsed.scheme() {
        "unix" | "redis+unix" => format!("unix:{}/{}", parsed.path(), query_db.as_deref().unwrap_or("0")),
        _ => {
            let db = parsed.path().trim_matches('/');
            format!(
                "{}:{}/{}",
                parsed.host_str().unwrap_or_default().to_ascii_lowercase(),
                parsed.port().unwrap_or(6379),
                if db.is_empty() { "0" } else { db }
            )
        }
    }
}

/// A shard a command opened (or could not).
pub(crate) struct Opened {
    /// Its name.
    pub name: String,
    /// Its location, for messages (no password).
    pub location: String,
    /// The connection, or why there is none.
    pub redis: Result<Redis>,
}

/// Opens every shard of `map`; a shard that cannot be reached is kept as
/// its error (naming the shard when there are several), for the caller to
/// report. The connections are opened in parallel, so a shard that is down
/// costs the time of its own connection attempts once, not once per shard.
pub(crate) async fn open_all(map: &ShardMap) -> Vec<Opened> {
    let sharded = map.is_sharded();
    let opening = map.iter().map(|(_, name, target)| async move {
        let location = match target {
            Target::Url(url) => redact(url),
            Target::Embedded(dir) => format!("embedded redis-server ({})", dir.display()),
        };
        let redis = match sharded {
            true => connect(target).await.with_context(|| format!("shard {name}")),
            false => connect(target).await,
        };
        let location = redis.as_ref().map(|r| r.location.clone()).unwrap_or(location);
        Opened {
            name: name.to_owned(),
            location,
            redis,
        }
    });
    futures_util::future::join_all(opening).await
}

/// Opens again the shards of `opened` that could not be opened, in
/// parallel; `opened` is in `map`'s order.
pub(crate) async fn reopen(map: &ShardMap, opened: &mut [Opened]) {
    let again = opened
        .iter_mut()
        .zip(map.iter())
        .filter(|(shard, _)| shard.redis.is_err())
        .map(|(shard, (_, name, target))| async move {
            shard.redis = connect(target).await.with_context(|| format!("shard {name}"));
            if let Ok(redis) = &shard.redis {
                shard.location = redis.location.clone();
            }
        });
    futures_util::future::join_all(again).await;
}

/// Connects to every shard of `map` for a long-running process (the
/// runner, the dashboard): the default shard at once (it must answer),
/// the others on first use, so one that is down at start is picked up
/// when it answers. Each with its name, in `map`'s order.
pub(crate) async fn connect_long_lived(map: &ShardMap) -> Result<Vec<(String, Redis)>> {
    let mut shards = Vec::new();
    for (index, name, target) in map.iter() {
        let redis = match index {
            0 => connect(target).await?,
            _ => super::connect_lazy(target)
                .await
                .with_context(|| format!("shard {name}"))?,
        };
        shards.push((name.to_owned(), redis));
    }
    Ok(shards)
}

/// Closes what [`open_all`] opened.
pub(crate) async fn close_all(opened: Vec<Opened>) -> Result<()> {
    for shard in opened {
        if let Ok(redis) = shard.redis {
            redis.close().await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_database_under_two_urls_is_one_place() {
        let a = place("redis://cache.example:6379");
        assert_eq!(a, place("redis://CACHE.example/"));
        assert_eq!(a, place("redis://user:secret@cache.example:6379/0"));
        assert_ne!(a, place("redis://cache.example/1"));
        assert_ne!(a, place("redis://cache.example:6380"));
        assert_eq!(place("unix:///run/redis.sock"), place("unix:///run/redis.sock?db=0"));
        assert_ne!(place("unix:///run/redis.sock"), place("unix:///run/redis.sock?db=2"));
    }

    #[test]
    fn a_url_without_its_name_is_refused_without_showing_it() {
        let err = "redis://:c2VjcmV0cGFzcw==@cache:6379"
            .parse::<ShardSpec>()
            .expect_err("no name")
            .to_string();
        assert!(!err.contains("c2Vj"), "{err}");
        assert!(err.contains("expected NAME=URL"), "{err}");
        let err = "b=redis://:hunter2@"
            .parse::<ShardSpec>()
            .map(|_| ())
            .expect_err("no host");
        assert!(!format!("{err:#}").contains("hunter2"), "{err:#}");
        let spec: ShardSpec = "b = redis://:pw=x@cache:6379".parse().expect("a password with '='");
        assert_eq!(
            (spec.name.as_str(), spec.url.as_str()),
            ("b", "redis://:pw=x@cache:6379")
        );
        assert!(!format!("{spec:?}").contains("pw=x"), "{spec:?}");
        // A name of dots would be a path the dashboard cannot serve.
        for dots in ["..", "."] {
            let err = format!("{dots}=redis://cache:6379")
                .parse::<ShardSpec>()
                .expect_err(dots);
            assert!(err.to_string().contains("not only dots"), "{err}");
        }
        assert!("a.b=redis://cache:6379".parse::<ShardSpec>().is_ok());
    }

    #[test]
    fn routes_with_odd_queues_are_refused() {
        let route: RouteSpec = "mail, reports = b".parse().expect("spaces around");
        assert_eq!(route.queues, ["mail", "reports"]);
        assert_eq!(route.shard, "b");
        for bad in ["mail=b\nvideo=c", "a=b=c", "=b", "mail,,x=b", "mail"] {
            assert!(bad.parse::<RouteSpec>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shards_need_a_redis_url_and_distinct_databases() {
        let shard = |name: &str, url: &str| ShardSpec {
            name: name.into(),
            url: url.into(),
        };
        let url = Target::Url("redis://a:6379".into());
        let err = ShardMap::new(Target::Embedded("/tmp/x".into()), &[shard("b", "redis://b")], &[])
            .expect_err("embedded default");
        assert!(err.to_string().contains("need --redis"), "{err}");
        let err = ShardMap::new(url.clone(), &[shard("b", "redis://A/0")], &[]).expect_err("same database");
        assert!(
            err.to_string().contains("shards default and b are one Redis database"),
            "{err}"
        );
        let map = ShardMap::new(url, &[shard("b", "redis://a:6379/1")], &[]).expect("another database");
        assert!(map.is_sharded());
    }
}

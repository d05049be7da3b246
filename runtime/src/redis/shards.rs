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
        let Some((name, url)) = text.split_once('=') else {
            bail!("expected NAME=URL (e.g. mail=redis://10.0.0.2:6379)");
        };
        let (name, url) = (name.trim(), url.trim());
        if name == DEFAULT {
            bail!("the shard name {DEFAULT:?} is --redis's (REDIS_URL)");
        }
        // Checked here so that a bad name is reported with the flag.
        Routes::new(vec![name.to_owned()], [])?;
        if redis::parse_redis_url(url).is_none() && !url.starts_with("unix://") {
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
        if queues.iter().any(String::is_empty) {
            bail!("a route names an empty queue: {text:?}");
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
        let mut names = vec![DEFAULT.to_owned()];
        let mut targets = vec![default];
        for shard in shards {
            if let Some(Target::Url(url)) = targets.iter().find(|t| matches!(t, Target::Url(u) if *u == shard.url)) {
                bail!("shard {} is at {}, like another shard", shard.name, redact(url));
            }
            names.push(shard.name.clone());
            targets.push(Target::Url(shard.url.clone()));
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

/// A shard a command opened (or could not).
pub struct Opened {
    /// Its name.
    pub name: String,
    /// Its location, for messages (no password).
    pub location: String,
    /// The connection, or why there is none.
    pub redis: Result<Redis>,
}

/// Opens every shard of `map`; a shard that cannot be reached is kept as
/// its error (naming the shard when there are several), for the caller to
/// report. The connections are opened in
/// parallel, so a fleet with a shard down answers in one timeout.
pub async fn open_all(map: &ShardMap) -> Vec<Opened> {
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

/// Closes what [`open_all`] opened.
pub async fn close_all(opened: Vec<Opened>) -> Result<()> {
    for shard in opened {
        if let Ok(redis) = shard.redis {
            redis.close().await?;
        }
    }
    Ok(())
}

//! Queues spread over several Redis servers ("shards").
//!
//! Each shard is a complete Sidekiq keyspace: a queue lives on exactly one
//! shard, with its scheduled jobs, retries and unique locks, so Ruby's
//! `Sidekiq::Client.via(pool)` and one Sidekiq Web UI per shard keep
//! working. [`Routes`] says which shard holds a queue: the first shard is
//! the default, for every queue not routed elsewhere. [`Sharded`] is a
//! [`Client`] per shard that pushes each job to the shard of its queue.
//!
//! Every process of a fleet (runners, producers, the CLI) must use the
//! same routes: a job pushed to a shard where its queue does not live is
//! never fetched by a runner that routes that queue elsewhere.
//!
//! ```no_run
//! use wasmjobs_client::shards::{Routes, Sharded};
//! use wasmjobs_client::Job;
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let routes = Routes::new(
//!     ["main", "mail"].map(String::from).to_vec(),
//!     [("mail".to_owned(), "mail".to_owned())],
//! )?;
//! let mut client = Sharded::connect(&["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"], routes).await?;
//! client.push(&Job::new("WelcomeMailer").queue("mail")).await?; // on 10.0.0.2
//! client.push(&Job::new("Report")).await?; // `default`: on 10.0.0.1
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, bail};
use redis::aio::{ConnectionLike, ConnectionManager};

use crate::payload::Payload;
use crate::unique::Pushed;
use crate::{Client, Job};

/// Longest shard name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Which shard holds each queue. Shards are named; the first is the
/// default shard, which holds every queue not routed to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    names: Vec<String>,
    by_queue: HashMap<String, usize>,
}

impl Routes {
    /// Shards `names` (the first is the default) and `routes` of
    /// `(queue, shard name)`. Refused: no shard, a name that is empty,
    /// longer than [`MAX_NAME_LEN`] or not `[A-Za-z0-9_.-]`, a name given
    /// twice, a route to a shard not named, a blank queue, and a queue
    /// routed to two different shards.
    pub fn new(names: Vec<String>, routes: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        if names.is_empty() {
            bail!("no shard: at least one Redis server is needed");
        }
        for (i, name) in names.iter().enumerate() {
            check_name(name)?;
            if names[..i].contains(name) {
                bail!("shard {name:?} is named twice");
            }
        }
        let mut by_queue = HashMap::new();
        for (queue, shard) in routes {
            if queue.trim().is_empty() {
                bail!("a route names an empty queue (QUEUE=SHARD)");
            }
            let Some(index) = names.iter().position(|name| *name == shard) else {
                bail!(
                    "queue {queue:?} is routed to shard {shard:?}, which is not one of the shards ({})",
                    names.join(", ")
                );
            };
            match by_queue.insert(queue.clone(), index) {
                Some(before) if before != index => {
                    bail!(
                        "queue {queue:?} is routed to two shards, {:?} and {shard:?}",
                        names[before]
                    )
                }
                _ => {}
            }
        }
        Ok(Self { names, by_queue })
    }

    /// One shard holding every queue.
    pub fn single(name: impl Into<String>) -> Self {
        Self {
            names: vec![name.into()],
            by_queue: HashMap::new(),
        }
    }

    /// The index of the shard holding `queue`.
    pub fn shard_of(&self, queue: &str) -> usize {
        self.by_queue.get(queue).copied().unwrap_or(0)
    }

    /// The shards' names, in order (the default first).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Never: there is always a default shard.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The queues routed by name to shard `index` (the default shard also
    /// holds every queue routed nowhere), sorted.
    pub fn routed_to(&self, index: usize) -> Vec<&str> {
        let mut queues: Vec<&str> = self
            .by_queue
            .iter()
            .filter(|(_, shard)| **shard == index)
            .map(|(queue, _)| queue.as_str())
            .collect();
        queues.sort_unstable();
        queues
    }

    /// `queues` grouped by the shard holding each, in the shards' order;
    /// shards holding none of them are left out.
    pub fn group<'q>(&self, queues: impl IntoIterator<Item = &'q str>) -> BTreeMap<usize, Vec<&'q str>> {
        let mut groups: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for queue in queues {
            groups.entry(self.shard_of(queue)).or_default().push(queue);
        }
        groups
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        bail!("a shard's name must be 1 to {MAX_NAME_LEN} bytes long, not {name:?}");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) {
        bail!("shard name {name:?} may only hold letters, digits, '_', '.' and '-'");
    }
    // A path segment of dots is no name: the dashboard serves a shard
    // under /shard/NAME, and a browser reads /shard/.. as /.
    if name.bytes().all(|b| b == b'.') {
        bail!("shard name {name:?} must hold something other than dots");
    }
    Ok(())
}

/// A [`Client`] per shard, pushing each job to the shard of its queue
/// (`Sidekiq::Client.via` chosen for you).
pub struct Sharded<C = ConnectionManager> {
    clients: Vec<Client<C>>,
    routes: Routes,
}

impl Sharded {
    /// Connects to every shard: `urls[i]` is shard `routes.names()[i]`.
    pub async fn connect(urls: &[&str], routes: Routes) -> Result<Self> {
        if urls.len() != routes.len() {
            bail!("{} Redis URLs for {} shards", urls.len(), routes.len());
        }
        let mut clients = Vec::with_capacity(urls.len());
        for (url, name) in urls.iter().zip(routes.names()) {
            let client = Client::connect(url)
                .await
                .map_err(|err| err.context(format!("shard {name}")))?;
            clients.push(client);
        }
        Ok(Self { clients, routes })
    }
}

impl<C: ConnectionLike + Send> Sharded<C> {
    /// A client per shard, in the order of `routes.names()`.
    pub fn from_clients(clients: Vec<Client<C>>, routes: Routes) -> Result<Self> {
        if clients.len() != routes.len() {
            bail!("{} clients for {} shards", clients.len(), routes.len());
        }
        Ok(Self { clients, routes })
    }

    /// The routes.
    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The client of the shard holding `queue`.
    pub fn via(&mut self, queue: &str) -> &mut Client<C> {
        let index = self.routes.shard_of(queue);
        &mut self.clients[index]
    }

    /// Pushes `job` to the shard of its queue ([`Client::push`]: a unique
    /// job's lock lives on that shard too).
    pub async fn push(&mut self, job: &Job) -> Result<Pushed> {
        let queue = job.queue.clone();
        let index = self.routes.shard_of(&queue);
        let name = self.routes.names()[index].clone();
        self.clients[index]
            .push(job)
            .await
            .map_err(|err| err.context(format!("shard {name}")))
    }

    /// Pushes payloads now ([`crate::push::push_bulk`]), each to the shard
    /// of its queue; one shard after another, in the shards' order. An
    /// error stops at the shard that failed (named in it): the shards
    /// before it have their jobs, the ones after it do not, and the
    /// payloads are left as they were — pushing them all again duplicates
    /// those already in.
    pub async fn push_bulk(&mut self, payloads: &mut [Payload]) -> Result<()> {
        let mut by_shard: Vec<Vec<Payload>> = vec![Vec::new(); self.clients.len()];
        let mut slots = Vec::with_capacity(payloads.len());
        for payload in payloads.iter() {
            let index = self.routes.shard_of(payload.queue());
            slots.push((index, by_shard[index].len()));
            by_shard[index].push(payload.clone());
        }
        for (index, batch) in by_shard.iter_mut().enumerate() {
            if batch.is_empty() {
                continue;
            }
            let name = &self.routes.names()[index];
            crate::push::push_bulk(self.clients[index].connection(), batch)
                .await
                .map_err(|err| err.context(format!("shard {name}")))?;
        }
        // Hand back what was written (enqueued_at), in the caller's order.
        for (payload, (index, at)) in payloads.iter_mut().zip(slots) {
            *payload = by_shard[index][at].clone();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(names: &[&str], routes: &[(&str, &str)]) -> Result<Routes> {
        Routes::new(
            names.iter().map(|n| n.to_string()).collect(),
            routes.iter().map(|(q, s)| (q.to_string(), s.to_string())),
        )
    }

    #[test]
    fn unlisted_queues_go_to_the_first_shard() {
        let r = routes(&["a", "b", "c"], &[("mail", "b"), ("reports", "c"), ("x", "a")]).unwrap();
        assert_eq!(r.shard_of("mail"), 1);
        assert_eq!(r.shard_of("reports"), 2);
        assert_eq!(r.shard_of("x"), 0);
        assert_eq!(r.shard_of("default"), 0);
        assert_eq!(r.shard_of("anything else"), 0);
        assert_eq!(r.routed_to(1), vec!["mail"]);
        assert_eq!(r.routed_to(0), vec!["x"]);
        let groups = r.group(["default", "mail", "reports", "mail2"]);
        assert_eq!(groups[&0], vec!["default", "mail2"]);
        assert_eq!(groups[&1], vec!["mail"]);
        assert_eq!(groups[&2], vec!["reports"]);
    }

    #[test]
    fn a_queue_routed_twice_to_one_shard_is_fine() {
        let r = routes(&["a", "b"], &[("mail", "b"), ("mail", "b")]).unwrap();
        assert_eq!(r.shard_of("mail"), 1);
    }

    #[test]
    fn bad_maps_are_refused_with_the_reason() {
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case] = &[
            (&[], &[], "no shard"),
            (&["a", "a"], &[], "named twice"),
            (&["a", ""], &[], "1 to 64 bytes"),
            (&["a", "b c"], &[], "may only hold"),
            (&["a", "b=c"], &[], "may only hold"),
            (&["a"], &[("mail", "b")], "not one of the shards (a)"),
            (&["a", "b"], &[("mail", "a"), ("mail", "b")], "routed to two shards"),
            (&["a"], &[(" ", "a")], "empty queue"),
        ];
        for (names, routes_, expected) in cases {
            let err = routes(names, routes_).unwrap_err().to_string();
            assert!(err.contains(expected), "{names:?} {routes_:?}: {err}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(routes(&[&long], &[]).is_err());
        assert!(routes(&["x".repeat(MAX_NAME_LEN).as_str()], &[]).is_ok());
    }
}

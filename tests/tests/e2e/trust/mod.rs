//! The sandbox against a hostile guest and the queue against poison input
//! (`docs/capabilities.md`, "Threat model"). Each module tries one way out
//! or one way to wedge the engine, as an attacker would, with real
//! components, servers and files.

mod cache;
mod dev_sources;
mod disk;
mod files;
mod hostile;
mod hostile_run;
mod http;
mod limits;
mod logs;
mod payloads;
mod poison;
mod sql;
mod wrong_types;

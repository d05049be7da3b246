//! Plugins on disk: a component plus the manifest beside it.
//!
//! A plugin directory holds `wasmjobs.toml` ([`manifest`]) and the component
//! it names. Loading a plugin reads both, compiles the component (or takes it
//! from the [`cache`]), checks that it implements the job world, that its
//! grants are usable and within the runner's caps ([`caps`]), and pre-links it once so that each job only has to
//! instantiate. The [`Catalog`] maps job classes to loaded plugins and keeps
//! the reasons broken plugins were refused. A development build carries
//! its Python sources, which are unpacked and granted read-only
//! ([`dev_sources`]). A manifest's `[[schedule]]`
//! entries (periodic jobs) are parsed by [`schedule`]; what a runner
//! publishes about its plugins is built by [`describe`].

pub mod cache;
mod caps;
pub mod catalog;
pub mod cluster_limits;
pub mod describe;
pub mod dev_sources;
mod function_pack;
pub mod instances;
pub mod limits;
mod loaded;
pub mod manifest;
mod private_files;
pub mod schedule;

pub use cache::{CacheUse, CompileCache};
pub use catalog::{Broken, Catalog, Plugin};
pub use cluster_limits::ClusterLimits;
pub use describe::Described;
pub use instances::InstancePolicy;
pub use limits::PluginLimits;
pub use manifest::{MANIFEST_FILE, Manifest, Mode, Preopen};
pub use schedule::Schedule;

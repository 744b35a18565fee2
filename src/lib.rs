//! lakecdc: exports a PostgreSQL entity store into a verifiable Parquet lake on S3 or a local
//! directory.
//!
//! Layering (dependencies point down only):
//! - jobs: [`init_db`], [`flush`], [`verify`], [`gc`], [`compact`], [`inspect`], [`init`],
//!   [`requeue`], [`doctor`], [`attach`];
//! - building blocks: [`source`] (PostgreSQL), [`engine`] (DuckDB), [`lake`] (the on-storage
//!   format), [`store`] (object storage); building blocks never call each other, except that
//!   `lake` commits manifests through the `store` trait;
//! - the domain model: [`schema`], [`config`], [`clock`].

pub mod allocator;
pub mod attach;
pub mod clock;
pub mod compact;
pub mod config;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod flush;
pub mod gc;
pub mod init;
pub mod init_db;
pub mod inspect;
pub mod job;
pub mod lake;
pub mod logging;
pub mod metrics;
pub mod policy;
pub mod progress;
pub mod query;
pub(crate) mod report;
pub mod requeue;
pub mod retry;
pub mod run;
pub mod schema;
pub mod scratch;
pub mod shutdown;
pub mod source;
pub mod store;
pub mod verify;
pub mod view;

pub use error::{Error, Result};

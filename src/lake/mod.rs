//! The on-storage format: object keys (built and parsed by one module), the per-schema
//! manifest and its conditional commit, and Parquet footer checks.

pub mod footer;
pub mod keys;
pub mod manifest;

pub use keys::{KeyKind, Layout};
pub use manifest::{FileEntry, Manifest, Tier};

//! The on-storage format: object keys (built and parsed by one module), the per-schema
//! manifest and its conditional commit, the owner marker of each data prefix, and Parquet
//! footer checks.

pub mod footer;
pub mod keys;
pub mod manifest;
pub mod owner;

pub use keys::{KeyKind, Layout};
pub use manifest::{FileEntry, Manifest, Tier};

use std::sync::Arc;

use crate::store::ObjectStore;

/// A lake: where its objects are stored and how their keys are laid out.
#[derive(Debug, Clone)]
pub struct Lake {
    /// The object store holding the lake.
    pub store: Arc<dyn ObjectStore>,
    /// Key shapes under the lake root.
    pub layout: Layout,
}

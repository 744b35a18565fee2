//! The on-storage format: object keys (built and parsed by one module), the per-schema
//! manifest and its conditional commit, the owner marker of each data prefix, and Parquet
//! footer checks.

pub mod footer;
pub(crate) mod keys;
pub mod manifest;
pub(crate) mod owner;

pub use keys::{KeyKind, Layout};
pub use manifest::{FileEntry, Manifest, Tier};

use std::sync::Arc;

use crate::config::LakeLocation;
use crate::error::{Error, Result};
use crate::store::local::LocalStore;
use crate::store::s3::{S3Options, S3Store};
use crate::store::{ObjectStore, StoreError};

/// A lake: where its objects are stored and how their keys are laid out.
#[derive(Debug, Clone)]
pub struct Lake {
    /// The object store holding the lake.
    pub store: Arc<dyn ObjectStore>,
    /// Key shapes under the lake root.
    pub layout: Layout,
}

impl Lake {
    /// Opens the lake at `location` (S3 settings from `s3`), laid out as `layout`. Makes no
    /// network request.
    pub async fn open(location: &LakeLocation, layout: Layout, s3: &S3Options) -> Result<Self> {
        let store = open_store(location, s3)
            .await
            .map_err(Error::storage("open lake", location.describe()))?;
        Ok(Self { store, layout })
    }
}

/// Opens the store a [`LakeLocation`] names. Makes no network request. A local
/// lake directory must exist, as a bucket must: a mistyped or relative path (resolved against
/// a cron job's working directory) would otherwise quietly become a new, empty lake that
/// flush writes to and marks rows flushed for.
async fn open_store(
    location: &LakeLocation,
    s3: &S3Options,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Ok(match location {
        LakeLocation::Local(path) => {
            let shown = || path.display().to_string();
            match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(StoreError::NotADirectory { path: shown() }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(StoreError::NoSuchDirectory { path: shown() });
                }
                // Unreadable (permissions, a broken mount): the I/O error says what.
                Err(e) => return Err(StoreError::Io(e)),
            }
            Arc::new(LocalStore::open(path)?)
        }
        LakeLocation::S3 { bucket, .. } => {
            let mut opts = s3.clone();
            opts.bucket = bucket.clone();
            Arc::new(S3Store::connect(&opts).await)
        }
    })
}

//! The on-storage format: object keys (built and parsed by one module), the per-schema
//! manifest and its conditional commit, the manifest's history copies (time travel), the
//! owner marker of each data prefix, and Parquet footer checks.

pub mod current;
pub mod footer;
pub mod history;
pub mod identity;
pub(crate) mod keys;
pub mod manifest;
pub(crate) mod owner;
pub mod ranges;
pub(crate) mod streamed;

pub use identity::{SourceGuard, SourceIdentity};
pub use keys::{ForeignPath, KeyKind, Layout};
pub use manifest::{FileEntry, Manifest, Tier};

use std::sync::Arc;

use crate::config::LakeLocation;
use crate::error::{Error, Result};
use crate::store::local::LocalStore;
use crate::store::s3::{S3Options, S3Store};
use crate::store::{GetResult, ObjectStore, StoreError};

/// How large each metadata object of the lake may be when lakecdc reads it. Manifests, the gc
/// state and owner markers are read whole into memory, and whoever can write the lake can make
/// them as large as they like: a larger object is refused before it is read
/// (docs/hazards.md S2). The defaults hold the documents of large lakes and keep what parsing
/// them costs (several times their size) within the memory the deployment manifests give each
/// job; a lake that outgrows one needs the limit raised, and the job's memory with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// A manifest, in bytes ([`ReadLimits::DEFAULT_MANIFEST_BYTES`]).
    pub manifest_bytes: u64,
    /// gc's sighting state (`<manifest key>.gc-state`), in bytes
    /// ([`ReadLimits::DEFAULT_GC_STATE_BYTES`]).
    pub gc_state_bytes: u64,
    /// A data prefix's owner marker, in bytes ([`ReadLimits::DEFAULT_OWNER_MARKER_BYTES`]).
    pub owner_marker_bytes: u64,
}

impl ReadLimits {
    /// 64 MiB. An entry takes about 490 bytes plus 43 per column of its stamp in the
    /// pretty-printed document: 100,000 entries of a schema of 10 columns, or about 38,000 of
    /// the 29-column example schema, fit. The parsed document takes about 3.3 times its size
    /// besides the bytes read (measured: 58 MiB parsed into 191 MiB), so one manifest at the
    /// limit costs under 300 MiB, within the 512 MiB the deployment manifests give the gc job
    /// and leave the flush job beside DuckDB's memory limit.
    pub const DEFAULT_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
    /// 16 MiB: about 100,000 sightings of about 150 bytes each (one per unlisted deletable
    /// object; a healthy lake has a few).
    pub const DEFAULT_GC_STATE_BYTES: u64 = 16 * 1024 * 1024;
    /// 64 KiB: the marker holds one manifest key, and an object key is at most 1 KiB.
    pub const DEFAULT_OWNER_MARKER_BYTES: u64 = 64 * 1024;
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            manifest_bytes: Self::DEFAULT_MANIFEST_BYTES,
            gc_state_bytes: Self::DEFAULT_GC_STATE_BYTES,
            owner_marker_bytes: Self::DEFAULT_OWNER_MARKER_BYTES,
        }
    }
}

/// One bounded read of a lake metadata object ([`read_capped`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Capped {
    /// What lakecdc is doing, for a storage error (`load manifest`).
    pub op: &'static str,
    /// What the object is, for a refusal (`manifest`).
    pub what: &'static str,
    /// The most bytes read.
    pub limit: u64,
    /// Why the limit holds and how to raise it, for a refusal.
    pub why: &'static str,
}

/// Reads a whole metadata object of at most `cap.limit` bytes; `Ok(None)` when the store says
/// it does not exist. One capped read ([`ObjectStore::get_bytes_within`]): a larger object is
/// refused by its announced size before its body is read, or as soon as the body passes the
/// limit, so no more than the limit is ever held.
pub(crate) async fn read_capped(
    store: &dyn ObjectStore,
    key: &str,
    cap: Capped,
) -> Result<Option<GetResult>> {
    let refuse = |size: u64| Error::TooLarge {
        what: cap.what,
        key: key.to_string(),
        size,
        limit: cap.limit,
        why: cap.why.to_string(),
        saving: false,
    };
    let storage = |source| Error::Storage {
        op: cap.op,
        key: key.to_string(),
        source,
    };
    match store.get_bytes_within(key, cap.limit).await {
        Ok(got) => Ok(Some(got)),
        Err(StoreError::NotFound) => Ok(None),
        Err(StoreError::TooLarge { size, .. }) => Err(refuse(size)),
        Err(source) => Err(storage(source)),
    }
}

/// A lake: where its objects are stored, how their keys are laid out, and how large its
/// metadata objects may be read ([`Lake::limits`]).
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

    /// The same lake, read within `limits`.
    pub fn with_limits(mut self, limits: ReadLimits) -> Self {
        self.layout = self.layout.with_limits(limits);
        self
    }

    /// How large its metadata objects may be read.
    pub fn limits(&self) -> &ReadLimits {
        self.layout.limits()
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

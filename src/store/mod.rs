//! Object storage: the [`ObjectStore`] trait and its backends.
//!
//! Keys are store-relative (`data/7/….parquet`, `manifest/7.json`) and used verbatim: no backend
//! trims, joins or normalises them. Data keys are write-once by construction (UUID names); the
//! only overwritten objects are manifests and gc state, always through a conditional
//! [`PutMode`]. Backends: [`s3`] (aws-sdk-s3), [`local`] (a directory), `memory` (tests), and the
//! `fault` decorator that injects failures and pauses into any of them (both only with the
//! `testing` feature, which only the test targets enable).

#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub mod local;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod probe;
pub mod s3;
pub mod stream;

use std::path::Path;

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};

/// Objects at least this large are uploaded in parts (S3) by `put_file`.
pub const MULTIPART_THRESHOLD: u64 = 16 * 1024 * 1024;

/// How a `put_bytes` treats an existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Write unconditionally.
    Overwrite,
    /// Write only if no object exists (`If-None-Match: *`).
    Create,
    /// Write only if the current object has this etag (`If-Match`).
    Update(String),
}

/// What a successful upload stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutResult {
    /// Bytes stored.
    pub size: u64,
    /// SHA-256 of exactly the bytes stored, computed while uploading.
    pub sha256: [u8; 32],
    /// The object's new etag.
    pub etag: String,
}

impl PutResult {
    /// The checksum in the manifest's `sha256:<hex>` form.
    pub fn checksum(&self) -> String {
        format!("sha256:{}", hex::encode(self.sha256))
    }
}

/// An object read into memory.
#[derive(Debug, Clone)]
pub struct GetResult {
    /// The object's bytes.
    pub bytes: Bytes,
    /// The etag of the version read (for a later `PutMode::Update`).
    pub etag: String,
}

/// An object downloaded to a local file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    /// Bytes written to the file.
    pub size: u64,
    /// SHA-256 of the bytes, computed while downloading.
    pub sha256: [u8; 32],
}

/// Metadata of one stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// The object's etag.
    pub etag: String,
    /// Last modification, epoch milliseconds.
    pub last_modified_ms: i64,
}

/// A classified store failure. Only [`StoreError::Conflict`] proves a conditional write did not
/// happen; every other failure of a write is ambiguous.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object (or bucket) does not exist.
    #[error("not found")]
    NotFound,
    /// The bucket does not exist.
    #[error("bucket {bucket} does not exist: create it or fix --lake")]
    NoSuchBucket {
        /// The missing bucket.
        bucket: String,
    },
    /// A local lake directory does not exist.
    #[error("lake directory {path} does not exist: create it (mkdir -p) or fix --lake")]
    NoSuchDirectory {
        /// The missing directory, as given.
        path: String,
    },
    /// A local lake path names something other than a directory.
    #[error("lake {path} is not a directory: fix --lake")]
    NotADirectory {
        /// The path, as given.
        path: String,
    },
    /// A conditional write's precondition failed (412, 409, or 404 for If-Match on a missing
    /// key): the write did not happen.
    #[error("precondition failed: the object was changed by another writer")]
    Conflict,
    /// The key cannot be stored by this backend (e.g. escapes the lake directory).
    #[error("invalid key: {reason}")]
    InvalidKey {
        /// Why the key is refused.
        reason: &'static str,
    },
    /// The call did not finish within its time limits (one attempt, or the whole request
    /// with its retries: the SDK does not say which).
    #[error(
        "timed out (limits: {attempt_s}s per attempt, {request_s}s per request with its retries)"
    )]
    Timeout {
        /// The limit on one attempt.
        attempt_s: u64,
        /// The limit on the whole request.
        request_s: u64,
    },
    /// A local I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Any other backend failure (network, auth, server error).
    #[error("{message}")]
    Backend {
        /// A short description (never credentials).
        message: String,
        /// The SDK's error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The object is larger than the reader allows (docs/security.md, size caps): it was not
    /// read, or reading stopped at the limit.
    #[error("object is at least {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// Its size, or (when reading stopped part-way) the bytes seen so far.
        size: u64,
        /// The cap, in bytes.
        limit: u64,
    },
    /// A ranged read ([`ObjectStore::get_range`]) asked for bytes past the object's end:
    /// nothing was returned (a ranged read is never short).
    #[error(
        "a read of {len} bytes at offset {offset} ends past the object's end{}",
        .size.map_or_else(String::new, |s| format!(" (the object holds {s} bytes)"))
    )]
    RangePastEnd {
        /// The first byte asked for.
        offset: u64,
        /// The bytes asked for.
        len: u64,
        /// The object's size, when the store told it.
        size: Option<u64>,
    },
    /// A streamed upload's writer stopped before it ended the object
    /// ([`stream::Part::End`]): nothing was stored.
    #[error("the writer stopped before the object was complete; nothing was stored")]
    Unfinished,
    /// Injected by the fault decorator (tests).
    #[error("injected fault")]
    Injected,
}

impl StoreError {
    /// True for the store's typed not-found (object missing). `NoSuchBucket` is not "not found":
    /// a missing bucket must never read as an empty manifest.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound)
    }

    /// True when a conditional write provably did not happen.
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict)
    }

    /// True when the same request may succeed later: a timeout or a backend failure (network,
    /// server error). A missing object, a refusal, a bad key and a lost conditional write are
    /// answers, not failures.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout { .. } | StoreError::Backend { .. }
        )
    }

    /// Whether the error is about the object read (gone, larger than allowed, shorter than
    /// the read asked for) rather than about the store that serves it.
    pub fn is_about_the_object(&self) -> bool {
        matches!(
            self,
            StoreError::NotFound | StoreError::TooLarge { .. } | StoreError::RangePastEnd { .. }
        )
    }
}

/// The storage seam every job uses. Implementations must be safe to call concurrently.
#[async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// A short description for messages, e.g. `s3://bucket` or `/srv/lake`.
    fn describe(&self) -> String;

    /// Where another engine reads `key`: `s3://bucket/key`, or an absolute path for a local
    /// lake (docs/design.md §4.7, `lakecdc view`).
    fn uri(&self, key: &str) -> String {
        format!("{}/{key}", self.describe().trim_end_matches('/'))
    }

    /// Whether the store keeps objects as local files ([`ObjectStore::open_local`] answers).
    fn is_local(&self) -> bool {
        false
    }

    /// The object opened for reading in place, when the store keeps objects as local files
    /// (opened as safely as every other read: no link is followed, docs/security.md); `None`
    /// for a remote store, whose objects must be downloaded.
    async fn open_local(&self, key: &str) -> Option<Result<std::fs::File, StoreError>> {
        let _ = key;
        None
    }

    /// Uploads a local file (multipart above [`MULTIPART_THRESHOLD`] where the backend supports
    /// it), returning the stored size, its SHA-256 and etag.
    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError>;

    /// Stores the parts `parts` yields, in order, as one object while they are written (a
    /// multipart upload on S3, a hidden temporary file renamed into place on a local lake):
    /// nothing of it is kept on local disk (docs/design.md §9). The object exists only once
    /// [`stream::Part::End`] arrived and every part is stored; a channel closed before that
    /// stores nothing and answers [`StoreError::Unfinished`]. Returns the stored size, its
    /// SHA-256 and etag, as [`ObjectStore::put_file`] does.
    async fn put_parts(&self, key: &str, parts: stream::Parts) -> Result<PutResult, StoreError>;

    /// Writes an in-memory body under a [`PutMode`].
    async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError>;

    /// Reads a whole object into memory, refusing one larger than `limit` bytes: by its
    /// announced size before its body is read, or as soon as the body passes the limit, so no
    /// more than `limit` bytes are ever held (lake-controlled objects are capped:
    /// docs/security.md).
    async fn get_bytes_within(&self, key: &str, limit: u64) -> Result<GetResult, StoreError>;

    /// Downloads an object to a local file (created new, mode 0600), hashing while writing, and
    /// fails once more than `limit` bytes arrive (a listed file larger than its manifest size).
    async fn get_to_file_within(
        &self,
        key: &str,
        path: &Path,
        limit: u64,
    ) -> Result<Download, StoreError>;

    /// Reads a whole object into memory, however large (tests and objects lakecdc wrote).
    async fn get_bytes(&self, key: &str) -> Result<GetResult, StoreError> {
        self.get_bytes_within(key, u64::MAX).await
    }

    /// Reads `len` bytes of an object starting at byte `offset` (compaction streams its inputs
    /// row group by row group this way: docs/design.md §9). A range that ends past the object's
    /// end is an error (StoreError), never a short read.
    ///
    /// The error is [`StoreError::RangePastEnd`] (also for an `offset + len` past `u64::MAX`);
    /// a missing object is [`StoreError::NotFound`]. A `len` of 0 returns empty bytes without
    /// asking the store anything: it checks neither that the object exists nor where `offset`
    /// lies.
    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError>;

    /// Downloads a whole object to a local file, however large.
    async fn get_to_file(&self, key: &str, path: &Path) -> Result<Download, StoreError> {
        self.get_to_file_within(key, path, u64::MAX).await
    }

    /// The object's metadata.
    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError>;

    /// Copies `from` to `to` within the store (overwriting `to`).
    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError>;

    /// Deletes an object; deleting a missing object succeeds.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// Every object whose key starts with `prefix`, in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError>;

    /// Writes under `prefix` that were started and never finished nor undone — a process
    /// killed mid-write leaves them, invisible to [`ObjectStore::list`]: an S3 multipart upload
    /// never completed or aborted, a local lake's hidden temporary file. None by default.
    async fn abandoned_writes(&self, prefix: &str) -> Result<Vec<AbandonedWrite>, StoreError> {
        let _ = prefix;
        Ok(Vec::new())
    }

    /// Undoes one of [`ObjectStore::abandoned_writes`] (aborts the upload, removes the file);
    /// one already gone succeeds.
    async fn remove_abandoned(&self, write: &AbandonedWrite) -> Result<(), StoreError> {
        let _ = write;
        Ok(())
    }
}

/// A write a killed process started and nobody finished (docs/hazards.md L38).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonedWrite {
    /// The key being written (S3), or the temporary file's path under the lake (local).
    pub key: String,
    /// When it started, in ms since the epoch (the upload's initiation, the file's mtime).
    pub started_ms: i64,
    /// The bytes it holds, where the store says (a local file's size).
    pub bytes: Option<u64>,
    /// The store's handle on it (an S3 upload id).
    pub handle: String,
}

/// Deletes `key`, logging instead of failing when it cannot: what is left (`what`) is an
/// unlisted object gc removes.
pub async fn delete_or_leave(store: &dyn ObjectStore, key: &str, what: &str) {
    if let Err(e) = store.delete(key).await {
        tracing::warn!(key, error = %e, "{what} not deleted; gc will");
    }
}

/// Copies `src` to `dst` while hashing (`std::io::sink()` as `dst` hashes only): the bytes
/// copied and their SHA-256.
pub fn copy_hashing(
    src: &mut impl std::io::Read,
    dst: &mut impl std::io::Write,
) -> std::io::Result<(u64, [u8; 32])> {
    let mut hasher = Sha256::new();
    // No larger than a write lakecdc hands the kernel (`scratch::WRITE_PIECE`).
    let mut buf = vec![0u8; crate::scratch::WRITE_PIECE];
    let mut total = 0u64;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        hasher.update(chunk);
        dst.write_all(chunk)?;
        total += n as u64;
    }
    Ok((total, hasher.finalize().into()))
}

/// Where a ranged read of `len` bytes at `offset` ends (one past its last byte), refusing a
/// range that does not fit in `u64`.
pub(crate) fn range_end(offset: u64, len: u64) -> Result<u64, StoreError> {
    offset.checked_add(len).ok_or(StoreError::RangePastEnd {
        offset,
        len,
        size: None,
    })
}

/// The byte positions `start..end` of a ranged read of `len` bytes at `offset` in an object of
/// `size` bytes, refusing a range that ends past the object's end.
pub(crate) fn range_within(
    offset: u64,
    len: u64,
    size: u64,
) -> Result<std::ops::Range<usize>, StoreError> {
    let past_end = || StoreError::RangePastEnd {
        offset,
        len,
        size: Some(size),
    };
    let end = range_end(offset, len).map_err(|_| past_end())?;
    if end > size {
        return Err(past_end());
    }
    let start = usize::try_from(offset).map_err(|_| past_end())?;
    let end = usize::try_from(end).map_err(|_| past_end())?;
    Ok(start..end)
}

/// SHA-256 of a byte slice.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

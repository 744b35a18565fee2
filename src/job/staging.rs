//! Staging a new lake object: every new file (a flush's delta, a compaction's base or
//! consolidated delta, an init's base) is uploaded straight to its write-once final key. Until a
//! manifest lists it, it is an orphan that gc removes past its grace — a base at once, a delta
//! once every row in it is covered by the listed state or still pending at its source
//! (docs/design.md §4.1, §4.3, §4.8). A temporary key and a copy would make the store write
//! every byte twice and add two requests per file, for no state that gc does not settle.

use std::path::Path;
use std::time::Instant;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::stream::Parts;
use crate::store::{ObjectStore, PutResult, StoreError, delete_or_leave};

/// A staged object.
#[derive(Debug, Clone)]
pub struct Staged {
    /// The upload's size and checksum.
    pub put: PutResult,
    /// When the upload began (monotonic clock): from then on gc may see the object.
    pub uploaded_at: Instant,
    /// The same instant on the wall clock (epoch ms).
    pub uploaded_at_ms: i64,
}

/// Uploads `local` straight to its new write-once `key`, an orphan to gc until a manifest lists
/// it. The lease starts before the upload, when the object may first be seen.
pub async fn upload(
    store: &dyn ObjectStore,
    clock: &dyn Clock,
    local: &Path,
    key: &str,
    upload_op: &'static str,
) -> Result<Staged> {
    let uploaded_at = Instant::now();
    let uploaded_at_ms = clock.now_ms();
    let put = put_or_clean(store, local, key, upload_op).await?;
    Ok(Staged {
        put,
        uploaded_at,
        uploaded_at_ms,
    })
}

/// Stores what `parts` yields straight to its new write-once `key` while it is written
/// (docs/design.md §9), as [`upload`] does a local file. `started` is when the upload began
/// (monotonic and wall clock): taken before the first request, as an S3 object completed
/// from parts counts its age from the upload's start.
pub async fn upload_parts(
    store: &dyn ObjectStore,
    started: (Instant, i64),
    parts: Parts,
    key: &str,
    upload_op: &'static str,
) -> Result<Staged> {
    let put = clean_failed(store, store.put_parts(key, parts).await, key, upload_op).await?;
    Ok(Staged {
        put,
        uploaded_at: started.0,
        uploaded_at_ms: started.1,
    })
}

/// Uploads `local` to the unlisted `key`; a failed upload deletes whatever of it may have
/// landed, or leaves it to gc.
async fn put_or_clean(
    store: &dyn ObjectStore,
    local: &Path,
    key: &str,
    op: &'static str,
) -> Result<PutResult> {
    clean_failed(store, store.put_file(key, local).await, key, op).await
}

/// Passes on an upload's result; a failed one's `key` is deleted (it may have landed), or
/// left to gc.
async fn clean_failed(
    store: &dyn ObjectStore,
    done: std::result::Result<PutResult, StoreError>,
    key: &str,
    op: &'static str,
) -> Result<PutResult> {
    match done {
        Ok(put) => Ok(put),
        // A streamed upload whose writer stopped first stored nothing.
        Err(source @ StoreError::Unfinished) => Err(Error::Storage {
            op,
            key: key.to_string(),
            source,
        }),
        Err(source) => {
            delete_or_leave(store, key, "unlisted upload").await;
            Err(Error::Storage {
                op,
                key: key.to_string(),
                source,
            })
        }
    }
}

//! Staging a new lake object. A delta (flush's, or compact's consolidated one) is uploaded to a
//! temporary key, copied to its write-once final key, and the temporary one deleted: an
//! unlisted delta is never deleted by gc (it may hold rows whose marks landed), so a failure
//! before the copy must leave no final object; a failed delete of the temporary object leaves
//! it to gc (docs/design.md §4.1). A merged base goes straight to its final key ([`upload`]),
//! as init's bases do: gc removes an unlisted base as an orphan, and the copy would make the
//! store write every byte twice (docs/design.md §4.3).

use std::path::Path;
use std::time::Instant;

use uuid::Uuid;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::lake::Layout;
use crate::store::{ObjectStore, PutResult, delete_or_leave};

/// A staged object.
#[derive(Debug, Clone)]
pub struct Staged {
    /// The upload's size and checksum (the final object is a copy of it).
    pub put: PutResult,
    /// When the write of the final key began — the copy, or the direct upload (monotonic
    /// clock): from then on gc may see it.
    pub promoted_at: Instant,
    /// The same instant on the wall clock (epoch ms).
    pub promoted_at_ms: i64,
    /// The temporary object could not be deleted; gc removes it.
    pub tmp_left: bool,
}

/// What is staged, for the error of a failed step: `("upload delta", "promote delta")`.
pub(super) type StageOps = (&'static str, &'static str);

/// Uploads `local` to a temporary key of `schema_id` and copies it to `key`.
pub async fn stage(
    store: &dyn ObjectStore,
    layout: &Layout,
    clock: &dyn Clock,
    schema_id: i16,
    local: &Path,
    key: &str,
    (upload_op, promote_op): StageOps,
) -> Result<Staged> {
    let tmp = layout.tmp_key(schema_id, Uuid::new_v4());
    let put = put_or_clean(store, local, &tmp, upload_op).await?;
    let promoted_at = Instant::now();
    let promoted_at_ms = clock.now_ms();
    if let Err(source) = store.copy(&tmp, key).await {
        delete_or_leave(store, &tmp, "temporary object").await;
        return Err(Error::Storage {
            op: promote_op,
            key: key.to_string(),
            source,
        });
    }
    let tmp_left = match store.delete(&tmp).await {
        Ok(()) => false,
        Err(e) => {
            tracing::warn!(key = %tmp, error = %e, "temporary object left for gc");
            true
        }
    };
    Ok(Staged {
        put,
        promoted_at,
        promoted_at_ms,
        tmp_left,
    })
}

/// Uploads `local` straight to its new write-once `key`, which gc removes as an orphan while no
/// manifest lists it (a merged base). The lease starts before the upload, when the object may
/// first be seen.
pub async fn upload(
    store: &dyn ObjectStore,
    clock: &dyn Clock,
    local: &Path,
    key: &str,
    upload_op: &'static str,
) -> Result<Staged> {
    let promoted_at = Instant::now();
    let promoted_at_ms = clock.now_ms();
    let put = put_or_clean(store, local, key, upload_op).await?;
    Ok(Staged {
        put,
        promoted_at,
        promoted_at_ms,
        tmp_left: false,
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
    match store.put_file(key, local).await {
        Ok(put) => Ok(put),
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

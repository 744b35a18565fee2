//! Staging a new lake object, as flush (a delta) and compact (a merged base) do it: upload the
//! local file to a temporary key, copy it to its write-once final key, delete the temporary
//! one. A failure before the copy leaves no final object; a failed delete of the temporary
//! object leaves it to gc (docs/design.md §4.1).

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
    /// When the copy to the final key began (monotonic clock): from then on gc may see it.
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
    let put = match store.put_file(&tmp, local).await {
        Ok(put) => put,
        Err(source) => {
            delete_or_leave(store, &tmp, "temporary object").await;
            return Err(Error::Storage {
                op: upload_op,
                key: tmp,
                source,
            });
        }
    };
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

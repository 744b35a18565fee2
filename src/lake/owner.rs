//! The owner marker of a schema's data prefix: `{data}/{schema}/_owner.json` names the manifest
//! whose files live there. gc deletes what that manifest does not list, so a run pointed at the
//! wrong manifest (another `--manifest-template` or `--lake` root sharing the data prefix)
//! would take the other manifest's files for orphans. The writers that create bases (init,
//! compact) claim an unclaimed prefix with a conditional create and refuse one claimed by
//! another manifest; gc refuses such a prefix before deleting anything. A prefix without a
//! marker (only ever flushed) holds no base for gc to delete but its own merged ones.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::Layout;
use crate::error::{Error, Result};
use crate::store::{ObjectStore, PutMode, StoreError};

/// The marker's content.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    /// The manifest key the prefix belongs to.
    manifest: String,
}

/// The manifest key the schema's data prefix belongs to, if it is claimed.
pub async fn owner(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
) -> Result<Option<String>> {
    let key = layout.owner_key(schema_id);
    match store.get_bytes(&key).await {
        Ok(got) => {
            let marker: Marker = serde_json::from_slice(&got.bytes).map_err(|e| Error::Manifest {
                key: key.clone(),
                message: format!("the owner marker is not valid ({e}); it should hold {{\"manifest\": \"<manifest key>\"}}"),
            })?;
            Ok(Some(marker.manifest))
        }
        Err(StoreError::NotFound) => Ok(None),
        Err(source) => Err(Error::Storage {
            op: "read owner marker",
            key,
            source,
        }),
    }
}

/// The refusal when the prefix belongs to `other`, not to this layout's manifest; `None` when
/// it is unclaimed or ours. Manifest keys are compared relative to the lake root.
pub fn mismatch(layout: &Layout, schema_id: i16, owner: Option<&str>) -> Option<String> {
    let ours = layout.manifest_key_in_lake(schema_id);
    owner.filter(|o| *o != ours).map(|other| {
        format!(
            "{} belongs to manifest {other}, not {ours}: check --lake, --data-prefix and --manifest-template (delete {} only if the lake really moved to this manifest)",
            layout.schema_prefix(schema_id),
            layout.owner_key(schema_id)
        )
    })
}

/// Fails unless the schema's data prefix is unclaimed or belongs to this layout's manifest,
/// and claims an unclaimed one (`claim`: false checks only, for a dry run).
pub async fn ensure(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    claim: bool,
) -> Result<()> {
    let refuse = |why: String| Error::Manifest {
        key: layout.owner_key(schema_id),
        message: why,
    };
    let current = owner(store, layout, schema_id).await?;
    if let Some(why) = mismatch(layout, schema_id, current.as_deref()) {
        return Err(refuse(why));
    }
    if current.is_some() || !claim {
        return Ok(());
    }
    let key = layout.owner_key(schema_id);
    let body = serde_json::to_vec(&Marker {
        manifest: layout.manifest_key_in_lake(schema_id),
    })
    .map_err(|e| Error::Invariant(format!("owner marker: {e}")))?;
    match store
        .put_bytes(&key, Bytes::from(body), PutMode::Create)
        .await
    {
        Ok(_) => Ok(()),
        // Claimed meanwhile: fine if by the same manifest.
        Err(StoreError::Conflict) => {
            let now = owner(store, layout, schema_id).await?;
            match mismatch(layout, schema_id, now.as_deref()) {
                Some(why) => Err(refuse(why)),
                None => Ok(()),
            }
        }
        Err(source) => Err(Error::Storage {
            op: "claim data prefix",
            key,
            source,
        }),
    }
}

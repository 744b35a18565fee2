//! The owner marker of a schema's data prefix: `{data}/{schema}/_owner.json` names the manifest
//! whose files live there. gc deletes what that manifest does not list, so a run pointed at the
//! wrong manifest (another `--manifest-template` or `--lake` root sharing the data prefix)
//! would take the other manifest's files for orphans, and deltas flushed there would reach
//! only the wrong manifest's readers. Every writer (flush, init, compact) claims an unclaimed
//! prefix with a conditional create when it first publishes and refuses one claimed by another
//! manifest before writing; gc refuses such a prefix before deleting anything. A prefix without
//! a marker (written before markers existed) is claimed by its next writer.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::manifest::{self, CommitPolicy, Committed, Loaded, Manifest, SaveFrom};
use super::{Capped, Layout, SourceGuard, read_capped};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::store::{ObjectStore, PutMode, StoreError};

/// The marker's content.
#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    /// The manifest key the prefix belongs to.
    manifest: String,
}

/// Whose the schema's data prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// Claimed by this layout's manifest.
    Ours,
    /// Not claimed yet: the next writer claims it when it publishes.
    Unclaimed,
    /// Claimed by another manifest; the refusal, naming both.
    Other(String),
}

/// Reads the marker of the schema's data prefix (manifest keys compared relative to the lake
/// root).
pub(crate) async fn check(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
) -> Result<Ownership> {
    let key = layout.owner_key(schema_id);
    let cap = Capped {
        op: "read owner marker",
        what: "owner marker",
        limit: layout.limits().owner_marker_bytes,
        why: "a marker holds one manifest key: it is corrupt or hostile",
    };
    let owner = match read_capped(store, &key, cap).await? {
        Some(got) => {
            let marker: Marker = serde_json::from_slice(&got.bytes).map_err(|e| Error::Manifest {
                key: key.clone(),
                message: format!("the owner marker is not valid ({e}); it should hold {{\"manifest\": \"<manifest key>\"}}"),
            })?;
            marker.manifest
        }
        None => return Ok(Ownership::Unclaimed),
    };
    let ours = layout.manifest_key_in_lake(schema_id);
    Ok(if owner == ours {
        Ownership::Ours
    } else {
        Ownership::Other(format!(
            "{} belongs to manifest {owner}, not {ours}: check --lake, --data-prefix and --manifest-template (delete {key} only if the lake really moved to this manifest)",
            layout.schema_prefix(schema_id),
        ))
    })
}

/// [`check`] for a writer about to write into the prefix: another manifest's prefix is an
/// error naming the marker (ours and unclaimed are returned for [`claim`]).
pub(crate) async fn check_writable(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
) -> Result<Ownership> {
    match check(store, layout, schema_id).await? {
        Ownership::Other(why) => Err(Error::Manifest {
            key: layout.owner_key(schema_id),
            message: why,
        }),
        o => Ok(o),
    }
}

/// Fails unless the schema's data prefix is this layout's manifest's, claiming it (a
/// conditional create) when `ownership` says it is unclaimed. Called right before publishing,
/// so a run that fails earlier leaves no claim; a claim lost to another manifest fails.
pub(crate) async fn claim(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    ownership: &Ownership,
) -> Result<()> {
    let key = layout.owner_key(schema_id);
    let refuse = |why: String| Error::Manifest {
        key: key.clone(),
        message: why,
    };
    match ownership {
        Ownership::Ours => return Ok(()),
        Ownership::Other(why) => return Err(refuse(why.clone())),
        Ownership::Unclaimed => {}
    }
    let body = serde_json::to_vec(&Marker {
        manifest: layout.manifest_key_in_lake(schema_id),
    })
    .map_err(Error::json("owner marker"))?;
    match store
        .put_bytes(&key, Bytes::from(body), PutMode::Create)
        .await
    {
        Ok(_) => Ok(()),
        // Claimed meanwhile: fine if by the same manifest.
        Err(StoreError::Conflict) => match check(store, layout, schema_id).await? {
            Ownership::Other(why) => Err(refuse(why)),
            _ => Ok(()),
        },
        Err(source) => Err(Error::Storage {
            op: "claim data prefix",
            key,
            source,
        }),
    }
}

/// Fails when the schema's manifest names another source database than `source`'s
/// ([`SourceGuard::check`]); a missing manifest passes. Returns the manifest read (`None` when
/// there is none): a run's first save may start from it ([`manifest::SaveFrom`]).
pub(crate) async fn check_source(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    source: &SourceGuard,
) -> Result<Option<Loaded>> {
    let key = layout.manifest_key(schema_id);
    let loaded = manifest::load_within(store, &key, schema_id, layout.limits()).await?;
    if let Some(l) = &loaded {
        source.check(&key, l.manifest.source.as_ref())?;
    }
    Ok(loaded)
}

/// How every writer publishes: claims the data prefix when `ownership` says it is unclaimed
/// ([`claim`]), then commits `modify` to the schema's manifest ([`manifest::commit_from`],
/// as `from` says), which must name `source`'s database or none (then it is
/// stamped with it). Every error but [`Error::AmbiguousCommit`] means nothing was saved (a failed claim included), so
/// a caller may then delete what it uploaded for this save.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn claim_and_commit<F>(
    store: &dyn ObjectStore,
    layout: &Layout,
    schema_id: i16,
    schema_name: &str,
    ownership: &Ownership,
    source: &SourceGuard,
    clock: &dyn Clock,
    policy: CommitPolicy,
    from: SaveFrom,
    mut modify: F,
) -> Result<Committed>
where
    F: FnMut(&mut Manifest) -> Result<()>,
{
    claim(store, layout, schema_id, ownership).await?;
    // Every writer's save records the schema's name, so readers name its view from the lake
    // alone (docs/design.md §3.2.1).
    let key = layout.manifest_key(schema_id);
    manifest::commit_from(store, layout, schema_id, clock, policy, from, |m| {
        source.stamp(&key, &mut m.source)?;
        m.schema_name = Some(schema_name.to_string());
        modify(m)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lake::ReadLimits;
    use crate::store::fault::{FaultStore, Op};
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn an_owner_marker_over_the_limit_is_refused_without_being_read() {
        let store = FaultStore::new(Arc::new(MemoryStore::new()));
        let layout = Layout::new("", "data", "manifest/{schema_id}.json").unwrap();
        let key = layout.owner_key(7);
        let padded = format!(r#"{{"manifest": "manifest/7.json"{}}}"#, " ".repeat(200));
        store
            .put_bytes(&key, Bytes::from(padded), PutMode::Overwrite)
            .await
            .unwrap();
        let small = layout.clone().with_limits(ReadLimits {
            owner_marker_bytes: 100,
            ..ReadLimits::default()
        });
        let before = store.calls().len();
        let err = check(&store, &small, 7).await.unwrap_err();
        assert!(
            matches!(&err, Error::TooLarge { what: "owner marker", key: k, limit: 100, .. } if *k == key),
            "{err:?}"
        );
        let ops: Vec<Op> = store.calls()[before..].iter().map(|c| c.op).collect();
        assert_eq!(ops, [Op::GetBytes], "one capped read");
        // Within the default limit the same marker is ours.
        assert_eq!(check(&store, &layout, 7).await.unwrap(), Ownership::Ours);
    }
}

//! Repairs that name a source by id (`gc --repair`, `verify --source --repair`, gc's settling
//! of unlisted deltas): each goes to the schema's `change_log` ([`super::requeue`]) or to the
//! table source's touch log ([`super::table_requeue`]), as the registry says the id is
//! (docs/design.md §9.3, §10).

use tokio_postgres::Client;
use uuid::Uuid;

use super::requeue::{Requeue, Requeued};
use crate::config::Tables;
use crate::error::Result;

/// Requeues `rows` of source `id`, a schema (dirty `change_log` slots, [`super::requeue::requeue`]) or a
/// table source (touches, [`super::table_requeue::requeue`]), as the registry says it is.
pub async fn requeue_source(
    client: &mut Client,
    tables: &Tables,
    id: i16,
    rows: &[Requeue],
    now_ms: i64,
    dry_run: bool,
) -> Result<Requeued> {
    match table_source_of(client, tables, id).await? {
        Some(src) => super::table_requeue::requeue(client, &src, rows, now_ms, dry_run).await,
        None => super::requeue::requeue(client, tables, id, rows, now_ms, dry_run).await,
    }
}

/// The ids among `ids` that the next flush of source `id` exports anyway: a schema's dirty
/// slots, a table source's pending touches.
pub async fn pending_among(
    client: &Client,
    tables: &Tables,
    id: i16,
    ids: &[Uuid],
) -> Result<std::collections::BTreeSet<u128>> {
    match table_source_of(client, tables, id).await? {
        Some(src) => super::table_requeue::pending_among(client, &src, ids).await,
        None => super::versions::dirty_among(client, tables, id, ids).await,
    }
}

/// The ids among `ids` that source `id` holds live right now: a schema's entity rows not
/// soft-deleted, a table source's rows.
pub async fn live_among(
    client: &Client,
    tables: &Tables,
    id: i16,
    ids: &[Uuid],
) -> Result<std::collections::BTreeSet<u128>> {
    match table_source_of(client, tables, id).await? {
        Some(src) => super::table_requeue::live_among(client, &src, ids).await,
        None => super::versions::live_among(client, tables, id, ids).await,
    }
}

/// Table source `id` when `id` names one (ids are shared with the schemas').
async fn table_source_of(
    client: &Client,
    tables: &Tables,
    id: i16,
) -> Result<Option<super::table_source::TableSource>> {
    let sources = super::table_source::list(client, tables).await?;
    if sources.iter().any(|(s, _)| *s == id) {
        Ok(Some(super::table_source::load(client, tables, id).await?))
    } else {
        Ok(None)
    }
}

//! Repairs that name a source by id (`gc --repair`, `verify --source --repair`, gc's settling
//! of unlisted deltas): each goes to the schema's `change_log` ([`super::requeue`]) or to the
//! table source's touch log ([`super::table_requeue`]), as the registry says the id is
//! (docs/design.md §9.3, §10).

use std::collections::BTreeSet;

use tokio_postgres::Client;
use uuid::Uuid;

use super::requeue::{Requeue, Requeued};
use super::table_source::TableSource;
use crate::config::Tables;
use crate::error::Result;

/// A source id resolved once against the registry: a schema or a table source (ids are
/// shared).
pub enum Source {
    /// A schema: its rows live in the entity tables, its queue is `change_log`.
    Schema(i16),
    /// A table source: its rows live in its table, its queue is the touch log.
    Table(Box<TableSource>),
}

impl Source {
    /// What the registry says source `id` is.
    pub async fn of(client: &Client, tables: &Tables, id: i16) -> Result<Self> {
        let sources = super::table_source::list(client, tables).await?;
        Ok(if sources.iter().any(|(s, _)| *s == id) {
            Source::Table(Box::new(
                super::table_source::load(client, tables, id).await?,
            ))
        } else {
            Source::Schema(id)
        })
    }

    /// The ids among `ids` that the next flush exports anyway: a schema's dirty slots, a
    /// table source's pending touches.
    pub async fn pending_among(
        &self,
        client: &Client,
        tables: &Tables,
        ids: &[Uuid],
    ) -> Result<BTreeSet<u128>> {
        match self {
            Source::Table(src) => super::table_requeue::pending_among(client, src, ids).await,
            Source::Schema(id) => super::versions::dirty_among(client, tables, *id, ids).await,
        }
    }

    /// The ids among `ids` the source holds live right now: a schema's entity rows not
    /// soft-deleted, a table source's rows.
    pub async fn live_among(
        &self,
        client: &Client,
        tables: &Tables,
        ids: &[Uuid],
    ) -> Result<BTreeSet<u128>> {
        match self {
            Source::Table(src) => super::table_requeue::live_among(client, src, ids).await,
            Source::Schema(id) => super::versions::live_among(client, tables, *id, ids).await,
        }
    }
}

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
    match Source::of(client, tables, id).await? {
        Source::Table(src) => {
            super::table_requeue::requeue(client, &src, rows, now_ms, dry_run).await
        }
        Source::Schema(id) => {
            super::requeue::requeue(client, tables, id, rows, now_ms, dry_run).await
        }
    }
}

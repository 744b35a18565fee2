//! Exporting a table source (docs/design.md §9.2): its record in `lakecdc_sources` with the
//! table's current shape, whether it may be exported (not truncated since its last `init`, no
//! column type changed), its dirty slots in `lakecdc_touch`, one flush batch — the oldest dirty
//! slots after a keyset cursor and each live slot's row, read by the primary key in the SAME
//! statement (one snapshot) — the exact-version mark, and init's read of every row in one
//! snapshot through a cursor.

use std::time::Duration;

use arrow::record_batch::RecordBatch;
use tokio_postgres::Client;
use uuid::Uuid;

use super::attach::{describe, qualified_tables};
use super::capture::{KeyColumn, RowIdRule, SourceColumn, row_id_expr};
use super::connect::timed;
use super::snapshot::{Selected, Tid};
use super::stats::DirtyStats;
use super::table_rows::{RowsBuilder, select_expr};
use crate::config::{TableName, Tables, quote_ident as ident};
use crate::error::{Error, Result};

const TIMEOUT: Duration = Duration::from_secs(300);

/// A table source as the jobs export it.
#[derive(Debug, Clone)]
pub struct TableSource {
    /// Its id (shared with the schemas' ids).
    pub id: i16,
    /// Its name (`--schema NAME`).
    pub name: String,
    /// The table, schema-qualified.
    pub table: TableName,
    /// Its primary key, as attached.
    pub key: Vec<KeyColumn>,
    /// The columns exported now: the table's current columns but the excluded ones.
    pub columns: Vec<SourceColumn>,
    /// The columns as last recorded (by attach, a flush that saw new ones, or init): name and
    /// lake type.
    recorded: Vec<(String, String)>,
    /// Set by the truncate trigger: the lake no longer follows the table until `init`.
    pub needs_init_at: Option<i64>,
    sources: TableName,
    touch_log: TableName,
}

/// The registered table sources: `(id, name)`, by id; none when no table was ever attached.
pub async fn list(client: &Client, tables: &Tables) -> Result<Vec<(i16, String)>> {
    let (sources, _) = qualified_tables(client, tables).await?;
    let sql = format!(
        "SELECT source_id, name FROM {} ORDER BY source_id",
        sources.quoted()
    );
    // The table may not exist: asked first, so the statement is not planned against it.
    let present: bool = timed(
        TIMEOUT,
        "check lakecdc_sources",
        client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&sources.quoted()]),
    )
    .await?
    .get(0);
    if !present {
        return Ok(Vec::new());
    }
    let rows = timed(TIMEOUT, "read lakecdc_sources", client.query(&sql, &[])).await?;
    rows.iter()
        .map(|r| {
            let column = |c: &'static str| Error::postgres(format!("read lakecdc_sources: {c}"));
            let id: i16 = r.try_get(0).map_err(column("source_id"))?;
            let name: String = r.try_get(1).map_err(column("name"))?;
            crate::config::check_schema_name(&name).map_err(|e| {
                Error::decode(
                    "read lakecdc_sources",
                    format!("source_id {id}: {e}; rename it there"),
                )
            })?;
            Ok((id, name))
        })
        .collect()
}

/// Source `id` with its table's current shape. The table must still exist and keep the key
/// it was attached with.
pub async fn load(client: &Client, tables: &Tables, id: i16) -> Result<TableSource> {
    let (sources, touch_log) = qualified_tables(client, tables).await?;
    let sql = format!(
        "SELECT name, table_schema, table_name, key_columns, excluded_columns, columns::text, needs_init_at \
         FROM {} WHERE source_id = $1",
        sources.quoted()
    );
    let row = timed(
        TIMEOUT,
        "read lakecdc_sources",
        client.query_opt(&sql, &[&id]),
    )
    .await?
    .ok_or_else(|| Error::config(format!("table source {id} is not in {}", sources.quoted())))?;
    let column = |c: &'static str| Error::postgres(format!("read lakecdc_sources: {c}"));
    let name: String = row.try_get(0).map_err(column("name"))?;
    let schema: String = row.try_get(1).map_err(column("table_schema"))?;
    let table: String = row.try_get(2).map_err(column("table_name"))?;
    let key_names: Vec<String> = row.try_get(3).map_err(column("key_columns"))?;
    let excluded: Vec<String> = row.try_get(4).map_err(column("excluded_columns"))?;
    let recorded: String = row.try_get(5).map_err(column("columns"))?;
    let needs_init_at: Option<i64> = row.try_get(6).map_err(column("needs_init_at"))?;
    let table = TableName::parse("table", &format!("{schema}.{table}")).map_err(|_| {
        Error::decode(
            "read lakecdc_sources",
            format!("source {name}: {schema}.{table} is not a table name lakecdc attaches"),
        )
    })?;
    let shape = describe(client, &table).await?;
    let shown: Vec<&str> = shape.key.iter().map(|k| k.name.as_str()).collect();
    if shown != key_names {
        return Err(Error::config(format!(
            "source {name}: the primary key of {} is now ({}), it was attached with ({}): its row ids would change; attach the table under another --name",
            table.quoted(),
            shown.join(", "),
            key_names.join(", ")
        )));
    }
    let recorded: Vec<serde_json::Value> = serde_json::from_str(&recorded)
        .map_err(|e| Error::decode("read lakecdc_sources: columns", e.to_string()))?;
    let recorded = recorded
        .iter()
        .filter_map(|c| {
            Some((
                c.get("name")?.as_str()?.to_string(),
                c.get("lake_type")?.as_str()?.to_string(),
            ))
        })
        .collect();
    let columns: Vec<SourceColumn> = shape
        .columns
        .into_iter()
        .filter(|c| !excluded.contains(&c.name))
        .collect();
    super::attach::check_lake_names(&table, &columns)?;
    Ok(TableSource {
        id,
        name,
        table,
        key: shape.key,
        columns,
        recorded,
        needs_init_at,
        sources,
        touch_log,
    })
}

impl TableSource {
    /// Columns whose lake type differs from the recorded one: `name: was → now`.
    pub fn type_changes(&self) -> Vec<String> {
        self.columns
            .iter()
            .filter_map(|c| {
                let (_, was) = self.recorded.iter().find(|(n, _)| *n == c.name)?;
                (*was != c.lake_type).then(|| format!("{}: {was} → {}", c.name, c.lake_type))
            })
            .collect()
    }

    /// Whether a column appeared since the columns were recorded.
    pub fn has_new_columns(&self) -> bool {
        self.columns
            .iter()
            .any(|c| !self.recorded.iter().any(|(n, _)| *n == c.name))
    }

    /// Refuses a flush of a source the lake no longer follows: truncated since its last init,
    /// or a column whose type changed (old and new files would disagree).
    pub fn check_flushable(&self) -> Result<()> {
        if self.needs_init_at.is_some() {
            return Err(Error::config(format!(
                "{} was truncated (a TRUNCATE records no row): the lake no longer follows it; run lakecdc init --schema {} --replace-delta to rebuild it",
                self.table.quoted(),
                self.name
            )));
        }
        let changed = self.type_changes();
        if !changed.is_empty() {
            return Err(Error::config(format!(
                "{}: column type changed ({}); run lakecdc init --schema {} --replace-delta to rewrite the lake with the new types",
                self.table.quoted(),
                changed.join(", "),
                self.name
            )));
        }
        Ok(())
    }

    /// The condition joining the touch-log slot `t` to its row `s` by the primary key: the
    /// uuid key is the `row_id`, an integer key is read back from it, any other key from the
    /// slot's stored key (docs/design.md §9.1).
    fn key_match(&self) -> String {
        match (RowIdRule::of(&self.key), self.key.as_slice()) {
            (RowIdRule::Key, [only]) => format!("s.{} = t.row_id", ident(&only.name)),
            (RowIdRule::Integer, [only]) => format!(
                "s.{} = (('x' || substr(replace(t.row_id::text, '-', ''), 17))::bit(64)::int8 # (-9223372036854775807 - 1))",
                ident(&only.name)
            ),
            (_, key) => {
                let (cols, vals): (Vec<String>, Vec<String>) = key
                    .iter()
                    .map(|k| {
                        let ty = match k.type_name.as_str() {
                            // Without a length: `character` alone is char(1).
                            "character" => "bpchar",
                            "character varying" => "varchar",
                            t => t,
                        };
                        (
                            format!("s.{}", ident(&k.name)),
                            format!("(t.key ->> '{}')::{ty}", crate::config::sql_string(&k.name)),
                        )
                    })
                    .unzip();
                format!("({}) = ({})", cols.join(", "), vals.join(", "))
            }
        }
    }

    fn payload(&self) -> String {
        self.columns
            .iter()
            .map(|c| select_expr(c, "s"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One batch: the oldest `$n` dirty slots after the cursor `($2, $3)` (none on the first
    /// batch), each live one joined to its row, in `row_id` order. The dirty index holds
    /// `(source_id, changed_at, row_id)`, so the cursor and the order are read from it: a batch
    /// costs its own slots, even when a bulk statement gave a million slots one version.
    fn batch_sql(&self, first: bool) -> String {
        let (cursor, limit) = if first {
            ("", "$2")
        } else {
            (" AND (changed_at, row_id) > ($2, $3)", "$4")
        };
        format!(
            "SELECT t.row_id, t.changed_at, COALESCE(t.deleted_at, 0), s.{k} IS NULL, {payload} \
             FROM (SELECT row_id, changed_at, deleted_at, key FROM {touch} \
                   WHERE source_id = $1 AND flushed_at = 0{cursor} \
                   ORDER BY changed_at, row_id LIMIT {limit}) t \
             LEFT JOIN {table} s ON t.deleted_at IS NULL AND {on} \
             ORDER BY t.row_id",
            k = ident(&self.key[0].name),
            payload = self.payload(),
            touch = self.touch_log.quoted(),
            table = self.table.quoted(),
            on = self.key_match(),
        )
    }

    /// Every row of the table (`s`): its `row_id`, its latest recorded version (0 when none
    /// was ever recorded: the row predates the capture), then `rest`, in `row_id` order (the
    /// key's own order for a uuid or integer key).
    fn versions_sql(&self, rest: &str) -> String {
        let row_id = row_id_expr(self.id, &self.key, "s");
        let order = match RowIdRule::of(&self.key) {
            RowIdRule::Key | RowIdRule::Integer => format!("s.{}", ident(&self.key[0].name)),
            RowIdRule::Hashed => "1".to_string(),
        };
        format!(
            "SELECT {row_id}, COALESCE((SELECT max(p.changed_at) FROM {touch} p \
                                        WHERE p.source_id = {id} AND p.row_id = {row_id}), 0){rest} \
             FROM {table} s ORDER BY {order}",
            touch = self.touch_log.quoted(),
            id = self.id,
            table = self.table.quoted(),
        )
    }

    /// Init's rows: [`Self::versions_sql`] with the payload, as a batch reads it.
    fn init_sql(&self) -> String {
        self.versions_sql(&format!(", 0::int8, false, {}", self.payload()))
    }
}

/// The table sources flush has work on: a dirty slot, or a truncate mark (flush must say the
/// lake no longer follows the table, even with nothing dirty: a `TRUNCATE` records no slot).
pub async fn dirty_sources(client: &Client, tables: &Tables) -> Result<Vec<i16>> {
    let mut out = Vec::new();
    let (sources, touch_log) = qualified_tables(client, tables).await?;
    for (id, _) in list(client, tables).await? {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE source_id = $1 AND flushed_at = 0) \
                 OR EXISTS (SELECT 1 FROM {} WHERE source_id = $1 AND needs_init_at IS NOT NULL)",
            touch_log.quoted(),
            sources.quoted()
        );
        let dirty: bool = timed(
            TIMEOUT,
            "probe lakecdc_touch",
            client.query_one(&sql, &[&id]),
        )
        .await?
        .get(0);
        if dirty {
            out.push(id);
        }
    }
    Ok(out)
}

/// A batch of no row of the source's columns (the zero-row base of an empty table).
pub fn empty_rows(src: &TableSource) -> Result<RecordBatch> {
    RowsBuilder::new(src.id, &src.columns, 0).finish()
}

/// The first and last `row_id` of lake rows in `row_id` order (`None` when there is none).
pub fn row_id_range(batches: &[RecordBatch]) -> Result<Option<(Uuid, Uuid)>> {
    let id = |b: &RecordBatch, i: usize| -> Result<Uuid> {
        let ids = b
            .column(1)
            .as_any()
            .downcast_ref::<arrow::array::FixedSizeBinaryArray>()
            .ok_or_else(|| Error::Invariant("row_id is not a 16-byte column".into()))?;
        Uuid::from_slice(ids.value(i)).map_err(|e| Error::Invariant(format!("row_id: {e}")))
    };
    let mut nonempty = batches.iter().filter(|b| b.num_rows() > 0);
    let Some(first) = nonempty.next() else {
        return Ok(None);
    };
    let last = nonempty.next_back().unwrap_or(first);
    Ok(Some((id(first, 0)?, id(last, last.num_rows() - 1)?)))
}

/// The source's dirty slots: how many, and the oldest version.
pub async fn dirty(client: &Client, src: &TableSource) -> Result<DirtyStats> {
    touch_stats(client, &src.touch_log, src.id).await
}

async fn touch_stats(client: &Client, touch_log: &TableName, id: i16) -> Result<DirtyStats> {
    let sql = format!(
        "SELECT COUNT(*), COALESCE(MIN(changed_at), 0) FROM {} WHERE source_id = $1 AND flushed_at = 0",
        touch_log.quoted()
    );
    let row = timed(
        TIMEOUT,
        "read lakecdc_touch stats",
        client.query_one(&sql, &[&id]),
    )
    .await?;
    Ok(DirtyStats {
        count: row.get(0),
        oldest_changed_at: row.get(1),
    })
}

/// The dirty slots of id `id`, a schema's (`change_log`) or a table source's
/// (`lakecdc_touch`), for the reports that show every source alike (inspect, metrics).
pub async fn dirty_of_id(client: &Client, tables: &Tables, id: i16) -> Result<DirtyStats> {
    if !list(client, tables).await?.iter().any(|(i, _)| *i == id) {
        return super::stats::dirty(client, &tables.change_log, id).await;
    }
    let (_, touch_log) = qualified_tables(client, tables).await?;
    touch_stats(client, &touch_log, id).await
}

/// Where the next batch starts: after this slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    changed_at: i64,
    row_id: Uuid,
}

/// One batch of a table source.
#[derive(Debug)]
pub struct Batch {
    /// The lake rows, in `row_id` order (empty when no slot was dirty).
    pub rows: RecordBatch,
    /// The version exported per row, for the mark.
    pub versions: Vec<Selected>,
    /// Live slots whose row the table no longer holds (a `TRUNCATE`, writes while detached):
    /// exported as tombstones, since that is the table's state.
    pub gone: u64,
    /// Where the next batch starts.
    pub next: Option<Cursor>,
}

/// Reads the next batch of at most `limit` slots after `after`: slots and rows in one
/// statement, hence one snapshot.
pub async fn read_batch(
    client: &Client,
    src: &TableSource,
    after: Option<Cursor>,
    limit: i64,
) -> Result<Batch> {
    let sql = src.batch_sql(after.is_none());
    let rows = match after {
        None => {
            timed(
                TIMEOUT,
                "read a table batch",
                client.query(&sql, &[&src.id, &limit]),
            )
            .await?
        }
        Some(c) => {
            timed(
                TIMEOUT,
                "read a table batch",
                client.query(&sql, &[&src.id, &c.changed_at, &c.row_id, &limit]),
            )
            .await?
        }
    };
    let mut builder = RowsBuilder::new(src.id, &src.columns, rows.len());
    let mut versions = Vec::with_capacity(rows.len());
    let (mut gone, mut next) = (0, after);
    for r in &rows {
        let column = |c: &'static str| Error::postgres(format!("read a table batch: {c}"));
        let row_id: Uuid = r.try_get(0).map_err(column("row_id"))?;
        let changed_at: i64 = r.try_get(1).map_err(column("changed_at"))?;
        let mut deleted_at: i64 = r.try_get(2).map_err(column("deleted_at"))?;
        let absent: bool = r.try_get(3).map_err(column("row"))?;
        if deleted_at == 0 && absent {
            gone += 1;
            deleted_at = changed_at;
        }
        builder.push(row_id, changed_at, deleted_at, r, 4)?;
        versions.push(Selected {
            row_id,
            changed_at,
            tid: Tid::default(),
        });
        let here = Cursor { changed_at, row_id };
        if next.is_none_or(|n| (n.changed_at, n.row_id) < (changed_at, row_id)) {
            next = Some(here);
        }
    }
    Ok(Batch {
        rows: builder.finish()?,
        versions,
        gone,
        next,
    })
}

/// The mark: `flushed_at = T` on each exported slot whose version is still the one exported,
/// in `row_id` order (the order the capture upserts in, so the two never deadlock).
pub async fn mark(
    client: &Client,
    src: &TableSource,
    flushed_at: i64,
    versions: &[Selected],
) -> Result<u64> {
    let mut sorted: Vec<&Selected> = versions.iter().collect();
    sorted.sort_by_key(|v| v.row_id);
    let ids: Vec<Uuid> = sorted.iter().map(|v| v.row_id).collect();
    let at: Vec<i64> = sorted.iter().map(|v| v.changed_at).collect();
    let sql = format!(
        "UPDATE {} AS t SET flushed_at = $2 \
         FROM unnest($3::uuid[], $4::int8[]) WITH ORDINALITY AS u(row_id, changed_at, n) \
         WHERE t.source_id = $1 AND t.flushed_at = 0 AND t.row_id = u.row_id AND t.changed_at = u.changed_at",
        src.touch_log.quoted()
    );
    timed(
        TIMEOUT,
        "mark lakecdc_touch",
        client.execute(&sql, &[&src.id, &flushed_at, &ids, &at]),
    )
    .await
}

/// Records the exported columns (a flush that sees a new column, an init) and, for an init,
/// clears `needs_init_at` if it is still what the init's snapshot read (a `TRUNCATE` since
/// keeps it).
pub async fn record(
    client: &Client,
    src: &TableSource,
    clear_needs_init: Option<Option<i64>>,
) -> Result<()> {
    let columns = super::capture::columns_json(&src.columns).to_string();
    let sql = match clear_needs_init {
        None => format!(
            "UPDATE {} SET columns = $2::text::jsonb WHERE source_id = $1",
            src.sources.quoted()
        ),
        Some(_) => format!(
            "UPDATE {} SET columns = $2::text::jsonb, \
                 needs_init_at = CASE WHEN needs_init_at IS NOT DISTINCT FROM $3 THEN NULL ELSE needs_init_at END \
             WHERE source_id = $1",
            src.sources.quoted()
        ),
    };
    let done = match clear_needs_init {
        None => client.execute(&sql, &[&src.id, &columns]).await,
        Some(seen) => client.execute(&sql, &[&src.id, &columns, &seen]).await,
    };
    done.map_err(Error::postgres("record a table source's columns"))?;
    Ok(())
}

/// Init's read of a table source: every row in ONE snapshot, a page at a time through a
/// cursor (bounded memory whatever the table's size).
pub struct InitRead<'a> {
    client: &'a Client,
    src: &'a TableSource,
    /// `needs_init_at` as the snapshot saw it.
    pub needs_init_at: Option<i64>,
    /// Rows in the table when the snapshot was taken (for progress and the dry run).
    pub rows: i64,
}

impl<'a> InitRead<'a> {
    /// Opens the snapshot and the cursor.
    pub async fn open(client: &'a Client, src: &'a TableSource) -> Result<Self> {
        timed(
            TIMEOUT,
            "begin init read",
            client.batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL idle_in_transaction_session_timeout = 0",
            ),
        )
        .await?;
        let seen = format!(
            "SELECT needs_init_at, (SELECT count(*) FROM {}) FROM {} WHERE source_id = $1",
            src.table.quoted(),
            src.sources.quoted()
        );
        let row = timed(
            TIMEOUT,
            "read the source in the snapshot",
            client.query_one(&seen, &[&src.id]),
        )
        .await?;
        let declare = format!(
            "DECLARE lakecdc_init NO SCROLL CURSOR FOR {}",
            src.init_sql()
        );
        timed(
            TIMEOUT,
            "open the init cursor",
            client.batch_execute(&declare),
        )
        .await?;
        Ok(Self {
            client,
            src,
            needs_init_at: row.get(0),
            rows: row.get(1),
        })
    }

    /// The next page of at most `rows` rows (empty at the end).
    pub async fn page(&self, rows: usize) -> Result<RecordBatch> {
        let fetched = timed(
            TIMEOUT,
            "read an init page",
            self.client
                .query(&format!("FETCH FORWARD {rows} FROM lakecdc_init"), &[]),
        )
        .await?;
        let mut builder = RowsBuilder::new(self.src.id, &self.src.columns, fetched.len());
        for r in &fetched {
            let column = |c: &'static str| Error::postgres(format!("read an init page: {c}"));
            let row_id: Uuid = r.try_get(0).map_err(column("row_id"))?;
            let changed_at: i64 = r.try_get(1).map_err(column("changed_at"))?;
            builder.push(row_id, changed_at, 0, r, 4)?;
        }
        builder.finish()
    }

    /// Ends the snapshot.
    pub async fn close(self) -> Result<()> {
        timed(
            TIMEOUT,
            "end init read",
            self.client.batch_execute("COMMIT"),
        )
        .await
    }
}

/// `verify --source`'s read of a table source: in ONE snapshot, the dirty row ids, then every
/// row's `(row_id, latest recorded version)` in `row_id` order, a page at a time.
pub struct VersionRead<'a> {
    client: &'a Client,
}

impl<'a> VersionRead<'a> {
    /// Opens the snapshot, reads the dirty ids (sorted) and opens the cursor.
    pub async fn open(client: &'a Client, src: &TableSource) -> Result<(Self, Vec<u128>)> {
        timed(
            TIMEOUT,
            "begin version read",
            client.batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL idle_in_transaction_session_timeout = 0",
            ),
        )
        .await?;
        let sql = format!(
            "SELECT row_id FROM {} WHERE source_id = $1 AND flushed_at = 0 ORDER BY row_id",
            src.touch_log.quoted()
        );
        let dirty = timed(
            TIMEOUT,
            "read dirty row ids",
            client.query(&sql, &[&src.id]),
        )
        .await?
        .iter()
        .map(|r| r.try_get::<_, Uuid>(0).map(|u| u.as_u128()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::postgres("read dirty row ids"))?;
        let declare = format!(
            "DECLARE lakecdc_versions NO SCROLL CURSOR FOR {}",
            src.versions_sql("")
        );
        timed(
            TIMEOUT,
            "open the version cursor",
            client.batch_execute(&declare),
        )
        .await?;
        Ok((Self { client }, dirty))
    }

    /// The next page of at most `rows` `(row_id, version)` (empty at the end).
    pub async fn page(&self, rows: usize) -> Result<Vec<(u128, i64)>> {
        let fetched = timed(
            TIMEOUT,
            "read a version page",
            self.client
                .query(&format!("FETCH FORWARD {rows} FROM lakecdc_versions"), &[]),
        )
        .await?;
        fetched
            .iter()
            .map(|r| Ok((r.try_get::<_, Uuid>(0)?.as_u128(), r.try_get::<_, i64>(1)?)))
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(Error::postgres("read a version page"))
    }

    /// Ends the snapshot.
    pub async fn close(self) -> Result<()> {
        timed(
            TIMEOUT,
            "end version read",
            self.client.batch_execute("COMMIT"),
        )
        .await
    }
}

//! Exporting a table source (docs/design.md §9.2): its record in `lakecdc_sources` with the
//! table's current shape, whether it may be exported (not truncated since its last `init`, no
//! column type changed), its pending touches in `lakecdc_touch`, flush's read — the touches
//! folded per row and each live row read by the primary key in the SAME statement, one
//! snapshot, through a cursor — the versions it hands out (never below the source's floor,
//! which is raised before anything is published), the mark that deletes exactly the touches
//! read, and init's read of every row in one snapshot.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use futures::TryStreamExt;
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::attach::{describe, installed_function_matches, qualified_tables};
use super::capture::{
    Capture, HashedRowId, INTEGER_KEYS, KeyColumn, RowIdRule, SourceColumn, integer_key,
    integer_row_id, key_text_expr, row_id_expr,
};
use super::connect::{timed, within};
use super::copy_decoder::{CopyDecoder, CopyItem, EachTuple, copy_tuple};
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
    /// The key columns' PostgreSQL types (with modifiers) as last recorded: a hashed row id
    /// is the key's text, which a type change can change (`char(5)` → `text` drops the
    /// padding) while the lake type stays.
    recorded_key_types: Vec<(String, String)>,
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
        "SELECT name, table_schema, table_name, key_columns, excluded_columns, columns::text, needs_init_at, \
                (to_jsonb(s) -> 'excluded_attnums')::text \
         FROM {} s WHERE source_id = $1",
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
    let excluded_attnums = super::attach::parse_excluded_attnums(
        row.try_get::<_, Option<String>>(7)
            .map_err(column("excluded_attnums"))?
            .as_deref(),
    )?
    .unwrap_or_default();
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
    super::attach::check_capture_tables(client, &sources, &touch_log, false).await?;
    // The capture must still give the row ids this build reads back for the current key: a
    // key whose type changed since attach (a domain, integer → numeric) changes the rule, and
    // touches written by the old rule would match no row (docs/hazards.md L73).
    let capture = Capture {
        source_id: id,
        name: name.clone(),
        table: table.clone(),
        key: shape.key.clone(),
        excluded: Vec::new(),
        excluded_attnums: Vec::new(),
        columns: Vec::new(),
        sources: sources.clone(),
        touch_log: touch_log.clone(),
    };
    // Every write must be recorded: a capture partly gone (its table dropped and made again,
    // a trigger dropped or disabled) let writes through unrecorded, and flush would say
    // nothing is pending (docs/hazards.md L86). A detached source has nothing installed.
    let parts = super::attach::capture_parts(client, &capture).await?;
    if !parts.absent() && !parts.recording() {
        return Err(Error::config(format!(
            "source {name}: {} of the {} capture triggers of {} are missing or disabled, so writes to it went unrecorded: run lakecdc attach {} again, then lakecdc init --schema {name} --replace-delta",
            Capture::TRIGGERS - parts.enabled,
            Capture::TRIGGERS,
            table.quoted(),
            table.quoted()
        )));
    }
    if installed_function_matches(client, &capture).await? == Some(false) {
        let rule = super::attach::recorded_rule(&recorded, &key_names);
        return Err(Error::config(format!(
            "source {name}: the capture installed on {} is not the one this lakecdc writes for its current key ({}, row ids {}{}): run lakecdc attach {} again, which refuses if the lake's row ids would change",
            table.quoted(),
            shape
                .key
                .iter()
                .map(|k| format!("{} {}", k.name, k.type_name))
                .collect::<Vec<_>>()
                .join(", "),
            RowIdRule::of(&shape.key).as_str(),
            rule.map(|r| format!(", attached with row ids {}", r.as_str()))
                .unwrap_or_default(),
            table.quoted()
        )));
    }
    let field = |c: &serde_json::Value, f: &str| Some(c.get(f)?.as_str()?.to_string());
    let recorded_key_types = recorded
        .iter()
        .filter_map(|c| Some((field(c, "name")?, field(c, "pg_type")?)))
        .filter(|(n, _)| key_names.contains(n))
        .collect();
    let recorded = recorded
        .iter()
        .filter_map(|c| Some((field(c, "name")?, field(c, "lake_type")?)))
        .collect();
    // Excluded by name, and by attnum once recorded: a renamed excluded column stays out
    // (docs/hazards.md L77).
    let columns: Vec<SourceColumn> = shape
        .columns
        .into_iter()
        .zip(shape.attnums)
        .filter(|(c, n)| !excluded.contains(&c.name) && !excluded_attnums.contains(n))
        .map(|(c, _)| c)
        .collect();
    super::attach::check_lake_names(&table, &columns)?;
    Ok(TableSource {
        id,
        name,
        table,
        key: shape.key,
        columns,
        recorded,
        recorded_key_types,
        needs_init_at,
        sources,
        touch_log,
    })
}

impl TableSource {
    /// The touch log (`lakecdc_touch`) the source's capture appends to.
    pub(crate) fn touch_log(&self) -> &TableName {
        &self.touch_log
    }

    /// Columns whose lake type differs from the recorded one, and key columns whose
    /// PostgreSQL type does (their text, so the row ids, may differ): `name: was → now`.
    pub fn type_changes(&self) -> Vec<String> {
        self.columns
            .iter()
            .filter_map(|c| {
                if let Some((_, was)) = self.recorded_key_types.iter().find(|(n, _)| *n == c.name)
                    && *was != c.pg_type
                {
                    return Some(format!("{} (a key column): {was} → {}", c.name, c.pg_type));
                }
                let (_, was) = self.recorded.iter().find(|(n, _)| *n == c.name)?;
                (*was != c.lake_type).then(|| format!("{}: {was} → {}", c.name, c.lake_type))
            })
            .collect()
    }

    /// Why columns that appeared since the columns were recorded cannot simply start in new
    /// files: one added with a default or as generated filled every row without a touch, and
    /// one appearing while a recorded one is gone may be that one renamed (the lake holds
    /// its values under the old name). `None`: only plain nullable columns were added, which
    /// every untouched row holds as NULL, as the lake reads them (docs/hazards.md L88).
    fn unfollowed_columns(&self) -> Option<String> {
        let recorded = |name: &str| self.recorded.iter().any(|(n, _)| n == name);
        let new: Vec<&SourceColumn> = self.columns.iter().filter(|c| !recorded(&c.name)).collect();
        if let Some(c) = new.iter().find(|c| c.filled) {
            return Some(format!(
                "column {} was added with a default or as generated",
                c.name
            ));
        }
        let gone: Vec<&str> = self
            .recorded
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !self.columns.iter().any(|c| c.name == *n))
            .collect();
        match (new.first(), gone.first()) {
            (Some(c), Some(g)) => Some(format!(
                "column {} appeared while column {g} is gone (renamed?)",
                c.name
            )),
            _ => None,
        }
    }

    /// Whether a column appeared since the columns were recorded.
    pub fn has_new_columns(&self) -> bool {
        self.columns
            .iter()
            .any(|c| !self.recorded.iter().any(|(n, _)| *n == c.name))
    }

    /// The refusal of a source whose lake needs an init: attached holding rows and not
    /// initialised yet, truncated since its last init, or attached again after writes went
    /// unrecorded.
    pub fn refuse_truncated(&self) -> Result<()> {
        Err(Error::config(format!(
            "the lake does not follow {}: it was attached holding rows no init has exported yet, truncated (a TRUNCATE records no row), or attached again after writes went unrecorded; run lakecdc init --schema {} --replace-delta to build it from the table",
            self.table.quoted(),
            self.name
        )))
    }

    /// Refuses a flush of a source the lake no longer follows: truncated since its last init,
    /// or a column whose type changed (old and new files would disagree).
    pub fn check_flushable(&self) -> Result<()> {
        if self.needs_init_at.is_some() {
            return self.refuse_truncated();
        }
        if let Some(why) = self.unfollowed_columns() {
            return Err(Error::config(format!(
                "{}: {why}, so rows no write touched hold values the lake lacks; run lakecdc init --schema {} --replace-delta to rewrite the lake from the table",
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

    /// The condition joining the asked row `t` to its table row `s` by the primary key: the
    /// uuid key is the `row_id`, an integer key is read back from it, any other key from the
    /// key stored with its touch `k` (docs/design.md §9.1).
    fn key_match(&self) -> String {
        match (RowIdRule::of(&self.key), self.key.as_slice()) {
            (RowIdRule::Key, [only]) => format!("s.{} = t.row_id", ident(&only.name)),
            // The key, read back from the row id by the export (no text functions per row).
            (RowIdRule::Integer, [only]) => format!("s.{} = t.k", ident(&only.name)),
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
                            format!("(k.key ->> '{}')::{ty}", crate::config::sql_string(&k.name)),
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

    /// Flush's first read: the source's touches, as stored (no sort, no aggregate: the export
    /// folds them per row itself), with their addresses for the mark and, for a hashed key,
    /// the lookup of its stored key ([`Self::payload_sql`]).
    fn touches_sql(&self) -> String {
        format!(
            "SELECT row_id, touched_at, deleted, ctid, key IS NOT NULL FROM {} WHERE source_id = {}",
            self.touch_log.quoted(),
            self.id
        )
    }

    /// Flush's payload read of a batch: the rows of the given row ids (`$1`; `$2`: an integer
    /// key's keys, or a hashed key's touch addresses) that the table holds, each looked up
    /// through the primary key (the uuid key is the `row_id`; an integer key is read back from
    /// it; any other key from the JSON stored with the touch at `$2`, in the snapshot, and the
    /// row's key must have the touch's text:
    /// [`Self::same_key_text`]), in the order asked (PostgreSQL knows a function
    /// scan's ordinality order: no sort). `ONLY`: an inheritance child's rows are not the
    /// table's.
    fn payload_sql(&self) -> String {
        let (ids, on) = match RowIdRule::of(&self.key) {
            RowIdRule::Key => (
                "unnest($1::uuid[]) WITH ORDINALITY AS t(row_id, n)".to_string(),
                self.key_match(),
            ),
            RowIdRule::Integer => (
                "unnest($1::uuid[], $2::int8[]) WITH ORDINALITY AS t(row_id, k, n)".to_string(),
                self.key_match(),
            ),
            // The key stored with one of the row's touches, read at the touch's address in
            // the snapshot (a TID scan): no key is sent to lakecdc and back.
            RowIdRule::Hashed => (
                format!(
                    "unnest($1::uuid[], $2::tid[]) WITH ORDINALITY AS t(row_id, at, n) \
                     JOIN {log} k ON k.ctid = t.at AND k.row_id = t.row_id",
                    log = self.touch_log.quoted()
                ),
                format!("{}{}", self.key_match(), self.same_key_text()),
            ),
        };
        format!(
            "SELECT t.row_id, {payload} FROM {ids} JOIN ONLY {table} s ON {on} ORDER BY t.n",
            payload = self.payload(),
            table = self.table.quoted(),
        )
    }

    /// Flush's scan of a hashed key's table for a dense backlog ([`Scan`]): every row's key
    /// text (what its `row_id` hashes) and payload, in heap order — one sequential read
    /// instead of a key lookup per touched row (docs/design.md §9.2).
    fn scan_sql(&self) -> String {
        format!(
            "COPY (SELECT {}, {} FROM ONLY {} s) TO STDOUT (FORMAT binary)",
            key_text_expr(&self.key, "s"),
            self.payload(),
            self.table.quoted()
        )
    }

    /// Flush's scan of a hashed key's table for one pass over a sparse backlog ([`Scan`]): like
    /// [`Self::scan_sql`], but only the rows whose key a touch with a `row_id` in `lo..=hi`
    /// recorded — a hash semi-join of the table against the touch log's keys, in the read's
    /// snapshot — so PostgreSQL reads the table once and sends the pass's rows only
    /// (docs/design.md §9.2). A superset at most: lakecdc still matches every row it receives
    /// to the backlog by its `row_id`.
    fn touched_scan_sql(&self, lo: Uuid, hi: Uuid) -> String {
        format!(
            "COPY (SELECT {}, {} FROM ONLY {} s WHERE EXISTS (SELECT FROM {} k \
             WHERE k.source_id = {} AND k.row_id BETWEEN '{lo}' AND '{hi}' AND {})) \
             TO STDOUT (FORMAT binary)",
            key_text_expr(&self.key, "s"),
            self.payload(),
            self.table.quoted(),
            self.touch_log.quoted(),
            self.id,
            self.key_match(),
        )
    }

    /// The condition, after the key lookup, that the row's key has the very text the touch
    /// recorded (so its `row_id` is the touch's): equal numerics may differ in scale, equal
    /// texts under a nondeterministic collation in bytes. Compared field by field, byte for
    /// byte, where the field's text says it all (a `numeric`, a `text`, a `varchar`); a key
    /// with any other such field is checked through its `row_id` (an `md5` per row);
    /// integers, uuids and booleans equal only with equal texts.
    fn same_key_text(&self) -> String {
        let mut out = String::new();
        for k in &self.key {
            let (col, val) = (
                format!("s.{}", ident(&k.name)),
                format!("(k.key ->> '{}')", crate::config::sql_string(&k.name)),
            );
            match k.type_name.as_str() {
                t if INTEGER_KEYS.contains(&t) || t == "uuid" || t == "boolean" => {}
                "numeric" => out.push_str(&format!(" AND {col}::text = {val}")),
                "text" | "character varying" => {
                    out.push_str(&format!(" AND {col} COLLATE \"C\" = {val} COLLATE \"C\""))
                }
                _ => {
                    return format!(" AND {} = t.row_id", row_id_expr(self.id, &self.key, "s"));
                }
            }
        }
        out
    }

    /// Flush's read of a dense batch: the rows whose key lies between `$1` and `$2` — the
    /// batch's first and last — in key order, the key first (a uuid key is its `row_id`; an
    /// integer one, as `int8`, gives it): one index range scan instead of a lookup per row.
    /// An integer key's batch is a bitmap over its range (`$3`, bit `key - $1` set for each
    /// row of the batch), and PostgreSQL returns only those rows; a uuid key's range returns
    /// every row and the export skips the untouched ones. Only where the key's order is the
    /// `row_id`'s (a uuid or integer key). The second statement, a uuid key's only, counts
    /// its rows in the range, up to `$3`.
    fn range_sql(&self) -> Option<(String, Option<String>)> {
        let (key, bound, only) = match (RowIdRule::of(&self.key), self.key.as_slice()) {
            (RowIdRule::Key, [only]) => (format!("s.{}", ident(&only.name)), "uuid", String::new()),
            (RowIdRule::Integer, [only]) => {
                let key = format!("s.{}", ident(&only.name));
                let only = format!(" AND get_bit($3::bytea, ({key}::int8 - $1::int8)::int4) = 1");
                (key, "int8", only)
            }
            _ => return None,
        };
        let table = self.table.quoted();
        let within = format!("{key} BETWEEN $1::{bound} AND $2::{bound}");
        let probe = only.is_empty().then(|| {
            format!("SELECT count(*) FROM (SELECT FROM ONLY {table} s WHERE {within} LIMIT $3) x")
        });
        Some((
            format!(
                "SELECT {key}::{bound}, {payload} FROM ONLY {table} s WHERE {within}{only} ORDER BY {key}",
                payload = self.payload(),
            ),
            probe,
        ))
    }

    /// Every row of the table (`s`): its `row_id`, then `rest`, in `row_id` order (the key's
    /// own order for a uuid or integer key).
    fn rows_sql(&self, rest: &str) -> String {
        let row_id = row_id_expr(self.id, &self.key, "s");
        let order = match RowIdRule::of(&self.key) {
            RowIdRule::Key | RowIdRule::Integer => format!("s.{}", ident(&self.key[0].name)),
            RowIdRule::Hashed => "1".to_string(),
        };
        format!(
            "SELECT {row_id}{rest} FROM ONLY {table} s ORDER BY {order}",
            table = self.table.quoted(),
        )
    }

    /// Init's rows: [`Self::rows_sql`] with the payload.
    fn init_sql(&self) -> String {
        self.rows_sql(&format!(", {}", self.payload()))
    }
}

/// The table sources flush has work on: a pending touch, or a truncate mark (flush must say the
/// lake no longer follows the table, even with nothing pending: a `TRUNCATE` records no touch).
pub async fn dirty_sources(client: &Client, tables: &Tables) -> Result<Vec<i16>> {
    let mut out = Vec::new();
    let (sources, touch_log) = qualified_tables(client, tables).await?;
    for (id, _) in list(client, tables).await? {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE source_id = $1) \
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

/// The source's pending touches, for flush's thresholds: how many (a row touched twice counts
/// twice: no sort of the backlog just to decide whether to read it), and the oldest touch
/// time.
pub async fn dirty(client: &Client, src: &TableSource) -> Result<DirtyStats> {
    touch_stats(client, &src.touch_log, src.id, "COUNT(*)").await
}

/// `count` (of touches, or of rows) and the oldest touch time of source `id`.
async fn touch_stats(
    client: &Client,
    touch_log: &TableName,
    id: i16,
    count: &str,
) -> Result<DirtyStats> {
    let sql = format!(
        "SELECT {count}, COALESCE(MIN(touched_at), 0) FROM {} WHERE source_id = $1",
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

/// Whether the source has a pending touch, as [`dirty`]'s shape: a count of 0 or 1.
pub async fn any_touch(client: &Client, src: &TableSource) -> Result<DirtyStats> {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE source_id = $1)",
        src.touch_log.quoted()
    );
    let any: bool = timed(
        TIMEOUT,
        "probe lakecdc_touch",
        client.query_one(&sql, &[&src.id]),
    )
    .await?
    .get(0);
    Ok(DirtyStats {
        count: i64::from(any),
        oldest_changed_at: 0,
    })
}

/// The pending rows of id `id`, a schema's (`change_log`) or a table source's
/// (`lakecdc_touch`), for the reports that show every source alike (inspect, metrics).
pub async fn dirty_of_id(client: &Client, tables: &Tables, id: i16) -> Result<DirtyStats> {
    if !list(client, tables).await?.iter().any(|(i, _)| *i == id) {
        return super::stats::dirty(client, &tables.change_log, id).await;
    }
    let (_, touch_log) = qualified_tables(client, tables).await?;
    touch_stats(client, &touch_log, id, "COUNT(DISTINCT row_id)").await
}

/// The touches a batch was read from, for the mark: their addresses.
#[derive(Debug, Default, Clone)]
pub struct Touches {
    tids: Vec<Tid>,
    /// The rows they are of.
    rows: u64,
}

/// One page of a [`SnapshotRead`].
#[derive(Debug)]
pub struct Batch {
    /// The lake rows, in `row_id` order (empty at the end of the read).
    pub rows: RecordBatch,
    /// The version exported per row.
    pub versions: Vec<Selected>,
    /// The touches read (none for init's read).
    pub touches: Touches,
    /// Rows no touch said gone that the table no longer holds (a `TRUNCATE`, writes while
    /// detached): exported as tombstones, since that is the table's state.
    pub gone: u64,
    /// Read by one key range scan (a dense flush page), not by key lookups.
    pub by_range: bool,
    /// Rows read by flush's table scan ([`Scan`]), not by key lookups.
    pub by_scan: u64,
    /// The table scans run for this page.
    pub scans: u32,
}

/// What a [`SnapshotRead`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// Flush: the pending touches, folded per row.
    Flush {
        /// The most row bytes a table scan keeps at once ([`Scan`]).
        scan_memory: usize,
        /// The most touches the read holds ([`MAX_TOUCHES`] by default).
        max_touches: usize,
    },
    /// Init: every row of the table.
    Init,
}

/// The most touches one flush read holds by default (about 80 bytes each in memory): a larger
/// backlog is read again, in a new snapshot, once these are exported and marked.
pub const MAX_TOUCHES: usize = 2_000_000;

/// One touch as flush reads it: row, time, gone, address, and whether it carries a key (every
/// touch of a capture does; a requeued tombstone of a row the table no longer holds may not).
type RawTouch = (Uuid, i64, bool, Tid, bool);

/// A row with touches, folded: its latest touch time, whether a touch said it is gone, the
/// address of a touch carrying its key when one does (where a hashed key's lookup reads the
/// key), and where its touches are in [`Folded::touches`].
#[derive(Debug, Clone)]
struct Pending {
    row_id: Uuid,
    touched_at: i64,
    deleted: bool,
    first: Tid,
    keyed: bool,
    touches: Range<usize>,
}

/// A flush's touches, folded per row in `row_id` order, and the next row to serve.
#[derive(Debug, Default)]
struct Folded {
    rows: Vec<Pending>,
    touches: Touches,
    next: usize,
}

impl Folded {
    /// Sorts the touches by row and folds them (the fold does not depend on their order).
    fn new(mut raw: Vec<RawTouch>) -> Self {
        raw.sort_unstable_by_key(|t| t.0);
        let mut out = Folded::default();
        for (i, (row_id, touched_at, deleted, tid, keyed)) in raw.into_iter().enumerate() {
            match out.rows.last_mut() {
                Some(p) if p.row_id == row_id => {
                    p.touched_at = p.touched_at.max(touched_at);
                    p.deleted |= deleted;
                    p.touches.end = i + 1;
                    // A keyless touch (a requeued tombstone) must not hide the key another
                    // touch carries: the row may be back (docs/design.md §10).
                    if keyed && !p.keyed {
                        (p.first, p.keyed) = (tid, true);
                    }
                }
                _ => out.rows.push(Pending {
                    row_id,
                    touched_at,
                    deleted,
                    first: tid,
                    keyed,
                    touches: i..i + 1,
                }),
            }
            out.touches.tids.push(tid);
        }
        out
    }

    /// The next `n` rows, the index of the first, and their touches.
    fn take(&mut self, n: usize) -> (Vec<Pending>, usize, Touches) {
        let start = self.next;
        let end = (self.next + n).min(self.rows.len());
        let rows = self.rows[start..end].to_vec();
        self.next = end;
        let span = match (rows.first(), rows.last()) {
            (Some(f), Some(l)) => f.touches.start..l.touches.end,
            _ => 0..0,
        };
        let touches = Touches {
            tids: self.touches.tids[span].to_vec(),
            rows: rows.len() as u64,
        };
        (rows, start, touches)
    }
}

/// How a [`SnapshotRead`] serves pages.
enum Served {
    /// Init: a cursor over every row.
    Rows,
    /// Flush: the touches read up front, folded, and per page the payload statement, or the
    /// range read when the page is dense.
    Touches {
        folded: std::sync::Mutex<Folded>,
        /// The read's connections in its snapshot: its own first, then any added
        /// ([`SnapshotRead::add_connection`]); a page reads on whichever is free.
        conns: Vec<tokio::sync::Mutex<PageConn>>,
        /// The table scan of a hashed key's dense backlog.
        scan: Option<Box<tokio::sync::Mutex<Scan>>>,
    },
}

/// One connection of a flush read, in the read's snapshot, with its page statements prepared.
struct PageConn {
    client: Arc<Client>,
    /// The lookup by key ([`TableSource::payload_sql`]).
    payload: tokio_postgres::Statement,
    /// The range read of dense pages, for a key whose order is the `row_id`'s.
    range: Option<Ranged>,
}

impl PageConn {
    async fn prepare(client: Arc<Client>, src: &TableSource) -> Result<Self> {
        let payload = prepare(&client, &src.payload_sql()).await?;
        let range = match src.range_sql() {
            Some((read, probe)) => Some(Ranged {
                read: prepare(&client, &read).await?,
                probe: match probe {
                    Some(sql) => Some(prepare(&client, &sql).await?),
                    None => None,
                },
            }),
            None => None,
        };
        Ok(Self {
            client,
            payload,
            range,
        })
    }
}

/// The rows of one page, taken from a [`SnapshotRead`] in page order ([`SnapshotRead::take`])
/// and read by [`SnapshotRead::read`], on whichever connection is free.
pub struct Page {
    rows: usize,
    taken: Option<(Vec<Pending>, usize, Touches)>,
}

/// How one page of flush's folded rows is read.
enum Read<'a> {
    /// A lookup per row by key ([`TableSource::payload_sql`]).
    Lookup,
    /// One key range scan ([`TableSource::range_sql`]).
    Range(&'a tokio_postgres::Statement),
    /// The tuples the table scan kept, per row of the page ([`Scan`]); the rows without one
    /// by key.
    Scanned(Vec<Option<Box<[u8]>>>),
}

/// Flush's scan of a hashed key's backlog (docs/design.md §9.2): the table read once per pass,
/// in heap order, each pass keeping the binary tuples of the pending rows of a range of the
/// backlog (in `row_id` order) — as many as its budget (`--scan-memory`) holds — for the pages
/// to take. A pass that covers most of the table's rows reads every row
/// ([`TableSource::scan_sql`]); any other only the rows its touches name
/// ([`TableSource::touched_scan_sql`]). A pending row the scan did not keep is read by key as
/// before: the scan only saves lookups, it never decides that a row is gone.
struct Scan {
    /// The pending rows' ids, in `row_id` order (the folded rows').
    ids: Vec<Uuid>,
    /// The backlog's rows the last pass covered: `[lo, hi)`.
    lo: usize,
    hi: usize,
    /// The tuples it kept, by backlog index minus `lo`.
    kept: Vec<Option<Box<[u8]>>>,
    /// Whether another pass may run: the last covered enough rows, and enough are left, to
    /// pay for its read.
    more: bool,
    /// The table's rows, as last analysed.
    table_rows: f64,
    /// The expected size of one row's tuple as the scan sends it.
    row_bytes: usize,
    /// The expected size of one row's key (its columns' average widths).
    key_bytes: usize,
    /// The most tuple bytes a pass keeps.
    budget: usize,
}

/// Flush's range read of dense pages ([`TableSource::range_sql`]).
struct Ranged {
    read: tokio_postgres::Statement,
    /// Counts a uuid key's rows in the range (an integer key's range says it).
    probe: Option<tokio_postgres::Statement>,
}

/// A uuid key's page is read by key range when its range holds at most this many rows per
/// touched row: a range scan reads a row in a fraction of a lookup's time, so up to this many
/// rows sent and skipped cost less than the lookups they replace (docs/design.md §9.2).
const DENSE: usize = 3;

/// An integer key's page is read by key range when its range spans at most this many keys
/// per touched row: PostgreSQL skips the untouched rows itself (a bitmap test, nothing sent),
/// about a tenth of a lookup each.
const DENSE_INTEGER: usize = 8;

/// A pass of a hashed key's table scan ([`Scan`]) pays when it covers at least this share of
/// the table's rows (as last analysed): PostgreSQL reads and probes a table row in about a
/// twentieth of a key lookup's time (0.8 µs against 19 µs, docs/benchmarks.md), and every
/// row the pass keeps saves one lookup.
const SCAN_SHARE: f64 = 1.0 / 16.0;

/// A pass covering at least this share of the table's rows reads them all: sending the rows
/// it does not need then costs less than matching every row against the touches' keys.
const SCAN_ALL_SHARE: f64 = 0.5;

/// The bytes PostgreSQL's hash of a pass's keys takes per key beyond the key itself (a hash
/// entry and its tuple header; about 60 measured).
const KEY_HASH_OVERHEAD: usize = 64;

/// A table larger than this (as last analysed) is never scanned: one pass must end well
/// within the read's timeout, whatever the width of the rows.
const SCAN_TABLE_BYTES: i64 = 8 << 30;

/// The number of keys from `first`'s integer key to `last`'s, when a bitmap over them can be
/// addressed (`int4` bit numbers).
fn integer_span(first: &Pending, last: &Pending) -> Option<usize> {
    let span = i128::from(integer_key(last.row_id)) - i128::from(integer_key(first.row_id)) + 1;
    usize::try_from(span)
        .ok()
        .filter(|s| *s <= i32::MAX as usize)
}

/// The bitmap of an integer key page's rows over its key range, as `get_bit` numbers bits:
/// bit `key - first` is bit `n % 8` (least significant first) of byte `n / 8`.
fn key_bitmap(pending: &[Pending]) -> Vec<u8> {
    let (Some(first), Some(last)) = (pending.first(), pending.last()) else {
        return Vec::new();
    };
    let lo = integer_key(first.row_id);
    let span = integer_span(first, last).unwrap_or(0);
    let mut bits = vec![0u8; span.div_ceil(8)];
    for p in pending {
        let n = integer_key(p.row_id).wrapping_sub(lo) as u64 as usize;
        if let Some(b) = bits.get_mut(n / 8) {
            *b |= 1 << (n % 8);
        }
    }
    bits
}

impl Scan {
    /// The scan of a hashed key's backlog `pending`, when its first pass pays: it covers at
    /// least [`SCAN_SHARE`] of the table's rows as last analysed (or, never analysed, as a
    /// page sample counts them), the table is at most [`SCAN_TABLE_BYTES`], and `md5` hashes the key
    /// text's bytes as lakecdc receives them (the database's encoding is UTF8 or SQL_ASCII).
    async fn planned(
        client: &Client,
        src: &TableSource,
        pending: &[Pending],
        budget: usize,
    ) -> Result<Option<Self>> {
        const OP: &str = "plan a table source scan";
        if RowIdRule::of(&src.key) != RowIdRule::Hashed || pending.is_empty() {
            return Ok(None);
        }
        let row = timed(
            TIMEOUT,
            OP,
            client.query_one(
                "SELECT c.reltuples::float8, current_setting('server_encoding'), \
                        pg_relation_size(c.oid), \
                        pg_relation_size(c.oid) / current_setting('block_size')::int8, \
                        (SELECT sum(s.avg_width)::int8 FROM pg_stats s WHERE s.schemaname = n.nspname \
                            AND s.tablename = c.relname AND NOT s.inherited AND s.attname = ANY($2)), \
                        (SELECT sum(s.avg_width)::int8 FROM pg_stats s WHERE s.schemaname = n.nspname \
                            AND s.tablename = c.relname AND NOT s.inherited AND s.attname = ANY($3)) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = to_regclass($1)",
                &[
                    &src.table.quoted(),
                    &src.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                    &src.key.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
                ],
            ),
        )
        .await?;
        let mut rows: f64 = row.try_get(0).map_err(Error::postgres(OP))?;
        let encoding: String = row.try_get(1).map_err(Error::postgres(OP))?;
        let bytes: i64 = row.try_get(2).map_err(Error::postgres(OP))?;
        let pages: i64 = row.try_get(3).map_err(Error::postgres(OP))?;
        if rows <= 0.0 && pages > 0 {
            // Never analysed (docs/design.md §4.2, "Without statistics"): counted from a sample.
            rows = super::heap_read::sample_count(client, &src.table.quoted(), pages).await?;
        }
        let payload: Option<i64> = row.try_get(4).map_err(Error::postgres(OP))?;
        let key: Option<i64> = row.try_get(5).map_err(Error::postgres(OP))?;
        if rows <= 0.0
            || bytes > SCAN_TABLE_BYTES
            || !matches!(encoding.as_str(), "UTF8" | "SQL_ASCII")
        {
            return Ok(None);
        }
        // A binary tuple: a field count, then each field's length and bytes (the key text,
        // then the payload); without statistics, the heap's bytes per row.
        let row_bytes = match (payload, key) {
            (Some(p), Some(k)) => 2 + 4 * (src.columns.len() + 1) + (p + k + 2).max(0) as usize,
            _ => (bytes as f64 / rows) as usize,
        };
        let scan = Self {
            ids: pending.iter().map(|p| p.row_id).collect(),
            lo: 0,
            hi: 0,
            kept: Vec::new(),
            more: true,
            table_rows: rows,
            row_bytes: row_bytes.max(1),
            key_bytes: key.unwrap_or(16).max(0) as usize,
            budget,
        };
        Ok(scan.pays(scan.rows_from(0)).then_some(scan))
    }

    /// The backlog's rows a pass from row `lo` can keep, by its budget and the expected size of
    /// a row.
    fn rows_from(&self, lo: usize) -> usize {
        (self.budget / self.row_bytes)
            .max(1)
            .min(self.ids.len().saturating_sub(lo))
    }

    /// Whether a pass that covers `rows` of the backlog pays for its read of the table.
    fn pays(&self, rows: usize) -> bool {
        rows as f64 >= self.table_rows * SCAN_SHARE
    }

    /// The tuples of backlog rows `start..start + n` (a page; `None`: not kept), running the
    /// next pass when the page reaches past the last one's rows; and the passes run.
    async fn take(
        &mut self,
        client: &Client,
        src: &TableSource,
        start: usize,
        n: usize,
    ) -> Result<(Vec<Option<Box<[u8]>>>, u32)> {
        let mut out = Vec::with_capacity(n);
        let mut passes = 0;
        for i in start..start + n {
            if i >= self.hi && self.more {
                self.pass(client, src, i).await?;
                passes += 1;
            }
            out.push(match i.checked_sub(self.lo) {
                Some(k) if i < self.hi => self.kept.get_mut(k).and_then(Option::take),
                _ => None,
            });
        }
        Ok((out, passes))
    }

    /// One pass: reads the table and keeps the tuples of the backlog's rows from `lo` on, as
    /// many as its budget (`--scan-memory`) holds (the lowest `row_id`s: the pages take them
    /// in order). A pass that covers most of the table's rows reads all of them; any other,
    /// only the rows of its range's touches.
    async fn pass(&mut self, client: &Client, src: &TableSource, lo: usize) -> Result<()> {
        const OP: &str = "scan a table source";
        let planned = self.rows_from(lo);
        let every_row = planned as f64 >= self.table_rows * SCAN_ALL_SHARE;
        let last = (lo + planned).saturating_sub(1);
        let (sql, mut hi) = match (every_row, self.ids.get(lo), self.ids.get(last)) {
            (false, Some(first), Some(last)) => (src.touched_scan_sql(*first, *last), lo + planned),
            _ => (src.scan_sql(), self.ids.len()),
        };
        let mut kept: Vec<Option<Box<[u8]>>> = std::iter::repeat_with(|| None)
            .take(hi.saturating_sub(lo))
            .collect();
        let ids = &self.ids;
        let hashed = HashedRowId::new(src.id);
        let (mut bytes, budget) = (0usize, self.budget);
        // The read's session is tuned for key lookups (no sequential scans, no hash joins):
        // this statement is a sequential read and a hash join of the pass's keys, run by this
        // backend alone, with the memory to hold the keys' hash (so the table's rows are not
        // spilled to temporary files by batch).
        let hash = planned
            .saturating_mul(self.key_bytes.saturating_add(KEY_HASH_OVERHEAD))
            .clamp(4 << 20, budget.max(4 << 20));
        let tuned = planner_settings(
            client,
            &[
                ("enable_seqscan", "on".to_string()),
                ("enable_hashjoin", "on".to_string()),
                ("max_parallel_workers_per_gather", "0".to_string()),
                ("work_mem", format!("{}kB", hash >> 10)),
            ],
        )
        .await?;
        copy_tuples(client, OP, &sql, 1 + src.columns.len(), |tuple, fields| {
            let text = fields
                .first()
                .cloned()
                .flatten()
                .ok_or_else(|| Error::decode(OP, "a malformed row: no key text"))?;
            let id = hashed.of(&tuple[text]);
            let Some(k) = ids
                .get(lo..hi)
                .and_then(|range| range.binary_search(&id).ok())
            else {
                return Ok(());
            };
            bytes += tuple.len();
            kept[k] = Some(tuple.into());
            // Over the budget: the highest rows are left to the next pass (one row at
            // least is kept, so passes always move on).
            while bytes > budget && hi > lo + 1 {
                hi -= 1;
                if let Some(t) = kept[hi - lo].take() {
                    bytes -= t.len();
                }
            }
            Ok(())
        })
        .await?;
        planner_settings(client, &tuned).await?;
        kept.truncate(hi - lo);
        // Another pass pays when this one covered enough rows and enough are left; the rest
        // is looked up.
        self.more = self.pays(hi - lo) && self.pays(self.ids.len() - hi);
        (self.lo, self.hi, self.kept) = (lo, hi, kept);
        Ok(())
    }
}

/// Sets planner settings `(name, value)` for the rest of the read's transaction, in one
/// statement after one that reads them; returns what they were, to set them back.
async fn planner_settings<V: AsRef<str>>(
    client: &Client,
    settings: &[(&'static str, V)],
) -> Result<Vec<(&'static str, String)>> {
    const OP: &str = "set the scan's planner settings";
    let names: Vec<&str> = settings.iter().map(|(n, _)| *n).collect();
    let values: Vec<&str> = settings.iter().map(|(_, v)| v.as_ref()).collect();
    let row = timed(
        TIMEOUT,
        OP,
        client.query_one(
            "SELECT array_agg(current_setting(n) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS t(n, i)",
            &[&names],
        ),
    )
    .await?;
    let was: Vec<String> = row.try_get(0).map_err(Error::postgres(OP))?;
    timed(
        TIMEOUT,
        OP,
        client.execute(
            "SELECT set_config(n, v, true) FROM unnest($1::text[], $2::text[]) AS t(n, v)",
            &[&names, &values],
        ),
    )
    .await?;
    Ok(names.into_iter().zip(was).collect())
}

/// One snapshot of a table source, read a page at a time: init's (every row, through a
/// cursor: bounded memory whatever the table's size) or flush's (the source's touches — at
/// most [`MAX_TOUCHES`] — read as stored and folded per row here, then each page's rows read
/// through the primary key). It hands out versions: a row's is its latest touch time, never
/// below the floor the source recorded (so it beats every version an earlier run exported,
/// whatever the clock did); init's rows all take `max(floor, latest touch, now)`. Before
/// anything read is published, [`Self::reserve`] raises the recorded floor above every
/// version this read hands out (docs/design.md §9.2).
pub struct SnapshotRead {
    client: Arc<Client>,
    src: Arc<TableSource>,
    floor: i64,
    top: i64,
    served: Served,
    /// `needs_init_at` as the snapshot saw it.
    pub needs_init_at: Option<i64>,
    /// Init: the table's rows when the snapshot was taken (for progress and the dry run).
    pub rows: i64,
    /// Flush: touches were left unread (past the read's `max_touches`): a new read takes them.
    pub more: bool,
}

impl SnapshotRead {
    /// Opens the snapshot; init's cursor, or flush's read of the touches.
    pub async fn open(client: Arc<Client>, src: Arc<TableSource>, kind: ReadKind) -> Result<Self> {
        timed(
            TIMEOUT,
            "begin a table source read",
            client.batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; \
                 SET LOCAL idle_in_transaction_session_timeout = 0; \
                 SET LOCAL cursor_tuple_fraction = 1.0",
            ),
        )
        .await?;
        let rows = match kind {
            ReadKind::Flush { .. } => "0::int8".to_string(),
            ReadKind::Init => format!("(SELECT count(*) FROM ONLY {})", src.table.quoted()),
        };
        // Init's versions must beat every touch; flush's top comes from the touches it reads.
        let touched = match kind {
            ReadKind::Flush { .. } => "NULL::int8".to_string(),
            ReadKind::Init => format!(
                "(SELECT max(touched_at) FROM {} WHERE source_id = $1)",
                src.touch_log.quoted()
            ),
        };
        let seen = format!(
            "SELECT version_floor, needs_init_at, {touched}, {rows}, \
                    (extract(epoch FROM statement_timestamp()) * 1000)::int8 \
             FROM {sources} WHERE source_id = $1",
            sources = src.sources.quoted()
        );
        let row = timed(
            TIMEOUT,
            "read the source in the snapshot",
            client.query_one(&seen, &[&src.id]),
        )
        .await?;
        let column = |c: &'static str| Error::postgres(format!("read lakecdc_sources: {c}"));
        let recorded: i64 = row.try_get(0).map_err(column("version_floor"))?;
        let needs_init_at: Option<i64> = row.try_get(1).map_err(column("needs_init_at"))?;
        let touched: Option<i64> = row.try_get(2).map_err(column("touched_at"))?;
        let rows: i64 = row.try_get(3).map_err(column("rows"))?;
        let now: i64 = row.try_get(4).map_err(column("now"))?;
        let top = recorded.max(touched.unwrap_or(0)).max(1);
        let (floor, mut top) = match kind {
            ReadKind::Flush { .. } => (recorded.max(1), top),
            ReadKind::Init => (top.max(now), top.max(now)),
        };
        let (served, more) = match kind {
            ReadKind::Init => {
                let declare = format!(
                    "DECLARE lakecdc_read NO SCROLL CURSOR FOR {}",
                    src.init_sql()
                );
                timed(
                    TIMEOUT,
                    "open the read cursor",
                    client.batch_execute(&declare),
                )
                .await?;
                (Served::Rows, false)
            }
            ReadKind::Flush {
                scan_memory,
                max_touches,
            } => {
                // Truncated: flush refuses the run, so the touches are not read.
                let (raw, more) = match needs_init_at {
                    Some(_) => (Vec::new(), false),
                    None => read_touches(&client, &src, max_touches).await?,
                };
                // The highest version this run can hand out: its latest touch read.
                top = raw.iter().map(|t| t.1).fold(top, i64::max);
                let conn = PageConn::prepare(client.clone(), &src).await?;
                let folded = Folded::new(raw);
                let scan = Scan::planned(&client, &src, &folded.rows, scan_memory)
                    .await?
                    .map(|scan| Box::new(tokio::sync::Mutex::new(scan)));
                (
                    Served::Touches {
                        folded: std::sync::Mutex::new(folded),
                        conns: vec![tokio::sync::Mutex::new(conn)],
                        scan,
                    },
                    more,
                )
            }
        };
        Ok(Self {
            client,
            src,
            floor,
            top,
            served,
            needs_init_at,
            rows,
            more,
        })
    }

    /// Flush: the rows with a touch read (init: 0).
    pub fn pending_rows(&self) -> i64 {
        match &self.served {
            Served::Rows => 0,
            Served::Touches { folded, .. } => folded
                .lock()
                .map(|f| i64::try_from(f.rows.len()).unwrap_or(i64::MAX))
                .unwrap_or(0),
        }
    }

    /// Raises the source's recorded floor above every version this read hands out, on
    /// `client` (not the read's own, read-only, connection). Runs before the first publish:
    /// a run that stops after it only skips versions.
    pub async fn reserve(&self, client: &Client) -> Result<()> {
        let sql = format!(
            "UPDATE {} SET version_floor = GREATEST(version_floor, $2) WHERE source_id = $1",
            self.src.sources.quoted()
        );
        timed(
            TIMEOUT,
            "raise the version floor",
            client.execute(&sql, &[&self.src.id, &(self.top + 1)]),
        )
        .await?;
        Ok(())
    }

    /// The next page of at most `rows` rows (empty at the end).
    pub async fn page(&self, rows: usize) -> Result<Batch> {
        let page = self.take(rows)?;
        self.read(page).await
    }

    /// The next page's rows (at most `rows`), taken in page order: pages read concurrently
    /// ([`Self::read`]) still hold consecutive slices of the backlog, in `row_id` order.
    pub fn take(&self, rows: usize) -> Result<Page> {
        let taken = match &self.served {
            Served::Rows => None,
            Served::Touches { folded, .. } => Some(
                folded
                    .lock()
                    .map_err(|_| Error::Invariant("a table source read panicked".into()))?
                    .take(rows),
            ),
        };
        Ok(Page { rows, taken })
    }

    /// Reads page `page` on a free connection of the read.
    pub async fn read(&self, page: Page) -> Result<Batch> {
        match (&self.served, page.taken) {
            (Served::Touches { conns, scan, .. }, Some((pending, start, touches))) => {
                let conn = match conns.iter().find_map(|c| c.try_lock().ok()) {
                    Some(free) => free,
                    None => match conns.first() {
                        Some(c) => c.lock().await,
                        None => return Err(Error::Invariant("a read without a connection".into())),
                    },
                };
                let dense = match &conn.range {
                    Some(r) => self.dense(&conn.client, r, &pending).await?,
                    None => false,
                };
                let range = conn.range.as_ref().filter(|_| dense).map(|r| &r.read);
                let (read, scans) = match (range, scan) {
                    (Some(range), _) => (Read::Range(range), 0),
                    (None, Some(scan)) => {
                        let (tuples, scans) = scan
                            .lock()
                            .await
                            .take(&conn.client, &self.src, start, pending.len())
                            .await?;
                        (Read::Scanned(tuples), scans)
                    }
                    (None, None) => (Read::Lookup, 0),
                };
                let mut batch = self.touched_page(&conn, read, pending, touches).await?;
                batch.scans = scans;
                Ok(batch)
            }
            _ => self.rows_page(page.rows).await,
        }
    }

    /// How many pages can be read at once: one per connection of a flush read by key or range;
    /// one when a table scan serves the pages (they take its passes' tuples in order).
    pub fn parallel_pages(&self) -> usize {
        match &self.served {
            Served::Touches {
                conns, scan: None, ..
            } => conns.len(),
            _ => 1,
        }
    }

    /// Whether [`Self::add_connection`] would use another connection: a flush read by key or
    /// range.
    pub fn takes_connections(&self) -> bool {
        matches!(&self.served, Served::Touches { scan: None, .. })
    }

    /// Adds `client` (tuned for lookups, no transaction open) to the read: it opens a read-only
    /// transaction in the read's very snapshot (`pg_export_snapshot`, `SET TRANSACTION
    /// SNAPSHOT`) and prepares the page statements, so pages are read on both at once
    /// (docs/design.md §9.2). Ended by [`Self::close`].
    pub async fn add_connection(&mut self, client: Arc<Client>) -> Result<()> {
        const OP: &str = "share a table source read's snapshot";
        let Served::Touches {
            conns, scan: None, ..
        } = &mut self.served
        else {
            return Ok(());
        };
        let row = timed(
            TIMEOUT,
            OP,
            self.client.query_one("SELECT pg_export_snapshot()", &[]),
        )
        .await?;
        let id: String = row.try_get(0).map_err(Error::postgres(OP))?;
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(Error::Invariant(format!("{OP}: snapshot id {id:?}")));
        }
        timed(
            TIMEOUT,
            OP,
            client.batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; \
                 SET TRANSACTION SNAPSHOT '{id}'; \
                 SET LOCAL idle_in_transaction_session_timeout = 0"
            )),
        )
        .await?;
        conns.push(tokio::sync::Mutex::new(
            PageConn::prepare(client, &self.src).await?,
        ));
        Ok(())
    }

    /// A page of init's cursor, decoded as it arrives while PostgreSQL produces the rest.
    async fn rows_page(&self, rows: usize) -> Result<Batch> {
        const OP: &str = "read a table source page";
        within(TIMEOUT, OP, async {
            let params: [&(dyn ToSql + Sync); 0] = [];
            let stream = self
                .client
                .query_raw(&format!("FETCH FORWARD {rows} FROM lakecdc_read"), params)
                .await
                .map_err(Error::postgres(OP))?;
            futures::pin_mut!(stream);
            let mut builder = RowsBuilder::new(self.src.id, &self.src.columns, rows);
            let mut versions = Vec::with_capacity(rows);
            while let Some(r) = stream.try_next().await.map_err(Error::postgres(OP))? {
                let row_id: Uuid = r
                    .try_get(0)
                    .map_err(|e| Error::postgres(format!("{OP}: row_id"))(e))?;
                builder.push(row_id, self.floor, 0, Some(&r), 1)?;
                versions.push(Selected {
                    row_id,
                    changed_at: self.floor,
                    tid: Tid::default(),
                });
            }
            Ok(Batch {
                rows: builder.finish()?,
                versions,
                touches: Touches::default(),
                gone: 0,
                by_range: false,
                by_scan: 0,
                scans: 0,
            })
        })
        .await
    }

    /// Whether one range scan should read the page: an integer key's range spans at most
    /// [`DENSE_INTEGER`] keys per pending row; a uuid key's holds at most [`DENSE`] table rows
    /// per pending row (counted, up to that bound).
    async fn dense(&self, client: &Client, r: &Ranged, pending: &[Pending]) -> Result<bool> {
        const OP: &str = "probe a table source page";
        let (Some(first), Some(last)) = (pending.first(), pending.last()) else {
            return Ok(false);
        };
        match &r.probe {
            None => Ok(integer_span(first, last)
                .is_some_and(|span| span <= DENSE_INTEGER.saturating_mul(pending.len()))),
            Some(probe) => {
                let most = DENSE.saturating_mul(pending.len());
                let limit = i64::try_from(most.saturating_add(1)).unwrap_or(i64::MAX);
                let row = timed(
                    TIMEOUT,
                    OP,
                    client.query_one(probe, &[&first.row_id, &last.row_id, &limit]),
                )
                .await?;
                let rows: i64 = row.try_get(0).map_err(Error::postgres(OP))?;
                Ok(rows < limit)
            }
        }
    }

    /// A page of flush's folded rows: their table rows read in the snapshot — by key, or,
    /// with a range read, every row of the page's key range, the untouched ones skipped, or,
    /// after the table scan, by address — in `row_id` order, decoded as they arrive while
    /// PostgreSQL produces the rest; a row the table does not hold is a tombstone (the
    /// snapshot decides, never a touch: with a deferred key check an insert can draw its
    /// number before the delete of the key's old row).
    async fn touched_page(
        &self,
        conn: &PageConn,
        read: Read<'_>,
        pending: Vec<Pending>,
        touches: Touches,
    ) -> Result<Batch> {
        const OP: &str = "read a table source page";
        let rule = RowIdRule::of(&self.src.key);
        let mut builder = RowsBuilder::new(self.src.id, &self.src.columns, pending.len());
        let mut versions = Vec::with_capacity(pending.len());
        let mut gone = 0;
        let version = |p: &Pending| p.touched_at.max(self.floor);
        let (range, scanned) = match read {
            Read::Lookup => (None, None),
            Read::Range(range) => (Some(range), None),
            Read::Scanned(tuples) => (None, Some(tuples)),
        };
        // After a scan, the rows it did not keep are looked up by key first (few: rows gone
        // since their touch) and merged in as their turn comes.
        let (looked, by_scan) = match &scanned {
            Some(tuples) => {
                let missed: Vec<&Pending> = pending
                    .iter()
                    .zip(tuples)
                    .filter_map(|(p, t)| t.is_none().then_some(p))
                    .collect();
                let kept = (pending.len() - missed.len()) as u64;
                (self.looked_up(conn, &missed).await?, kept)
            }
            None => (Vec::new(), 0),
        };
        let mut looked = looked.into_iter().peekable();
        // A row no read of the page returned: the one its key found, or a tombstone.
        let mut settle = |p: &Pending, builder: &mut RowsBuilder| {
            let mine =
                |r: &tokio_postgres::Row| r.try_get::<_, Uuid>(0).is_ok_and(|id| id == p.row_id);
            if let Some(r) = looked.next_if(mine) {
                return builder.push(p.row_id, version(p), 0, Some(&r), 1);
            }
            if !p.deleted {
                gone += 1;
            }
            builder.push(p.row_id, version(p), version(p), None, 1)
        };
        let mut next = 0;
        if let Some(tuples) = scanned {
            let mut fields = Vec::new();
            let n = 1 + self.src.columns.len();
            for (p, tuple) in pending.iter().zip(tuples) {
                match tuple {
                    Some(t) => {
                        let Some(CopyItem::Tuple(_)) = copy_tuple(OP, &t, n, &mut fields)? else {
                            return Err(Error::decode(OP, "a scanned row is not one whole tuple"));
                        };
                        // The key text first, then the payload.
                        builder.push_fields(p.row_id, version(p), &t, &fields[1..])?;
                    }
                    None => settle(p, &mut builder)?,
                }
            }
            next = pending.len();
        } else if let (Some(first), Some(last)) = (pending.first(), pending.last()) {
            let ids: Vec<Uuid>;
            let firsts: Vec<Tid>;
            let ints: Vec<i64>;
            let bounds: (i64, i64, Vec<u8>);
            let (statement, params): (_, Vec<&(dyn ToSql + Sync)>) = match (range, rule) {
                (Some(range), RowIdRule::Integer) => {
                    bounds = (
                        integer_key(first.row_id),
                        integer_key(last.row_id),
                        key_bitmap(&pending),
                    );
                    (range, vec![&bounds.0, &bounds.1, &bounds.2])
                }
                (Some(range), _) => (range, vec![&first.row_id, &last.row_id]),
                (None, rule) => {
                    ids = pending.iter().map(|p| p.row_id).collect();
                    match rule {
                        RowIdRule::Key => (&conn.payload, vec![&ids]),
                        RowIdRule::Integer => {
                            ints = ids.iter().map(|id| integer_key(*id)).collect();
                            (&conn.payload, vec![&ids, &ints])
                        }
                        RowIdRule::Hashed => {
                            firsts = pending.iter().map(|p| p.first).collect();
                            (&conn.payload, vec![&ids, &firsts])
                        }
                    }
                }
            };
            let ranged = range.is_some();
            within(TIMEOUT, OP, async {
                let stream = conn
                    .client
                    .query_raw(statement, params)
                    .await
                    .map_err(Error::postgres(OP))?;
                futures::pin_mut!(stream);
                let row_id = |e| Error::postgres(format!("{OP}: row_id"))(e);
                while let Some(r) = stream.try_next().await.map_err(Error::postgres(OP))? {
                    let id = match (ranged, rule) {
                        (true, RowIdRule::Integer) => {
                            integer_row_id(self.src.id, r.try_get(0).map_err(row_id)?)
                        }
                        _ => r.try_get::<_, Uuid>(0).map_err(row_id)?,
                    };
                    while pending.get(next).is_some_and(|p| p.row_id < id) {
                        settle(&pending[next], &mut builder)?;
                        next += 1;
                    }
                    match pending.get(next) {
                        Some(p) if p.row_id == id => {
                            builder.push(p.row_id, version(p), 0, Some(&r), 1)?;
                            next += 1;
                        }
                        // An untouched row of a uuid key's range.
                        _ if ranged => {}
                        _ => {
                            return Err(Error::Invariant(format!(
                                "{OP}: row {id} came back out of order"
                            )));
                        }
                    }
                }
                Ok(())
            })
            .await?;
        }
        for p in &pending[next..] {
            settle(p, &mut builder)?;
        }
        if looked.next().is_some() {
            return Err(Error::Invariant(format!(
                "{OP}: a row looked up by key came back out of order"
            )));
        }
        for p in &pending {
            versions.push(Selected {
                row_id: p.row_id,
                changed_at: version(p),
                tid: Tid::default(),
            });
        }
        Ok(Batch {
            rows: builder.finish()?,
            versions,
            touches,
            gone,
            by_range: range.is_some(),
            by_scan,
            scans: 0,
        })
    }

    /// The table rows of hashed-key rows `rows` (in `row_id` order), each looked up by key:
    /// [`TableSource::payload_sql`], collected.
    async fn looked_up(
        &self,
        conn: &PageConn,
        rows: &[&Pending],
    ) -> Result<Vec<tokio_postgres::Row>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, firsts): (Vec<Uuid>, Vec<Tid>) = rows.iter().map(|p| (p.row_id, p.first)).unzip();
        timed(
            TIMEOUT,
            "read a table source page",
            conn.client.query(&conn.payload, &[&ids, &firsts]),
        )
        .await
    }

    /// Ends the snapshot, on every connection of the read.
    pub async fn close(&self) -> Result<()> {
        if let Served::Touches { conns, .. } = &self.served {
            for conn in conns.iter().skip(1) {
                let client = conn.lock().await.client.clone();
                timed(
                    TIMEOUT,
                    "end a table source read",
                    client.batch_execute("COMMIT"),
                )
                .await?;
            }
        }
        timed(
            TIMEOUT,
            "end a table source read",
            self.client.batch_execute("COMMIT"),
        )
        .await
    }
}

/// Prepares one of flush's statements on the read's connection.
async fn prepare(client: &Client, sql: &str) -> Result<tokio_postgres::Statement> {
    timed(TIMEOUT, "prepare a table source read", client.prepare(sql)).await
}

/// Reads the source's touches (at most `max`) as one binary `COPY` in the read's snapshot,
/// parsed where they lie in the stream; whether any were left unread.
async fn read_touches(
    client: &Client,
    src: &TableSource,
    max: usize,
) -> Result<(Vec<RawTouch>, bool)> {
    const OP: &str = "read lakecdc_touch";
    let sql = format!(
        "COPY ({} LIMIT {}) TO STDOUT (FORMAT binary)",
        src.touches_sql(),
        max.saturating_add(1)
    );
    let mut out: Vec<RawTouch> = Vec::new();
    copy_each(client, OP, &sql, |fields| {
        out.push(decode_touch(fields)?);
        Ok(())
    })
    .await?;
    let more = out.len() > max;
    out.truncate(max);
    Ok((out, more))
}

/// Streams the binary `COPY … TO STDOUT` `sql`, handing each tuple's `N` fields (`None`: NULL)
/// to `each` where they lie in the stream.
async fn copy_each<const N: usize>(
    client: &Client,
    op: &'static str,
    sql: &str,
    mut each: impl FnMut([Option<&[u8]>; N]) -> Result<()>,
) -> Result<()> {
    copy_tuples(client, op, sql, N, |tuple, fields| {
        each(std::array::from_fn(|i| {
            fields[i].clone().map(|r| &tuple[r])
        }))
    })
    .await
}

/// Streams the binary `COPY … TO STDOUT` `sql` of `n` columns, handing each tuple — its bytes,
/// and where each field lies in them (`None`: NULL) — to `each` where it lies in the stream.
async fn copy_tuples(
    client: &Client,
    op: &'static str,
    sql: &str,
    n: usize,
    mut each: impl FnMut(&[u8], &[Option<Range<usize>>]) -> Result<()>,
) -> Result<()> {
    within(TIMEOUT, op, async {
        let stream = client.copy_out(sql).await.map_err(Error::postgres(op))?;
        futures::pin_mut!(stream);
        let mut decoder = CopyDecoder::new(op, EachTuple::new(n, &mut each));
        while let Some(chunk) = stream.try_next().await.map_err(Error::postgres(op))? {
            decoder.feed(&chunk)?;
        }
        decoder.end_stream().map(drop)
    })
    .await
}

/// One touch of the touches' COPY stream.
fn decode_touch([id, touched, deleted, at, keyed]: [Option<&[u8]>; 5]) -> Result<RawTouch> {
    let bad =
        |what: &str| Error::decode("read lakecdc_touch", format!("a malformed touch: {what}"));
    let id = id
        .and_then(|v| Uuid::from_slice(v).ok())
        .ok_or_else(|| bad("row_id"))?;
    let touched = touched
        .and_then(|v| v.try_into().ok())
        .map(i64::from_be_bytes)
        .ok_or_else(|| bad("touched_at"))?;
    let deleted = matches!(deleted.ok_or_else(|| bad("deleted"))?, [1]);
    let at = at.and_then(Tid::from_binary).ok_or_else(|| bad("ctid"))?;
    let keyed = matches!(keyed.ok_or_else(|| bad("key"))?, [1]);
    Ok((id, touched, deleted, at, keyed))
}

/// The mark: deletes exactly the touches a published batch was read from, by address (a TID
/// scan). It runs while the read's transaction is open: that transaction holds the touch
/// log's lock against `VACUUM FULL` and `CLUSTER` (nothing can move a touch), and its
/// snapshot keeps any touch deleted since from being vacuumed away (no address is reused), so
/// each address still holds the touch that was read. A touch written since the read is
/// another tuple and stays pending. Returns the rows marked: the batch's, when every touch
/// read was deleted (nothing is sent back per touch); when some were already gone — deleted
/// behind lakecdc's back, since flushes of a source never overlap — as many fewer, with a
/// warning. Committed without waiting for the WAL flush: a mark lost in a crash leaves
/// touches whose rows go out again, with higher versions — a duplicate, never a loss.
pub async fn mark(client: &Client, src: &TableSource, touches: &Touches) -> Result<u64> {
    const OP: &str = "mark lakecdc_touch";
    let sql = format!(
        "DELETE FROM {} WHERE ctid = ANY($2::tid[]) AND source_id = $1",
        src.touch_log.quoted()
    );
    timed(
        TIMEOUT,
        OP,
        client.batch_execute("BEGIN; SET LOCAL synchronous_commit = off"),
    )
    .await?;
    let deleted = timed(TIMEOUT, OP, client.execute(&sql, &[&src.id, &touches.tids])).await;
    let finish = if deleted.is_ok() {
        "COMMIT"
    } else {
        "ROLLBACK"
    };
    timed(TIMEOUT, OP, client.batch_execute(finish)).await?;
    let missing = (touches.tids.len() as u64).saturating_sub(deleted?);
    if missing > 0 {
        tracing::warn!(
            schema = %src.name,
            touches = missing,
            "touches read by this flush were deleted by something else before its mark"
        );
    }
    Ok(touches.rows.saturating_sub(missing))
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

/// The source's pending row ids (with a touch), sorted, in the client's transaction: rows the
/// next flush exports, which `verify --source` does not judge.
pub async fn pending_ids(client: &Client, src: &TableSource) -> Result<Vec<u128>> {
    let sql = format!(
        "SELECT DISTINCT row_id FROM {} WHERE source_id = $1 ORDER BY row_id",
        src.touch_log.quoted()
    );
    timed(
        TIMEOUT,
        "read pending row ids",
        client.query(&sql, &[&src.id]),
    )
    .await?
    .iter()
    .map(|r| r.try_get::<_, Uuid>(0).map(|u| u.as_u128()))
    .collect::<std::result::Result<Vec<_>, _>>()
    .map_err(Error::postgres("read pending row ids"))
}

/// `verify --source`'s read of a table source: in ONE snapshot, the pending row ids, then
/// every row's `row_id` in `row_id` order, a page at a time. The table keeps no version per
/// row (the touches are deleted once exported): the lake's version is not compared.
pub struct IdRead<'a> {
    client: &'a Client,
}

impl<'a> IdRead<'a> {
    /// Opens the snapshot, reads the pending ids (sorted) and opens the cursor.
    pub async fn open(client: &'a Client, src: &TableSource) -> Result<(Self, Vec<u128>)> {
        timed(
            TIMEOUT,
            "begin id read",
            client.batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL idle_in_transaction_session_timeout = 0",
            ),
        )
        .await?;
        let dirty = pending_ids(client, src).await?;
        let declare = format!(
            "DECLARE lakecdc_ids NO SCROLL CURSOR FOR {}",
            src.rows_sql("")
        );
        timed(
            TIMEOUT,
            "open the id cursor",
            client.batch_execute(&declare),
        )
        .await?;
        Ok((Self { client }, dirty))
    }

    /// The next page of at most `rows` row ids (empty at the end).
    pub async fn page(&self, rows: usize) -> Result<Vec<u128>> {
        let fetched = timed(
            TIMEOUT,
            "read an id page",
            self.client
                .query(&format!("FETCH FORWARD {rows} FROM lakecdc_ids"), &[]),
        )
        .await?;
        fetched
            .iter()
            .map(|r| Ok(r.try_get::<_, Uuid>(0)?.as_u128()))
            .collect::<std::result::Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(Error::postgres("read an id page"))
    }

    /// Ends the snapshot.
    pub async fn close(self) -> Result<()> {
        timed(TIMEOUT, "end id read", self.client.batch_execute("COMMIT")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(source: i16, keys: &[i64]) -> Vec<Pending> {
        keys.iter()
            .map(|k| Pending {
                row_id: integer_row_id(source, *k),
                touched_at: 1,
                deleted: false,
                first: Tid::default(),
                keyed: false,
                touches: 0..0,
            })
            .collect()
    }

    #[test]
    fn a_rows_lookup_reads_the_key_of_a_touch_that_carries_one() {
        let id = Uuid::from_u128(7);
        let at = |n: u8| Tid::from_binary(&[0, 0, 0, 0, 0, n]).unwrap();
        // A keyless tombstone first (a requeue), then the capture's touches with the key.
        let folded = Folded::new(vec![
            (id, 5, true, at(1), false),
            (id, 6, false, at(2), true),
            (id, 7, false, at(3), true),
        ]);
        let [p] = folded.rows.as_slice() else {
            panic!("{:?}", folded.rows)
        };
        assert_eq!(
            (p.first, p.keyed, p.touched_at, p.deleted),
            (at(2), true, 7, true)
        );
        assert_eq!(p.touches, 0..3);
        // Only keyless touches: the first is read (and finds no key: a tombstone).
        let folded = Folded::new(vec![(id, 5, true, at(4), false)]);
        assert_eq!((folded.rows[0].first, folded.rows[0].keyed), (at(4), false));
    }

    #[test]
    fn an_integer_page_bitmap_sets_bit_key_minus_first_as_get_bit_reads_it() {
        // PostgreSQL: get_bit('\x0301', n) is 1 for n = 0, 1, 8 only.
        assert_eq!(key_bitmap(&pending(3, &[5, 6, 13])), vec![0x03, 0x01]);
        assert_eq!(key_bitmap(&pending(3, &[-2, 5])), vec![0x81]);
        assert_eq!(key_bitmap(&pending(3, &[])), Vec::<u8>::new());
        let p = pending(3, &[i64::MIN, i64::MAX]);
        assert_eq!(integer_span(&p[0], &p[1]), None, "too wide for a bitmap");
        let p = pending(3, &[-1, 1]);
        assert_eq!(integer_span(&p[0], &p[1]), Some(3));
    }
}

//! The export query: joins the change-log slots (or, for a base, the entity rows) with their
//! `entity_main` row and pivoted EAV rows, and casts every attribute to its lake type
//! (docs/design.md §3.1). Deltas and bases share this one query builder, so a base and a
//! delta of the same version are identical (docs/hazards.md #210).

use std::path::Path;

use arrow::record_batch::RecordBatch;

use super::scan::Registered;
use super::writer::{self, Plan};
use super::{Driver, Engine, quote_ident};
use crate::error::Result;
use crate::schema::batch::eav;
use crate::schema::columns::{SYSTEM_COLUMNS, duckdb_type};
use crate::schema::{Attribute, Encoding, SchemaDef, ValueType};

/// The Arrow inputs of one export (the layouts of [`crate::schema::batch`]); each is a list
/// of batches of one schema (at least one batch, which may be empty).
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Dirty slots (`row_id, changed_at, deleted_at`); ignored for [`Driver::Entities`].
    pub change_log: &'a [RecordBatch],
    /// Entity rows.
    pub entities: &'a [RecordBatch],
    /// EAV rows.
    pub eav: &'a [RecordBatch],
}

/// The SELECT producing a lake file's rows, sorted by `row_id`.
pub fn export_sql(schema: &SchemaDef, schema_id: i16, driver: Driver) -> String {
    let from = match driver {
        Driver::ChangeLog => "cl LEFT JOIN m ON m.ltbase_row_id = cl.row_id",
        Driver::Entities => "m",
    };
    let system = system_columns(driver, "cl");
    let cols = select_list(schema, schema_id, &system, |a| {
        format!("e.{}", quote_ident(&a.column))
    });
    let row_id = &system[0];
    let mut sql = format!("SELECT {} FROM {from}", items(&cols));
    let eav: Vec<&Attribute> = schema
        .attributes
        .iter()
        .filter(|a| a.binding.is_none())
        .collect();
    if !eav.is_empty() {
        let aggs: Vec<String> = eav
            .iter()
            .map(|a| format!("{} AS {}", eav_agg(a), quote_ident(&a.column)))
            .collect();
        sql.push_str(&format!(
            " LEFT JOIN (SELECT row_id, {} FROM eav GROUP BY row_id) e ON e.row_id = {row_id}",
            aggs.join(", ")
        ));
    }
    sql.push_str(" ORDER BY row_id");
    sql
}

/// The SELECT producing a lake file's rows from rows already joined with their EAV values by
/// [`super::assemble`] (one raw value — or list of raw items — per EAV attribute, in its
/// [`super::assemble::raw_column`]; for a delta, the slot columns next to the entity columns)
/// and already in `row_id` order: the same columns, types and values as [`export_sql`] with
/// the same `driver`, with no join, aggregate or sort left for DuckDB. The maximum the pivot
/// takes over an attribute's one row is that row's value, so both give the same file
/// (docs/hazards.md #210). The rows are read from `source` (a table expression, aliased `m`).
pub fn assembled_sql(schema: &SchemaDef, schema_id: i16, driver: Driver, source: &str) -> String {
    let cols = assembled_columns(schema, schema_id, driver);
    format!("SELECT {} FROM {source} AS m", items(&cols))
}

/// [`assembled_sql`]'s columns: (name, expression over `m`), in file order.
pub(super) fn assembled_columns(
    schema: &SchemaDef,
    schema_id: i16,
    driver: Driver,
) -> Vec<(String, String)> {
    select_list(schema, schema_id, &system_columns(driver, "m"), |a| {
        let raw = format!("m.{}", quote_ident(&super::assemble::raw_column(a.id)));
        match a.value_type {
            // The raw items, already in index order: each is cast as the pivot casts it.
            ValueType::List => format!(
                "CAST(list_transform({raw}, lambda x: {}) AS {})",
                eav_cast(a.items_type.unwrap_or(ValueType::Text), "x"),
                duckdb_type(a)
            ),
            t => eav_cast(t, &raw),
        }
    })
}

/// The `row_id`, `changed_at` and `deleted_at` expressions of a file's rows; a delta's slot
/// columns are read from relation `slots`.
fn system_columns(driver: Driver, slots: &str) -> [String; 3] {
    match driver {
        Driver::ChangeLog => [
            format!("{slots}.row_id"),
            format!("{slots}.changed_at"),
            // A slot without an entity row is a hard delete: a tombstone at its version.
            format!(
                "CASE WHEN COALESCE({slots}.deleted_at, 0) > 0 THEN {slots}.deleted_at \
                 WHEN m.ltbase_row_id IS NULL THEN {slots}.changed_at ELSE 0 END"
            ),
        ],
        Driver::Entities => [
            "m.ltbase_row_id".to_string(),
            "m.ltbase_updated_at".to_string(),
            "0".to_string(),
        ],
    }
}

/// A lake file's columns, in file order, as (name, expression): the system columns
/// ([`SYSTEM_COLUMNS`]) from `[row_id, changed_at, deleted_at]`, the bound attributes from
/// their slots, then the EAV attributes from `eav`.
fn select_list(
    schema: &SchemaDef,
    schema_id: i16,
    [row_id, changed_at, deleted_at]: &[String; 3],
    eav: impl Fn(&Attribute) -> String,
) -> Vec<(String, String)> {
    let system = [
        format!("CAST({schema_id} AS SMALLINT)"),
        row_id.clone(),
        format!("CAST({changed_at} AS BIGINT)"),
        format!("CAST({deleted_at} AS BIGINT)"),
        "m.ltbase_created_at".to_string(),
        "m.ltbase_updated_at".to_string(),
        "m.ltbase_deleted_at".to_string(),
    ];
    let mut cols: Vec<(String, String)> = SYSTEM_COLUMNS
        .iter()
        .map(|(name, _)| name.to_string())
        .zip(system)
        .collect();
    let (bound, unbound): (Vec<&Attribute>, Vec<&Attribute>) =
        schema.attributes.iter().partition(|a| a.binding.is_some());
    for a in &bound {
        cols.push((a.column.clone(), bound_expr(a)));
    }
    for a in &unbound {
        cols.push((a.column.clone(), eav(a)));
    }
    cols
}

/// A select list of `columns`: `expression AS name`, comma-separated.
fn items(columns: &[(String, String)]) -> String {
    let items: Vec<String> = columns
        .iter()
        .map(|(name, expr)| format!("{expr} AS {}", quote_ident(name)))
        .collect();
    items.join(", ")
}

/// A bound attribute's value from its slot column.
fn bound_expr(a: &Attribute) -> String {
    let Some(b) = &a.binding else {
        return "NULL".to_string();
    };
    let c = format!("m.{}", quote_ident(&b.column));
    match (a.value_type, b.encoding) {
        (ValueType::Text, _) => format!("CAST({c} AS VARCHAR)"),
        (ValueType::Uuid, _) => format!("TRY_CAST({c} AS UUID)"),
        (ValueType::Smallint, _) => format!("TRY_CAST({c} AS SMALLINT)"),
        (ValueType::Integer, _) => format!("TRY_CAST({c} AS INTEGER)"),
        (ValueType::Bigint, _) => format!("TRY_CAST({c} AS BIGINT)"),
        (ValueType::Numeric, _) => format!("TRY_CAST({c} AS DOUBLE)"),
        (ValueType::Date | ValueType::Datetime, Encoding::Iso8601) => {
            format!("epoch_ms(CAST(TRY_CAST({c} AS TIMESTAMPTZ) AS TIMESTAMP))")
        }
        (ValueType::Date | ValueType::Datetime, _) => format!("TRY_CAST({c} AS BIGINT)"),
        (ValueType::Bool, Encoding::BoolText) => format!(
            "CASE lower(trim({c})) WHEN '1' THEN TRUE WHEN 'true' THEN TRUE WHEN 't' THEN TRUE \
             WHEN '0' THEN FALSE WHEN 'false' THEN FALSE WHEN 'f' THEN FALSE END"
        ),
        (ValueType::Bool, _) => format!("({c} <> 0)"),
        (ValueType::List, _) => "NULL".to_string(),
    }
}

/// How one EAV value of type `t`, held in `raw` (its [`eav_column`]), is read.
fn eav_cast(t: ValueType, raw: &str) -> String {
    match t {
        ValueType::Text | ValueType::List => raw.to_string(),
        ValueType::Uuid => format!("TRY_CAST({raw} AS UUID)"),
        ValueType::Smallint | ValueType::Integer | ValueType::Numeric => raw.to_string(),
        ValueType::Bigint | ValueType::Date | ValueType::Datetime => {
            format!("TRY_CAST({raw} AS BIGINT)")
        }
        ValueType::Bool => format!("({raw} <> 0)"),
    }
}

/// The per-row aggregate of an EAV attribute: a scalar, or a list in index order (`[]` for the
/// explicit-empty marker row, NULL when absent).
fn eav_agg(a: &Attribute) -> String {
    let id = a.id;
    match a.value_type {
        ValueType::List => {
            let item = a.items_type.unwrap_or(ValueType::Text);
            format!(
                "CASE WHEN count(*) FILTER (WHERE attr_id = {id}) > 0 THEN COALESCE(\
                 list({} ORDER BY TRY_CAST(array_indices AS BIGINT)) FILTER (WHERE attr_id = {id} AND array_indices <> ''), \
                 CAST([] AS {})) END",
                eav_cast(item, eav::value_column(item)),
                duckdb_type(a)
            )
        }
        t => format!(
            "max(CASE WHEN attr_id = {id} THEN {} END)",
            eav_cast(t, eav::value_column(t))
        ),
    }
}

impl Engine {
    /// Writes one lake file from `inputs` to `path`. The rows are joined with their EAV values
    /// in Rust when that gives the pivot's rows ([`super::assemble`]) and written by
    /// [`super::writer`], with DuckDB computing only the columns Rust does not cast itself;
    /// otherwise DuckDB joins and pivots them ([`Engine::export_pivoted`]). Either way the
    /// file has the same columns, types and values. Returns the rows written.
    pub fn export(
        &self,
        schema: &SchemaDef,
        schema_id: i16,
        driver: Driver,
        inputs: Inputs<'_>,
        path: &Path,
    ) -> Result<u64> {
        let assembled = match (driver, inputs.change_log, inputs.entities, inputs.eav) {
            (Driver::Entities, _, entities, eav) => {
                super::assemble::assemble(schema, entities, eav)?
            }
            (Driver::ChangeLog, [slots], [entities], [eav]) => {
                super::assemble::assemble_slots(schema, slots, entities, eav)?.map(|b| vec![b])
            }
            (Driver::ChangeLog, ..) => None,
        };
        let Some(rows) = assembled.filter(|r| !r.is_empty()) else {
            return self.export_pivoted(schema, schema_id, driver, inputs, path);
        };
        let columns = assembled_columns(schema, schema_id, driver);
        let plan = Plan::new(schema, schema_id, driver, &rows[0].schema(), &columns)?;
        let Some(select) = plan.duck_select() else {
            return writer::write(&plan, &rows, Vec::new(), path);
        };
        let registered = Registered::in_order(rows.clone());
        let source = registered.scan_sql();
        if rows.iter().all(|b| b.num_rows() == 0) {
            // DuckDB's result has no batch to take the columns' types from.
            return self.copy_to_parquet(&assembled_sql(schema, schema_id, driver, &source), path);
        }
        let duck = self.query_arrow(&format!("SELECT {select} FROM {source} AS m"))?;
        drop(registered);
        writer::write(&plan, &rows, duck, path)
    }

    /// Writes one lake file from `inputs` to `path` with the export query ([`export_sql`]):
    /// DuckDB scans the Arrow batches in place (views `cl`, `m` and `eav` over registered
    /// batches, dropped afterwards), joins, pivots and sorts them. The definition the Rust join
    /// of [`Engine::export`] must match. Returns the rows written.
    pub fn export_pivoted(
        &self,
        schema: &SchemaDef,
        schema_id: i16,
        driver: Driver,
        inputs: Inputs<'_>,
        path: &Path,
    ) -> Result<u64> {
        let mut views = vec![("m", inputs.entities), ("eav", inputs.eav)];
        if driver == Driver::ChangeLog {
            views.push(("cl", inputs.change_log));
        }
        // The guards keep the batches registered until the export has finished.
        let mut guards = Vec::new();
        for (name, batches) in views {
            let registered = Registered::new(batches.to_vec());
            self.create_view(name, &format!("SELECT * FROM {}", registered.scan_sql()))?;
            guards.push(registered);
        }
        // DuckDB joins, pivots and sorts; the lake's writer writes (see
        // `writer::write_duck_result`). A result of no rows has no batch to take the types
        // from, and no values to encode: DuckDB writes it.
        let sql = export_sql(schema, schema_id, driver);
        let rows = self.query_arrow(&sql).and_then(|batches| {
            if batches.iter().all(|b| b.num_rows() == 0) {
                self.copy_to_parquet(&sql, path)
            } else {
                writer::write_duck_result(schema, &batches, path)
            }
        });
        for name in ["cl", "m", "eav"] {
            self.drop_view(name)?;
        }
        drop(guards);
        rows
    }
}

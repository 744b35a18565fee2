//! `lakecdc attach` and `lakecdc detach`: a PostgreSQL table with a primary key becomes a
//! source of the lake, captured by statement-level triggers into the touch log without a
//! replication slot (docs/design.md §9); detaching drops the triggers and keeps the lake.
//! Both need only the database: the lake is not opened.

use serde::Serialize;

use crate::clock::Clock;
use crate::config::{TableName, Tables};
use crate::error::{Error, Result};
use crate::source::Connector;
use crate::source::attach::{self, AttachRequest};
use crate::source::capture::SourceColumn;

/// What `attach` is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachOptions {
    /// The table (`name` or `schema.name`).
    pub table: TableName,
    /// The source's name (default: the table's).
    pub name: Option<String>,
    /// Columns left out of the lake.
    pub exclude: Vec<String>,
    /// Check and report; change nothing.
    pub dry_run: bool,
}

/// What `attach` did (or would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttachReport {
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// The source's name (`--schema NAME` in the other jobs).
    pub source: String,
    /// Its id (shared with the schemas').
    pub source_id: i16,
    /// The table, qualified.
    pub table: String,
    /// The primary key's columns.
    pub key: Vec<String>,
    /// How the `row_id` comes from the key: `key` (one uuid column), `integer` (one integer
    /// column, order-preserving) or `hashed` (md5 of the key's text).
    pub row_id: &'static str,
    /// The exported columns, key included, with their PostgreSQL and lake types.
    pub columns: Vec<SourceColumn>,
    /// Columns left out.
    pub excluded: Vec<String>,
    /// The table was attached already with its triggers in place: nothing changed.
    pub unchanged: bool,
}

impl AttachReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let verb = match (self.unchanged, self.dry_run) {
            (true, _) => "is attached already (nothing changed)",
            (false, true) => "would be attached",
            (false, false) => "attached",
        };
        let mut out = format!(
            "{} {verb} as source {} (id {})\n  key      {} (row_id: {})\n  columns  {}\n",
            self.table,
            self.source,
            self.source_id,
            self.key.join(", "),
            self.row_id,
            self.columns
                .iter()
                .map(|c| format!("{} {} → {}", c.name, c.pg_type, c.lake_type))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !self.excluded.is_empty() {
            out.push_str(&format!("  excluded {}\n", self.excluded.join(", ")));
        }
        out
    }
}

/// What `detach` did (or would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DetachReport {
    /// True for `--dry-run`.
    pub dry_run: bool,
    /// The source's name.
    pub source: String,
    /// Its id.
    pub source_id: i16,
    /// The table, qualified.
    pub table: String,
}

impl DetachReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        format!(
            "{} {} (source {}, id {}): its triggers {}; the source's lake stays\n",
            self.table,
            if self.dry_run {
                "would be detached"
            } else {
                "detached"
            },
            self.source,
            self.source_id,
            if self.dry_run {
                "would be dropped"
            } else {
                "are dropped"
            },
        )
    }
}

fn request(opts: &AttachOptions) -> AttachRequest {
    AttachRequest {
        table: opts.table.clone(),
        name: opts.name.clone(),
        exclude: opts.exclude.clone(),
    }
}

/// Attaches the table (or, dry, checks that it can be).
pub async fn run(
    connector: &Connector,
    tables: &Tables,
    clock: &dyn Clock,
    opts: &AttachOptions,
) -> Result<AttachReport> {
    let mut client = connector.connect().await?;
    let a = attach::attach(
        &mut client,
        tables,
        &request(opts),
        clock.now_ms(),
        opts.dry_run,
    )
    .await?;
    let c = &a.capture;
    Ok(AttachReport {
        dry_run: opts.dry_run,
        source: c.name.clone(),
        source_id: c.source_id,
        table: c.table.quoted(),
        key: c.key.iter().map(|k| k.name.clone()).collect(),
        row_id: crate::source::capture::RowIdRule::of(&c.key).as_str(),
        columns: a.columns.clone(),
        excluded: c.excluded.clone(),
        unchanged: a.unchanged,
    })
}

/// `attach --print-sql`: the script `attach` would run, checked against the database but
/// changing nothing.
pub async fn script(
    connector: &Connector,
    tables: &Tables,
    clock: &dyn Clock,
    opts: &AttachOptions,
) -> Result<String> {
    let client = connector.connect().await?;
    let a = attach::plan_attach(&client, tables, &request(opts)).await?;
    Ok(a.capture.script(
        clock.now_ms(),
        &tables.registry,
        crate::source::ddl::INIT_DB_LOCK,
    ))
}

/// Detaches the table; an unattached table is a configuration error (exit 2).
pub async fn detach(
    connector: &Connector,
    tables: &Tables,
    table: &TableName,
    dry_run: bool,
) -> Result<DetachReport> {
    let mut client = connector.connect().await?;
    let capture = attach::detach(&mut client, tables, table, dry_run)
        .await?
        .ok_or_else(|| {
            Error::config(format!(
                "table {} is not attached: nothing to detach",
                table.quoted()
            ))
        })?;
    Ok(DetachReport {
        dry_run,
        source: capture.name,
        source_id: capture.source_id,
        table: capture.table.quoted(),
    })
}

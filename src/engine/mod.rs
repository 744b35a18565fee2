//! DuckDB, in process: opened with bounded threads, memory and a spill directory; scans Arrow
//! batches in place (`scan`) and writes lake Parquet files with `COPY`; `assemble` joins an
//! export's rows with their EAV values in Rust, and `writer` then writes the file with the
//! parquet crate, DuckDB computing only the columns that need its casts. DuckDB types never
//! leave this module. Every call blocks: callers on the async runtime use `spawn_blocking`.

pub mod assemble;
pub mod export;
pub(crate) mod parallel;
mod scan;
pub(crate) mod writer;

use std::path::{Path, PathBuf};

use arrow::record_batch::RecordBatch;
use duckdb::Connection;

use crate::error::{Error, Result};

/// Which table drives the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// Delta: one row per dirty slot (`cl`), a hard-deleted row becoming a tombstone.
    ChangeLog,
    /// Base: one row per live entity (`m`), version `ltbase_updated_at`.
    Entities,
}

/// Rows per Parquet row group (docs/design.md §3.1).
pub const ROW_GROUP_SIZE: usize = 122_880;
/// zstd level for every file lakecdc writes.
pub const ZSTD_LEVEL: i32 = 3;

/// How DuckDB is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Worker threads.
    pub threads: usize,
    /// `memory_limit`, already validated by [`crate::config::parse_memory_limit`].
    pub memory_limit: String,
    /// Where DuckDB spills; `None` keeps DuckDB's default.
    pub temp_directory: Option<PathBuf>,
    /// The most DuckDB may spill, in bytes; `None` keeps DuckDB's default (90% of the free
    /// space). Compaction sets what its free-space check left (docs/security.md).
    pub max_spill_bytes: Option<u64>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            memory_limit: "1GB".to_string(),
            temp_directory: None,
            max_spill_bytes: None,
        }
    }
}

/// One in-memory DuckDB database with a single connection.
#[derive(Debug)]
pub struct Engine {
    conn: Connection,
}

impl Engine {
    /// Opens an in-memory database configured by `cfg`.
    pub fn open(cfg: &EngineConfig) -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(Error::duckdb("open"))?;
        let mut setup = format!(
            "SET threads = {}; SET memory_limit = '{}';",
            cfg.threads.max(1),
            cfg.memory_limit.replace('\'', "''")
        );
        if let Some(dir) = &cfg.temp_directory {
            setup.push_str(&format!(
                " SET temp_directory = '{}';",
                sql_string(&dir.display().to_string())
            ));
        }
        if let Some(bytes) = cfg.max_spill_bytes {
            setup.push_str(&format!(" SET max_temp_directory_size = '{bytes}B';"));
        }
        conn.execute_batch(&setup)
            .map_err(Error::duckdb("configure"))?;
        conn.register_table_function::<scan::ArrowScan<true>>(scan::FUNCTION)
            .map_err(Error::duckdb("register the Arrow scan"))?;
        conn.register_table_function::<scan::ArrowScan<false>>(scan::ORDERED_FUNCTION)
            .map_err(Error::duckdb("register the ordered Arrow scan"))?;
        Ok(Self { conn })
    }

    /// The value of a DuckDB setting, as text.
    pub fn setting(&self, name: &str) -> Result<String> {
        self.conn
            .query_row("SELECT current_setting(?)::VARCHAR", [name], |r| r.get(0))
            .map_err(Error::duckdb(format!("read setting {name}")))
    }

    /// Writes the result of `select` to a Parquet file with the lake's options (zstd level 3,
    /// V2 pages, 122,880-row groups). Returns the rows written.
    pub fn copy_to_parquet(&self, select: &str, path: &Path) -> Result<u64> {
        let sql = format!(
            "COPY ({select}) TO '{}' (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, \
             PARQUET_VERSION V2, ROW_GROUP_SIZE {ROW_GROUP_SIZE})",
            sql_string(&path.display().to_string())
        );
        let rows = self
            .conn
            .execute(&sql, [])
            .map_err(Error::duckdb("write parquet"))?;
        crate::scratch::restrict(path).map_err(|source| Error::Io {
            op: "restrict the mode of",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(rows as u64)
    }

    /// The result of `select` as Arrow batches.
    pub fn query_arrow(&self, select: &str) -> Result<Vec<RecordBatch>> {
        let mut stmt = self
            .conn
            .prepare(select)
            .map_err(Error::duckdb("prepare a query"))?;
        stmt.execute([]).map_err(Error::duckdb("run a query"))?;
        // `step` rather than duckdb's `Arrow` iterator, which panics on a failed fetch.
        let mut batches = Vec::new();
        while let Some(rows) = stmt.step().map_err(Error::duckdb("fetch a result"))? {
            batches.push(RecordBatch::from(&rows));
        }
        Ok(batches)
    }

    /// Writes `batches` (all of one schema, at least one), sorted by `row_id`, to a Parquet
    /// file.
    pub fn write_parquet(&self, batches: &[RecordBatch], path: &Path) -> Result<u64> {
        let staged = scan::Registered::new(batches.to_vec());
        self.copy_to_parquet(
            &format!("SELECT * FROM {} ORDER BY row_id", staged.scan_sql()),
            path,
        )
    }

    /// Runs statements that return no rows (`op` names them in an error).
    pub fn execute(&self, sql: &str, op: &str) -> Result<()> {
        self.conn
            .execute_batch(sql)
            .map_err(Error::duckdb(op.to_string()))
    }

    /// Closes the database around what a user's query may touch (docs/security.md, "query"):
    /// no file but `readable` (the views' files) and `output` (a Parquet result) can be opened,
    /// no extension installed or loaded, and no setting changed after this.
    pub fn seal(&self, readable: &[&str], output: Option<&Path>) -> Result<()> {
        let mut paths: Vec<String> = readable
            .iter()
            .map(|p| format!("'{}'", sql_string(p)))
            .collect();
        if let Some(p) = output {
            paths.push(format!("'{}'", sql_string(&p.display().to_string())));
        }
        self.conn
            .execute_batch(&format!(
                "SET allowed_paths = [{}]; SET enable_external_access = false; \
                 SET autoinstall_known_extensions = false; SET autoload_known_extensions = false; \
                 SET lock_configuration = true;",
                paths.join(", ")
            ))
            .map_err(Error::duckdb("seal the query's database"))
    }

    /// Runs one statement of a user's, a query (it is read as a subquery: a second statement,
    /// or one that is not a query, fails to parse), handing each result batch to `each`, and
    /// returns the result's schema. DuckDB's complaint about the statement is
    /// [`Error::Query`], on one line.
    pub fn stream(
        &self,
        sql: &str,
        mut each: impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<arrow::datatypes::SchemaRef> {
        let query = |e: duckdb::Error| Error::Query {
            message: one_line(&e.to_string()),
        };
        // duckdb-rs runs every statement before a text's last when preparing it; as a
        // subquery there is only one. On lines of its own: a line comment ending the
        // statement must not swallow the `)`.
        let sql = format!("SELECT * FROM (\n{sql}\n)");
        let mut stmt = self.conn.prepare(&sql).map_err(query)?;
        stmt.execute([]).map_err(query)?;
        while let Some(rows) = stmt.step().map_err(query)? {
            each(&RecordBatch::from(&rows))?;
        }
        Ok(stmt.schema())
    }

    /// Writes the result of a user's statement to a Parquet file (zstd), returning the rows;
    /// DuckDB's complaint about the statement is [`Error::Query`], on one line.
    pub fn export_parquet(&self, sql: &str, path: &Path) -> Result<u64> {
        let select = sql.trim().trim_end_matches(';');
        // On lines of its own: a line comment ending the statement must not swallow the `)`.
        // Straight to `path` (the caller's own temporary name), the one file a sealed
        // database may write.
        let copy = format!(
            "COPY (\n{select}\n) TO '{}' (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, USE_TMP_FILE false)",
            sql_string(&path.display().to_string())
        );
        let rows = self.conn.execute(&copy, []).map_err(|e| Error::Query {
            message: one_line(&e.to_string()),
        })?;
        Ok(rows as u64)
    }

    /// Creates (or replaces) temporary view `name` as `select`.
    pub fn create_view(&self, name: &str, select: &str) -> Result<()> {
        self.conn
            .execute_batch(&format!(
                "CREATE OR REPLACE TEMP VIEW {} AS {select}",
                quote_ident(name)
            ))
            .map_err(Error::duckdb(format!("create view {name}")))
    }

    /// Drops a temporary view.
    pub fn drop_view(&self, name: &str) -> Result<()> {
        self.conn
            .execute_batch(&format!("DROP VIEW IF EXISTS {}", quote_ident(name)))
            .map_err(Error::duckdb(format!("drop view {name}")))
    }
}

/// The current state of the lake rows in `scan` (a relation of lake rows, any column
/// generations) by the read rule (docs/design.md §3.1.5): per `row_id` the copy with the highest
/// `changed_at` and, on a tie, the tombstone; the row is dropped when that copy is a tombstone.
/// `QUALIFY` filters after the ranking, so the tombstone test sees only winners, and the rank
/// is never a column: a lake column of any name keeps its values (docs/hazards.md R6).
pub fn current_state(scan: &str) -> String {
    format!(
        "SELECT * FROM {scan} QUALIFY row_number() OVER (PARTITION BY row_id \
         ORDER BY changed_at DESC, COALESCE(deleted_at, 0) DESC) = 1 AND COALESCE(deleted_at, 0) = 0"
    )
}

/// DuckDB's multi-line message on one line: the caret drawing under the echoed SQL dropped,
/// the rest joined.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("LINE ") && !l.chars().all(|c| c == '^'))
        .collect();
    lines.join(" ")
}

/// The two views of a schema over the Parquet files at `uris`: `<name>__history`, every copy
/// read by column name (later files may add columns), and `<name>`, its current state. `temp`
/// makes them temporary (a query's own connection); `view` prints them permanent for a user's
/// database. With no file, the history is an empty relation of the system columns.
///
/// DuckDB would take a `key=value` directory on a path for a Hive partition (a column whose
/// value comes from the path, overriding the file's own) and `*`, `?` or `[` for a file
/// pattern: partitioning is switched off, and a path holding a pattern character is refused
/// (docs/hazards.md R10).
pub fn schema_views<'a>(
    name: &str,
    uris: impl IntoIterator<Item = &'a str>,
    temp: bool,
) -> Result<String> {
    let history = quote_ident(&format!("{name}__history"));
    let mut list = Vec::new();
    for u in uris {
        if let Some(c) = u.chars().find(|c| matches!(c, '*' | '?' | '[')) {
            return Err(Error::Config(format!(
                "the lake file {u:?} holds {c:?}, which DuckDB reads as a file pattern: move the lake (or the query cache, --cache-dir) to a path without *, ? or ["
            )));
        }
        list.push(format!("'{}'", sql_string(u)));
    }
    let scan = if list.is_empty() {
        "SELECT NULL::UUID AS row_id, NULL::BIGINT AS changed_at, NULL::BIGINT AS deleted_at WHERE false"
            .to_string()
    } else {
        format!(
            "SELECT * FROM read_parquet([{}], union_by_name = true, hive_partitioning = false)",
            list.join(", ")
        )
    };
    let create = if temp {
        "CREATE OR REPLACE TEMP VIEW"
    } else {
        "CREATE OR REPLACE VIEW"
    };
    Ok(format!(
        "{create} {history} AS {scan};\n{create} {} AS {};",
        quote_ident(name),
        current_state(&history)
    ))
}

pub use crate::config::{quote_ident, sql_string};
pub use writer::write_lake_file;

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes one lake-shaped file of `(row_id, changed_at, deleted_at, name)` rows.
    fn file(engine: &Engine, dir: &Path, name: &str, rows: &str) -> PathBuf {
        let path = dir.join(name);
        engine
            .conn
            .execute_batch(&format!(
                "COPY (SELECT row_id::UUID AS row_id, changed_at::BIGINT AS changed_at, \
                 deleted_at::BIGINT AS deleted_at, name FROM (VALUES {rows}) \
                 t(row_id, changed_at, deleted_at, name)) TO '{}' (FORMAT parquet)",
                path.display()
            ))
            .unwrap();
        path
    }

    #[test]
    fn a_statement_ending_in_a_line_comment_exports_whole() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let path = dir.path().join("out.parquet");
        let rows = engine
            .export_parquet("SELECT 1 AS a UNION ALL SELECT 2 -- the last line", &path)
            .unwrap();
        assert_eq!(rows, 2);
        let n: i64 = engine
            .conn
            .query_row(
                &format!("SELECT sum(a) FROM '{}'", path.display()),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 3);
    }

    /// docs/hazards.md R10: a lake under a `key=value` directory keeps its files' own values
    /// (no Hive partition column from the path), and a path DuckDB would expand as a pattern
    /// is refused, never read as one.
    #[test]
    fn a_lake_path_is_a_path_not_a_partition_or_a_pattern() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let a = "'00000000-0000-0000-0000-00000000000a'";
        let under = dir.path().join("name=acme");
        std::fs::create_dir(&under).unwrap();
        let path = file(
            &engine,
            &under,
            "f.parquet",
            &format!("({a}, 5, 0, 'globex')"),
        );
        let views = schema_views("s", [path.to_str().unwrap()], true).unwrap();
        engine.conn.execute_batch(&views).unwrap();
        let got: String = engine
            .conn
            .query_row(
                "SELECT name || ':' || (SELECT string_agg(column_name, ',') FROM (DESCRIBE s)) FROM s",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(got, "globex:row_id,changed_at,deleted_at,name");

        // `g[1]` is a pattern that `g1` matches: the look-alike must not be read instead.
        for name in ["g[1]", "g?", "g*"] {
            let err = schema_views("s", [format!("/l/{name}/f.parquet").as_str()], true)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("DuckDB reads as a file pattern") && err.contains(name),
                "{err}"
            );
        }
    }

    /// docs/hazards.md R6: a lake column named like the helper column the readers' SQL once
    /// had (`lakecdc_rn`) keeps its values and hides nothing: each row is still its newest copy,
    /// and the view has exactly the file's columns.
    #[test]
    fn a_column_of_any_name_keeps_its_values_in_the_current_state() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let path = dir.path().join("f.parquet");
        let (a, b) = (
            "'00000000-0000-0000-0000-00000000000a'",
            "'00000000-0000-0000-0000-00000000000b'",
        );
        engine
            .conn
            .execute_batch(&format!(
                "COPY (SELECT row_id::UUID AS row_id, changed_at::BIGINT AS changed_at, \
                 deleted_at::BIGINT AS deleted_at, v::BIGINT AS lakecdc_rn FROM (VALUES \
                 ({a}, 5, 0, 1), ({a}, 6, 0, 7), ({b}, 3, 0, 42)) t(row_id, changed_at, deleted_at, v)) \
                 TO '{}' (FORMAT parquet)",
                path.display()
            ))
            .unwrap();
        let scan = format!("read_parquet(['{}'], union_by_name = true)", path.display());
        let state = current_state(&scan);
        let got: String = engine
            .conn
            .query_row(
                &format!(
                    "SELECT string_agg(right(row_id::VARCHAR, 1) || '=' || lakecdc_rn, ',' \
                     ORDER BY row_id) FROM ({state})"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(got, "a=7,b=42");
        let columns: String = engine
            .conn
            .query_row(
                &format!("SELECT string_agg(column_name, ',') FROM (DESCRIBE {state})"),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(columns, "row_id,changed_at,deleted_at,lakecdc_rn");
    }

    /// docs/hazards.md L28: a live copy and a tombstone with the same version — whichever file
    /// lists it first — read as no row in the readers' SQL (`view`, `query`); the newer of two
    /// versions wins whatever its file.
    #[test]
    fn a_tombstone_beats_a_live_copy_of_the_same_version() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(&EngineConfig::default()).unwrap();
        let a = "'00000000-0000-0000-0000-00000000000a'";
        let b = "'00000000-0000-0000-0000-00000000000b'";
        let live = file(
            &engine,
            dir.path(),
            "live.parquet",
            &format!("({a}, 5, 0, 'live a'), ({b}, 7, 0, 'new b')"),
        );
        let dead = file(
            &engine,
            dir.path(),
            "dead.parquet",
            &format!("({a}, 5, 5, 'dead a'), ({b}, 6, 6, 'old dead b')"),
        );
        for (order, sources) in [
            ("live first", [&live, &dead]),
            ("tombstone first", [&dead, &live]),
        ] {
            let list: Vec<String> = sources
                .iter()
                .map(|p| format!("'{}'", p.display()))
                .collect();
            let scan = format!("read_parquet([{}], union_by_name = true)", list.join(", "));
            let names: String = engine
                .conn
                .query_row(
                    &format!(
                        "SELECT string_agg(name, ',') FROM ({})",
                        current_state(&scan)
                    ),
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(names, "new b", "{order}");
        }
    }
}

//! DuckDB, in process: opened with bounded threads, memory and a spill directory, and used to
//! turn Arrow batches into lake Parquet files. DuckDB types never leave this module. Callers on
//! an async runtime run these blocking calls inside `spawn_blocking`.

use std::path::{Path, PathBuf};

use arrow::record_batch::RecordBatch;
use duckdb::Connection;

use crate::error::{Error, Result};

/// Rows per Parquet row group (DuckDB's default granularity, DESIGN §3.1).
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 2,
            memory_limit: "1GB".to_string(),
            temp_directory: None,
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
            "SET threads = {}; SET memory_limit = '{}'; SET preserve_insertion_order = false;",
            cfg.threads.max(1),
            cfg.memory_limit.replace('\'', "''")
        );
        if let Some(dir) = &cfg.temp_directory {
            setup.push_str(&format!(
                " SET temp_directory = '{}';",
                dir.display().to_string().replace('\'', "''")
            ));
        }
        conn.execute_batch(&setup)
            .map_err(Error::duckdb("configure"))?;
        Ok(Self { conn })
    }

    /// The value of a DuckDB setting, as text.
    pub fn setting(&self, name: &str) -> Result<String> {
        self.conn
            .query_row("SELECT current_setting(?)::VARCHAR", [name], |r| r.get(0))
            .map_err(Error::duckdb(format!("read setting {name}")))
    }

    /// Writes `batches` to a Parquet file at `path`, sorted by `row_id`, with the lake's file
    /// options (zstd level 3, V2 pages, 122,880-row groups). `columns` gives each output column
    /// and its DuckDB type; `row_id` arrives as text and is stored as a 16-byte UUID. Returns
    /// the number of rows written.
    pub fn write_parquet(
        &self,
        columns: &[(String, String)],
        batches: &[RecordBatch],
        path: &Path,
    ) -> Result<u64> {
        let staging: Vec<String> = columns
            .iter()
            .map(|(name, ty)| {
                let ty = if ty == "UUID" { "VARCHAR" } else { ty.as_str() };
                format!("{} {ty}", quote_ident(name))
            })
            .collect();
        self.conn
            .execute_batch(&format!(
                "CREATE OR REPLACE TEMP TABLE lakecdc_stage ({})",
                staging.join(", ")
            ))
            .map_err(Error::duckdb("create staging table"))?;
        {
            let mut app = self
                .conn
                .appender("lakecdc_stage")
                .map_err(Error::duckdb("open appender"))?;
            for batch in batches {
                app.append_record_batch(batch.clone())
                    .map_err(Error::duckdb("append batch"))?;
            }
            app.flush().map_err(Error::duckdb("flush appender"))?;
        }
        let select: Vec<String> = columns
            .iter()
            .map(|(name, ty)| {
                let q = quote_ident(name);
                if ty == "UUID" {
                    format!("CAST({q} AS UUID) AS {q}")
                } else {
                    q
                }
            })
            .collect();
        let sql = format!(
            "COPY (SELECT {} FROM lakecdc_stage ORDER BY row_id) TO '{}' (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL {ZSTD_LEVEL}, PARQUET_VERSION V2, ROW_GROUP_SIZE {ROW_GROUP_SIZE})",
            select.join(", "),
            path.display().to_string().replace('\'', "''")
        );
        let rows = self
            .conn
            .execute(&sql, [])
            .map_err(Error::duckdb("write parquet"))?;
        self.conn
            .execute_batch("DROP TABLE lakecdc_stage")
            .map_err(Error::duckdb("drop staging table"))?;
        Ok(rows as u64)
    }
}

/// Quotes a DuckDB identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

//! The crate's error type. Variants say what the caller must decide (not found, conflict,
//! ambiguous commit, busy lock, bad configuration); context is owned data and the original
//! cause is kept as `#[source]`, never formatted into the message, so secrets in driver text
//! cannot leak through `Display` of the outer error.

use std::path::PathBuf;

use crate::store::StoreError;

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure lakecdc reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid configuration or usage; the message names the setting and the fix.
    #[error("{0}")]
    Config(String),

    /// Schema metadata (the schema directory) is missing or invalid.
    #[error("{path}: {message}")]
    Metadata {
        /// The file that is wrong or missing.
        path: PathBuf,
        /// What is wrong with it, naming the attribute when there is one.
        message: String,
    },

    /// An object-store operation failed.
    #[error("{op} {key}: {source}")]
    Storage {
        /// What lakecdc was doing.
        op: &'static str,
        /// The object key involved.
        key: String,
        /// The store's classified error.
        #[source]
        source: StoreError,
    },

    /// A manifest write was rejected by its precondition: another writer committed first.
    /// The write provably did not happen.
    #[error("manifest {key} was changed by another writer ({attempts} attempts)")]
    ManifestConflict {
        /// The manifest key.
        key: String,
        /// How many conditional writes were tried.
        attempts: u32,
    },

    /// A manifest write failed in a way that does not prove it did not land.
    #[error("manifest {key}: the write may or may not have been committed: {source}")]
    AmbiguousCommit {
        /// The manifest key.
        key: String,
        /// The underlying store error.
        #[source]
        source: StoreError,
    },

    /// A manifest exists but cannot be used (malformed, foreign schema stamp, unstamped).
    #[error("manifest {key}: {message}")]
    Manifest {
        /// The manifest key.
        key: String,
        /// What is wrong, and what to do.
        message: String,
    },

    /// The schema's advisory lock is held by another session.
    #[error("schema {schema_id} is locked by another lakecdc process")]
    LockBusy {
        /// The schema id.
        schema_id: i16,
    },

    /// A PostgreSQL operation failed.
    #[error("postgres: {op}: {source}")]
    Postgres {
        /// What lakecdc was doing.
        op: String,
        /// The driver error (already free of connection secrets).
        #[source]
        source: tokio_postgres::Error,
    },

    /// A PostgreSQL operation did not finish in time.
    #[error("postgres: {op}: timed out after {seconds}s")]
    PostgresTimeout {
        /// What lakecdc was doing.
        op: String,
        /// The limit that was exceeded.
        seconds: u64,
    },

    /// A DuckDB operation failed.
    #[error("duckdb: {op}: {source}")]
    DuckDb {
        /// What lakecdc was doing.
        op: String,
        /// The engine error.
        #[source]
        source: duckdb::Error,
    },

    /// A Parquet file does not have the shape lakecdc requires.
    #[error("parquet {path}: {message}")]
    Parquet {
        /// The file (local path or object key).
        path: String,
        /// What is wrong.
        message: String,
    },

    /// A local file-system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What lakecdc was doing.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// An internal invariant does not hold; a bug or a corrupted input.
    #[error("invariant violated: {0}")]
    Invariant(String),

    /// The session holding a schema's lock ended while a job worked under it; what the job
    /// prepared was not published.
    #[error("the lock of schema {schema_id} was lost (its session ended); nothing was published")]
    LockLost {
        /// The schema.
        schema_id: i16,
        /// Why the session is gone.
        #[source]
        source: Box<Error>,
    },

    /// A stop was requested (SIGTERM/SIGINT) while a job could still give up its work
    /// without publishing anything.
    #[error("stop requested (SIGTERM/SIGINT)")]
    Stopped,
}

impl Error {
    /// The process exit code for this error: 2 for usage and configuration problems, 1 for
    /// everything else (DESIGN §5).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::Metadata { .. } => 2,
            _ => 1,
        }
    }

    /// Shorthand for building a configuration error.
    pub fn config(message: impl Into<String>) -> Self {
        Error::Config(message.into())
    }

    /// Wraps a PostgreSQL driver error with the operation that failed.
    pub fn postgres(op: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> Self {
        let op = op.into();
        move |source| Error::Postgres { op, source }
    }

    /// Wraps a DuckDB error with the operation that failed.
    pub fn duckdb(op: impl Into<String>) -> impl FnOnce(duckdb::Error) -> Self {
        let op = op.into();
        move |source| Error::DuckDb { op, source }
    }

    /// Wraps a store error with the operation and key.
    pub fn storage(op: &'static str, key: impl Into<String>) -> impl FnOnce(StoreError) -> Self {
        let key = key.into();
        move |source| Error::Storage { op, key, source }
    }

    /// The full cause chain on one line, for the CLI's single error line.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(err) = cur {
            let text = err.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cur = err.source();
        }
        out
    }
}

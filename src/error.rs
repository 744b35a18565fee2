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
    /// A setting's value is invalid, or one the job needs is missing. `setting` is its key
    /// (the config-file key, which the binary shows as its flag); `reason` says what is wrong
    /// and how to fix it.
    #[error("{setting} {reason}")]
    Setting {
        /// The setting's key.
        setting: String,
        /// What is wrong with its value, and the fix.
        reason: String,
    },

    /// Invalid configuration or usage not tied to one setting (credentials, a connection
    /// string's syntax, the config file); the message says what and the fix.
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
    #[error("{op} {key}")]
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

    /// The manifest names another database than the one this run reads (docs/design.md §10):
    /// nothing is written.
    #[error(
        "manifest {key} was written from {lake}, but this run reads {this}: point --pg-url at the lake's database, or pass --adopt-source after a restore or migration (then run verify --source --repair)"
    )]
    ForeignSource {
        /// The manifest key.
        key: String,
        /// The source the manifest names.
        lake: String,
        /// The source this run reads.
        this: String,
    },

    /// A manifest write failed in a way that does not prove it did not land.
    #[error("manifest {key}: the write may or may not have been committed")]
    AmbiguousCommit {
        /// The manifest key.
        key: String,
        /// The underlying store error.
        #[source]
        source: StoreError,
    },

    /// The save that would list new objects failed in a way that does not prove it did not
    /// land: the objects are kept (the manifest may list them).
    #[error(
        "manifest {key}: the save of the new files {object} may or may not have landed; they are kept — run verify/inspect before compacting again"
    )]
    AmbiguousPublish {
        /// The manifest key.
        key: String,
        /// The objects the save would list (comma-separated).
        object: String,
        /// The underlying store error.
        #[source]
        source: StoreError,
    },

    /// DuckDB refused a query's SQL (`lakecdc query`): its message, on one line.
    #[error("query: {message}")]
    Query {
        /// DuckDB's message.
        message: String,
    },

    /// A lake object read for a query is not what the manifest says (size or SHA-256): it was
    /// not used, and nothing of it was cached.
    #[error(
        "lake object {key} fails its check: {message}; nothing was read from it (run lakecdc verify)"
    )]
    Unverified {
        /// The object key.
        key: String,
        /// What differs.
        message: String,
    },

    /// A manifest exists but cannot be used (malformed, foreign schema stamp, unstamped).
    #[error("manifest {key}: {message}")]
    Manifest {
        /// The manifest key.
        key: String,
        /// What is wrong, and what to do.
        message: String,
    },

    /// A time-travel read (`--as-of`) cannot be answered: the schema has no manifest, the
    /// version is newer than the live one, it is past the history retention, or its history
    /// copy is missing. The message names the versions kept.
    #[error("schema {schema_id}: --as-of {as_of} {message}")]
    AsOf {
        /// The `--as-of` asked for, as a version or an RFC3339 time.
        as_of: String,
        /// The schema.
        schema_id: i16,
        /// Why it cannot be read, and what is kept.
        message: String,
    },

    /// Two schemas of the lake would be one DuckDB view (DuckDB's names ignore case, and each
    /// schema also has a `<name>__history` view): a reader refuses rather than let the second
    /// view silently replace the first (docs/hazards.md R7).
    #[error(
        "schemas {first} (id {first_id}) and {second} (id {second_id}) would both be the view {view} (DuckDB's names ignore case): read them one at a time with --schema, or rename one in the registry"
    )]
    ViewNameClash {
        /// The first schema's name, escaped for one line.
        first: String,
        /// Its id.
        first_id: i16,
        /// The second schema's name, escaped.
        second: String,
        /// Its id.
        second_id: i16,
        /// The view name both would make, escaped.
        view: String,
    },

    /// A lake object is larger than lakecdc reads: refused before it was read (or, when it grew
    /// while being read, before it was used), or a save that would make it so.
    #[error(
        "{what} {key} is at least {size} bytes, over the limit of {limit} bytes: {}",
        too_large_end(*.saving, .why)
    )]
    TooLarge {
        /// What the object is (`manifest`, `gc state`, `compaction source`).
        what: &'static str,
        /// The object key.
        key: String,
        /// Its size (or, when reading stopped at the limit, the bytes seen so far).
        size: u64,
        /// The most lakecdc reads of it.
        limit: u64,
        /// Where the limit comes from, and what to do.
        why: String,
        /// A save that would have made the object this large (nothing was written), not a read.
        saving: bool,
    },

    /// A local directory has less free space than a step needs; nothing was written to it.
    #[error(
        "{path} has {free} bytes free, but {step} needs {needed}: free space there or point --work-dir elsewhere"
    )]
    NoSpace {
        /// The directory.
        path: PathBuf,
        /// The step that needs the space.
        step: &'static str,
        /// Bytes needed.
        needed: u64,
        /// Bytes free.
        free: u64,
    },

    /// The schema's advisory lock is held by another session.
    #[error("schema {schema_id} is locked by another lakecdc process")]
    LockBusy {
        /// The schema id.
        schema_id: i16,
    },

    /// A PostgreSQL operation failed.
    #[error("postgres: {op}")]
    Postgres {
        /// What lakecdc was doing.
        op: String,
        /// The driver error (already free of connection secrets).
        #[source]
        source: tokio_postgres::Error,
    },

    /// No PostgreSQL session could be opened: the last target's failure (a socket, the
    /// startup exchange, `target_session_attrs`).
    #[error("postgres: {op}")]
    PostgresConnect {
        /// What lakecdc was doing (`connect to user@host:port/db`, never the password).
        op: String,
        /// Why the last target gave no session.
        #[source]
        source: ConnectAttempt,
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
    #[error("duckdb: {op}")]
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
    #[error("{op} {path}")]
    Io {
        /// What lakecdc was doing.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// Data read from PostgreSQL does not have the shape lakecdc asked for (a protocol or a
    /// value that cannot be decoded); nothing built from it is published.
    #[error("{op}: {message}")]
    Decode {
        /// What lakecdc was reading.
        op: String,
        /// What is wrong with the data.
        message: String,
    },

    /// An Arrow operation on rows in memory failed.
    #[error("arrow: {op}")]
    Arrow {
        /// What lakecdc was doing.
        op: String,
        /// The Arrow error.
        #[source]
        source: arrow::error::ArrowError,
    },

    /// A JSON document lakecdc writes could not be serialised.
    #[error("serialising {what}")]
    Json {
        /// The document.
        what: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A task running a step on another thread panicked or was cancelled.
    #[error("{op} task failed")]
    Task {
        /// The step the task ran.
        op: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },

    /// Metrics could not be published (docs/operations.md, "Metrics"); the job itself ran.
    #[error("cannot {op} {target}: {reason}")]
    Metrics {
        /// What was being done.
        op: &'static str,
        /// The file or the Pushgateway (its URL without credentials).
        target: String,
        /// Why, with the fix when there is one.
        reason: String,
    },

    /// An internal invariant does not hold: a bug in lakecdc.
    #[error("invariant violated: {0}")]
    Invariant(String),

    /// The session holding a schema's lock ended while a job worked under it; what the job
    /// prepared was not published.
    #[error(
        "the lock of schema {schema_id} was lost (its session ended); what was prepared under it \
         was not published, and a rerun takes it up"
    )]
    LockLost {
        /// The schema.
        schema_id: i16,
        /// Why the session is gone.
        #[source]
        source: Box<Error>,
    },

    /// A staged object waited longer than its lease to be listed: gc may already treat it as
    /// an orphan, so it is not published.
    #[error(
        "the new base {key} was staged {staged_s}s ago ({wall_s}s by the wall clock), longer than the {lease_s}s lease (a slow store, a suspended host, a clock step?): gc may already treat it as an orphan, so it is not published; run compact again, with a lower --max-rewrite-bytes if its passes keep taking this long"
    )]
    LeaseExpired {
        /// The staged object.
        key: String,
        /// Seconds since staging, by the monotonic clock.
        staged_s: u64,
        /// Seconds since staging, by the wall clock.
        wall_s: u64,
        /// The lease.
        lease_s: u64,
    },

    /// The backend that took a schema's lock is no longer its holder.
    #[error("backend {backend_pid} no longer holds the advisory lock")]
    LockNotHeld {
        /// The backend that took the lock.
        backend_pid: i32,
    },

    /// A stop was requested (SIGTERM/SIGINT) while a job could still give up its work
    /// without publishing anything.
    #[error("stop requested (SIGTERM/SIGINT)")]
    Stopped,
}

impl Error {
    /// The process exit code for this error: 2 for usage and configuration problems, 1 for
    /// everything else (docs/design.md §5).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_)
            | Error::Setting { .. }
            | Error::Metadata { .. }
            | Error::Query { .. }
            | Error::AsOf { .. }
            | Error::ViewNameClash { .. } => 2,
            _ => 1,
        }
    }

    /// Shorthand for building a configuration error not tied to one setting.
    pub fn config(message: impl Into<String>) -> Self {
        Error::Config(message.into())
    }

    /// A setting's value is wrong: `setting` is its key, `reason` what is wrong and the fix.
    pub fn setting(setting: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Setting {
            setting: setting.into(),
            reason: reason.into(),
        }
    }

    /// Wraps an Arrow error with the operation that failed.
    pub fn arrow(op: impl Into<String>) -> impl FnOnce(arrow::error::ArrowError) -> Self {
        let op = op.into();
        move |source| Error::Arrow { op, source }
    }

    /// Wraps a failed task's join error with the step it ran.
    pub fn task(op: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| Error::Task { op, source }
    }

    /// Wraps a serialisation error with the document.
    pub fn json(what: &'static str) -> impl FnOnce(serde_json::Error) -> Self {
        move |source| Error::Json { what, source }
    }

    /// Builds a decode error for data read by `op`.
    pub fn decode(op: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Decode {
            op: op.into(),
            message: message.into(),
        }
    }

    /// Whether trying the same step again may succeed: a conflict lost to another writer, a
    /// timeout, or a storage failure that is not a refusal. Configuration, data and internal
    /// errors, and a commit that may have landed, are never retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::ManifestConflict { .. } | Error::PostgresTimeout { .. } => true,
            Error::Storage { source, .. } => source.is_retryable(),
            _ => false,
        }
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

    /// The full cause chain on one line, for the CLI's single error line: each cause is a
    /// `source`, never part of its parent's message, so every link is printed once.
    pub fn chain(&self) -> String {
        crate::report::printable(&causes(self), false).into_owned()
    }
}

/// `err` and its causes on one line, each `source` once (see [`Error::chain`]).
pub(crate) fn causes(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(err) = cur {
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}

/// Why one PostgreSQL target (a host, an address, a Unix socket) gave no session
/// (`src/source/socket.rs`).
#[derive(Debug, thiserror::Error)]
pub enum ConnectAttempt {
    /// The socket could not be opened (refused, unreachable, a name that does not resolve, the
    /// connect timeout).
    #[error("{target}: could not open a connection")]
    Socket {
        /// The target, never the password.
        target: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The driver's startup exchange failed (TLS, authentication, the server's refusal).
    #[error("{target}")]
    Startup {
        /// The target.
        target: String,
        /// The driver's error (free of connection secrets).
        #[source]
        source: tokio_postgres::Error,
    },
    /// The target gave no session within the connect timeout (its socket, the startup
    /// exchange and the `target_session_attrs` check together, as libpq counts it).
    #[error("{target}: no session within the connect timeout ({seconds}s)")]
    Timeout {
        /// The target.
        target: String,
        /// The limit.
        seconds: u64,
    },
    /// TLS was to be used on a target with no host name to verify or send (`hostaddr` alone).
    #[error("{target}: TLS needs a host name; give host= along with hostaddr=")]
    NoHostName {
        /// The target.
        target: String,
    },
    /// TLS was to be used over a Unix socket, where PostgreSQL never offers it.
    #[error(
        "{target}: PostgreSQL has no TLS over a Unix socket; connect over TCP for this sslmode, or use sslmode=prefer or disable"
    )]
    UnixTls {
        /// The socket path.
        target: String,
    },
    /// The session does not have the properties `target_session_attrs` asks for.
    #[error("{target}: the server is {found}, and target_session_attrs asks for {wanted}")]
    SessionAttrs {
        /// The target.
        target: String,
        /// What the server is (`read-only`, `read-write`).
        found: &'static str,
        /// What the connection string asks for.
        wanted: &'static str,
    },
    /// `sslmode=allow`: the plain attempt failed, then the TLS attempt.
    #[error("with TLS, after the plain connection failed ({plain})")]
    AllowBoth {
        /// The plain attempt's error with its causes (the guard's refusal, S7, is the one to
        /// fix).
        plain: String,
        /// The TLS attempt's error.
        #[source]
        tls: Box<ConnectAttempt>,
    },
    /// Every target of a host list failed: the last one's error, the others' in the text.
    #[error("{tried} hosts tried, none gave a session; before the last: {earlier}")]
    Hosts {
        /// How many targets were tried.
        tried: usize,
        /// The earlier targets' errors with their causes, in the order tried.
        earlier: String,
        /// The last target's error.
        #[source]
        last: Box<ConnectAttempt>,
    },
    /// The connection string names no host, or its host, hostaddr and port lists disagree.
    #[error("{0}")]
    Config(String),
}

impl ConnectAttempt {
    /// One error for the failures of every target tried, in order (libpq reports them all).
    pub(crate) fn every(mut failed: Vec<ConnectAttempt>) -> Self {
        let Some(last) = failed.pop() else {
            return Self::Config("the connection string names no host".into());
        };
        if failed.is_empty() {
            return last;
        }
        Self::Hosts {
            tried: failed.len() + 1,
            earlier: failed
                .iter()
                .map(|e| causes(e))
                .collect::<Vec<_>>()
                .join("; "),
            last: Box::new(last),
        }
    }

    /// The driver's error, when the startup exchange failed.
    pub(crate) fn driver(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Self::Startup { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The end of a [`Error::TooLarge`] message: what was not done, and why.
fn too_large_end(saving: bool, why: &str) -> String {
    match saving {
        true => format!("not saved ({why})"),
        false => format!("refusing to read it ({why})"),
    }
}

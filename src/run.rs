//! What the binary runs: one validating conversion from a command's merged settings
//! ([`crate::config::settings`]) to the typed options of its job, and one function that opens
//! the job's context, runs it and renders its report with the exit code it maps to
//! (docs/operations.md: 0 done, 1 failed, 2 usage or configuration error, 3 done but needs
//! attention).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::attach::AttachOptions;
use crate::clock::SystemClock;
use crate::compact::CompactOptions;
use crate::config::settings::{Command, Origin, Resolved};
use crate::config::{
    LakeLocation, TableName, Tables, parse_duration, parse_memory_limit, parse_ratio, parse_size,
    s3_endpoint_warning,
};
use crate::doctor::DoctorInputs;
use crate::engine::EngineConfig;
use crate::error::{Error, Result};
use crate::flush::FlushOptions;
use crate::gc::GcOptions;
use crate::init::InitOptions;
use crate::job::Context;
use crate::lake::manifest::CommitPolicy;
use crate::lake::{Lake, Layout, ReadLimits};
use crate::metrics::{MetricsOptions, Pushgateway, RunRecord, SchemaRun};
use crate::policy::{CompactThresholds, FlushThresholds};
use crate::query::{Destination, Format, QueryOptions, SqlSource};
use crate::requeue::{RequeueOptions, Selection};
use crate::shutdown::Shutdown;
use crate::source::connect::PG_ENV_VARS;
use crate::source::{Connector, PgSettings, conninfo};
use crate::store::s3::{S3Options, check_env_credentials};
use crate::verify::{SourceOptions, VerifyOptions};
use crate::view::ViewOptions;

/// The longest a PostgreSQL connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest one PostgreSQL statement may take.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(300);
/// The environment variables passed on to the clients lakecdc uses (libpq's PG* for the
/// connection, AWS's credentials, checked before an S3 lake is opened).
const AWS_CREDENTIALS: [&str; 2] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];

/// The variables [`Resolved::merge`] keeps for the jobs' own clients.
pub fn passed_env() -> Vec<&'static str> {
    PG_ENV_VARS
        .iter()
        .chain(AWS_CREDENTIALS.iter())
        .chain(["DATABASE_URL", "XDG_CACHE_HOME", "HOME"].iter())
        .copied()
        .collect()
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event.
    Json,
}

/// A job's typed options.
#[derive(Clone)]
pub enum Job {
    /// `init-db`.
    InitDb {
        /// Report only.
        dry_run: bool,
        /// Print the DDL; connect to nothing.
        print_sql: bool,
    },
    /// `init`.
    Init(Box<InitOptions>),
    /// `flush`.
    Flush(Box<FlushOptions>),
    /// `compact`.
    Compact(Box<CompactOptions>),
    /// `gc`.
    Gc(GcOptions),
    /// `verify`.
    Verify(VerifyOptions),
    /// `inspect`, judging with these thresholds.
    Inspect(FlushThresholds, CompactThresholds),
    /// `lakecdc view`.
    View(ViewOptions),
    /// `lakecdc query`.
    Query(Box<QueryOptions>),
    /// `lakecdc requeue`.
    Requeue(RequeueOptions),
    /// `lakecdc attach`; `print_sql` prints its script instead.
    Attach {
        /// What to attach.
        opts: AttachOptions,
        /// Print the script; change nothing.
        print_sql: bool,
    },
    /// `lakecdc detach`.
    Detach {
        /// The table.
        table: TableName,
        /// Report only.
        dry_run: bool,
    },
    /// `lakecdc doctor`.
    Doctor,
}

/// Everything validated before any connection is opened.
#[derive(Clone)]
pub struct RunConfig {
    /// PostgreSQL.
    pub connector: Connector,
    /// Source tables.
    pub tables: Tables,
    /// Where the lake is.
    pub lake: LakeLocation,
    /// Its key layout.
    pub layout: Layout,
    /// S3 client settings.
    pub s3: S3Options,
    /// The schema directory.
    pub schema_dir: Option<PathBuf>,
    /// The schemas named (all when empty).
    pub schemas: Vec<String>,
    /// Print the report as JSON.
    pub json: bool,
    /// Log format on stderr.
    pub log_format: LogFormat,
    /// The job.
    pub job: Job,
    /// How large the lake's metadata objects may be read.
    pub limits: ReadLimits,
    /// Warnings about the configuration (an exposed password, a plain-text endpoint), logged
    /// once when the job starts.
    pub warnings: Vec<String>,
    /// Writers take over a lake whose manifests name another source database.
    pub adopt_source: bool,
    /// How long a job waits for a held schema lock (`--lock-wait`).
    pub lock_wait: Duration,
    /// The command run.
    pub command: Command,
    /// Where the run's metrics go.
    pub metrics: MetricsOptions,
}

impl RunConfig {
    /// The one validating conversion: every value is checked here, before anything runs.
    pub fn from_settings(s: &Resolved) -> Result<Self> {
        let connector = connector(s)?;
        let table = |key: &str| TableName::parse(key, s.text(key)?);
        let tables = Tables {
            registry: table("registry-table")?,
            entity: table("entity-table")?,
            eav: table("eav-table")?,
            change_log: table("change-log-table")?,
        };
        let lake = LakeLocation::parse(s.text("lake")?)?;
        let layout = Layout::new(
            lake.root(),
            s.text("data-prefix")?,
            s.text("manifest-template")?,
        )?
        .with_history_retention(duration(s, "history-retention")?);
        let mut s3 = S3Options::new("");
        s3.endpoint = s.get("s3-endpoint").map(str::to_string);
        s3.path_style = s.flag("s3-path-style");
        s3.region = s.get("s3-region").map(str::to_string);
        if matches!(lake, LakeLocation::S3 { .. }) {
            let [key, secret] = AWS_CREDENTIALS.map(|k| s.env.get(k).map(String::as_str));
            check_env_credentials(key, secret).map_err(Error::Config)?;
        }
        let schema_dir = s.path("schema-dir");
        if let Some(dir) = schema_dir.as_ref().filter(|d| !d.is_dir()) {
            return Err(Error::setting(
                "schema-dir",
                format!("{} is not a directory", dir.display()),
            ));
        }
        let log_format = match s.text("log-format")? {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(Error::setting(
                    "log-format",
                    format!("{other:?} is not one of text, json"),
                ));
            }
        };
        let schemas = s.list("schema");
        let mut warnings = s.warnings.clone();
        let metrics = metrics(s, &mut warnings)?;
        Ok(Self {
            connector,
            tables,
            lake,
            layout,
            s3,
            schema_dir,
            json: s.flag("json"),
            log_format,
            job: job(s, &schemas)?,
            schemas,
            limits: read_limits(s)?,
            warnings,
            adopt_source: s.flag("adopt-source"),
            lock_wait: match s.get("lock-wait") {
                Some(_) => duration(s, "lock-wait")?,
                None => Duration::ZERO,
            },
            command: s.command,
            metrics,
        })
    }

    /// Opens the job's context: the lake, a clock, and a stop flag raised by SIGTERM/SIGINT.
    async fn context(&self) -> Result<Context> {
        self.warn_of_endpoint();
        let lake = Lake::open(&self.lake, self.layout.clone(), &self.s3)
            .await?
            .with_limits(self.limits);
        let shutdown = Shutdown::new();
        crate::shutdown::watch_signals(shutdown.clone());
        Ok(Context {
            connector: self.connector.clone(),
            tables: self.tables.clone(),
            schema_dir: self.schema_dir.clone(),
            lake,
            clock: Arc::new(SystemClock),
            shutdown,
            adopt_source: self.adopt_source,
            lock_wait: self.lock_wait,
        })
    }
}

impl RunConfig {
    /// Logs a warning about a plain-text S3 endpoint.
    fn warn_of_endpoint(&self) {
        if matches!(self.lake, LakeLocation::S3 { .. })
            && let Some(w) = (self.s3.endpoint.as_deref()).and_then(s3_endpoint_warning)
        {
            tracing::warn!("{w}");
        }
    }

    /// What `doctor` checks: the lake is opened here like [`RunConfig::context`] opens it, but
    /// a failure to open it is handed over, to be reported as a failed check.
    async fn doctor_inputs(&self) -> DoctorInputs {
        self.warn_of_endpoint();
        let lake = Lake::open(&self.lake, self.layout.clone(), &self.s3)
            .await
            .map(|l| l.with_limits(self.limits));
        DoctorInputs {
            connector: self.connector.clone(),
            tables: self.tables.clone(),
            schema_dir: self.schema_dir.clone(),
            schemas: self.schemas.clone(),
            lake,
            clock: Arc::new(SystemClock),
            adopt_source: self.adopt_source,
        }
    }
}

fn connector(s: &Resolved) -> Result<Connector> {
    // Secrets never come from flags: any user of the host can read a command line.
    let pg_url = s.get("pg-url");
    if s.origin("pg-url") == Some(&Origin::Flag) && pg_url.is_some_and(conninfo::has_password) {
        return Err(Error::setting(
            "pg-url",
            "carries a password, which other users of this host can read in its process list: put the connection string in LAKECDC_PG_URL (or the password in PGPASSWORD) instead",
        ));
    }
    let copy_tap = match s.text("copy-tap")? {
        "on" => true,
        "off" => false,
        other => {
            return Err(Error::setting(
                "copy-tap",
                format!("{other:?} is not one of on, off"),
            ));
        }
    };
    let env = PG_ENV_VARS
        .iter()
        .filter_map(|k| s.env.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let settings = PgSettings {
        conninfo: pg_url
            .map(str::to_string)
            .or_else(|| s.env.get("DATABASE_URL").cloned()),
        env,
        application_name: "lakecdc".to_string(),
        connect_timeout: CONNECT_TIMEOUT,
        statement_timeout: STATEMENT_TIMEOUT,
    };
    Ok(Connector::new(&settings)?.with_copy_tap(copy_tap))
}

/// Where the run's metrics go: the file's directory must exist; a Pushgateway URL with a
/// password is refused on the command line (as `--pg-url`'s is); the instance label must be
/// URL-safe (it is a path segment of the push).
fn metrics(s: &Resolved, warnings: &mut Vec<String>) -> Result<MetricsOptions> {
    let file = s.path("metrics-file");
    if let Some(template) = &file {
        let path = crate::metrics::textfile::path_for(template, s.command.name());
        let dir = crate::metrics::textfile::directory_of(&path);
        if !dir.is_dir() {
            return Err(Error::setting(
                "metrics-file",
                format!(
                    "names a file in {}, which is not a directory: create it or fix the path",
                    dir.display()
                ),
            ));
        }
        if let Some(why) = crate::metrics::textfile::occupied(&path) {
            return Err(Error::setting("metrics-file", why));
        }
        if path.extension().is_none_or(|e| e != "prom") {
            warnings.push(format!(
                "--metrics-file {} does not end in .prom: node-exporter's textfile collector reads only *.prom files",
                path.display()
            ));
        }
    }
    let pushgateway = match s.get("pushgateway") {
        Some(url)
            if s.origin("pushgateway") == Some(&Origin::Flag) && Pushgateway::has_password(url) =>
        {
            return Err(Error::setting(
                "pushgateway",
                "carries a password, which other users of this host can read in its process list: put the URL in LAKECDC_PUSHGATEWAY instead",
            ));
        }
        Some(url) => Some(Pushgateway::parse(url).map_err(|reason| {
            Error::setting("pushgateway", format!("{reason}: give http(s)://host:port"))
        })?),
        None => None,
    };
    let instance = match s.get("metrics-instance") {
        Some(i) => i.to_string(),
        None => crate::metrics::host_name(),
    };
    if pushgateway.is_some() && !crate::metrics::is_url_safe(&instance) {
        return Err(Error::setting(
            "metrics-instance",
            format!("{instance:?} may hold only letters, digits, '.', '-', '_' and ':'"),
        ));
    }
    Ok(MetricsOptions {
        file,
        pushgateway,
        instance,
    })
}

fn engine(s: &Resolved) -> Result<(EngineConfig, PathBuf)> {
    let work_dir = work_dir(s)?;
    let threads = s.number::<usize>("threads")?.unwrap_or(1);
    Ok((
        EngineConfig {
            threads: threads.max(1),
            memory_limit: parse_memory_limit(s.text("memory-limit")?)?,
            // Each job spills into its own private scratch directory (job::scratch).
            temp_directory: None,
            max_spill_bytes: None,
        },
        work_dir,
    ))
}

/// `--max-manifest-size` caps the manifest and, as large as it, the gc state (which lists at
/// most the prefix's unlisted objects).
fn read_limits(s: &Resolved) -> Result<ReadLimits> {
    let manifest_bytes = size(s, "max-manifest-size")?;
    if manifest_bytes == 0 {
        return Err(Error::setting("max-manifest-size", "must be more than 0"));
    }
    Ok(ReadLimits {
        manifest_bytes,
        gc_state_bytes: manifest_bytes.max(ReadLimits::DEFAULT_GC_STATE_BYTES),
        ..ReadLimits::default()
    })
}

fn work_dir(s: &Resolved) -> Result<PathBuf> {
    let dir = s.path("work-dir").unwrap_or_else(std::env::temp_dir);
    if !dir.is_dir() {
        return Err(Error::setting(
            "work-dir",
            format!("{} is not a directory", dir.display()),
        ));
    }
    Ok(dir)
}

fn at_least_one<T>(s: &Resolved, key: &str) -> Result<T>
where
    T: std::str::FromStr + PartialOrd + From<u8>,
{
    match s.number::<T>(key)? {
        Some(v) if v >= T::from(1) => Ok(v),
        _ => Err(Error::setting(key, "must be at least 1")),
    }
}

fn duration(s: &Resolved, key: &str) -> Result<Duration> {
    parse_duration(key, s.text(key)?)
}

fn size(s: &Resolved, key: &str) -> Result<u64> {
    parse_size(key, s.text(key)?)
}

/// The smallest base or init file size a setting may ask for: below it every row group, then
/// nearly every row, would be a file of its own.
const MIN_FILE_SIZE: u64 = 4 << 10;

/// A file size setting of at least [`MIN_FILE_SIZE`].
fn file_size(s: &Resolved, key: &str) -> Result<u64> {
    match size(s, key)? {
        v if v >= MIN_FILE_SIZE => Ok(v),
        _ => Err(Error::setting(key, "must be at least 4KiB")),
    }
}

/// An optional count that, when given, is at least 1 (unset: no limit).
fn limit_of_at_least_one(s: &Resolved, key: &str) -> Result<Option<u32>> {
    match s.number::<u32>(key)? {
        Some(0) => Err(Error::setting(
            key,
            "must be at least 1 (leave it unset for no limit)",
        )),
        v => Ok(v),
    }
}

/// `--read-order` of init and flush.
fn read_order(s: &Resolved) -> Result<crate::init::ReadOrder> {
    s.text("read-order")?
        .parse()
        .map_err(|why: String| Error::setting("read-order", why))
}

fn flush_thresholds(s: &Resolved) -> Result<FlushThresholds> {
    Ok(FlushThresholds {
        min_records: s.number("min-records")?.unwrap_or_default(),
        max_age: duration(s, "max-age")?,
        force: s.flag("force"),
    })
}

fn compact_thresholds(s: &Resolved) -> Result<CompactThresholds> {
    Ok(CompactThresholds {
        target_base_size: file_size(s, "target-base-size")?,
        dirty_ratio: match parse_ratio("dirty-ratio", s.text("dirty-ratio")?)? {
            r if r <= 1.0 => r,
            _ => {
                return Err(Error::setting(
                    "dirty-ratio",
                    "must be at most 100% (a share of a range's rows)",
                ));
            }
        },
        max_deltas: s.number("max-deltas")?.unwrap_or(32),
        max_rewrite_bytes: size(s, "max-rewrite-bytes")?,
    })
}

fn job(s: &Resolved, schemas: &[String]) -> Result<Job> {
    let schemas = schemas.to_vec();
    let dry_run = s.flag("dry-run");
    Ok(match s.command {
        Command::InitDb => Job::InitDb {
            dry_run,
            print_sql: s.flag("print-sql"),
        },
        Command::Flush => {
            let (engine, work_dir) = engine(s)?;
            let t = flush_thresholds(s)?;
            Job::Flush(Box::new(FlushOptions {
                schemas,
                parallelism: at_least_one(s, "parallelism")?,
                min_records: t.min_records,
                max_age: t.max_age,
                force: t.force,
                batch_size: at_least_one(s, "batch-size")?,
                window_batches: crate::flush::WINDOW_BATCHES,
                max_batches: limit_of_at_least_one(s, "max-batches")?,
                time_budget: duration(s, "time-budget")?,
                scan_memory: size(s, "scan-memory")?,
                max_touches: crate::source::table_source::MAX_TOUCHES,
                read_order: read_order(s)?,
                dry_run,
                work_dir,
                engine,
                commit: CommitPolicy::default(),
            }))
        }
        Command::Init => {
            let (engine, work_dir) = engine(s)?;
            Job::Init(Box::new(InitOptions {
                schemas,
                replace_delta: s.flag("replace-delta"),
                target_file_size: file_size(s, "target-file-size")?,
                max_file_rows: at_least_one(s, "max-file-rows")?,
                page_rows: at_least_one(s, "page-rows")?,
                readers: at_least_one(s, "readers")?,
                read_order: read_order(s)?,
                dry_run,
                work_dir,
                engine,
                ..InitOptions::default()
            }))
        }
        Command::Compact => {
            let (engine, work_dir) = engine(s)?;
            let t = compact_thresholds(s)?;
            Job::Compact(Box::new(CompactOptions {
                schemas,
                target_base_size: t.target_base_size,
                dirty_ratio: t.dirty_ratio,
                max_deltas: t.max_deltas,
                max_rewrite_bytes: t.max_rewrite_bytes,
                skip_input_checksum_verify: s.flag("skip-input-checksum-verify"),
                max_retries: s.number("max-retries")?.unwrap_or_default(),
                dry_run,
                work_dir,
                engine,
                ..CompactOptions::default()
            }))
        }
        Command::Gc => {
            let grace = duration(s, "grace")?;
            crate::gc::check_grace(grace)?;
            Job::Gc(GcOptions {
                schemas,
                grace,
                dry_run,
                repair: s.flag("repair"),
                settle_rows: crate::gc::SETTLE_ROWS,
            })
        }
        Command::Verify => Job::Verify(verify_options(s, schemas)?),
        Command::Inspect => Job::Inspect(flush_thresholds(s)?, compact_thresholds(s)?),
        Command::View => match s.text("dialect")? {
            "duckdb" => Job::View(ViewOptions { schemas }),
            other => {
                return Err(Error::setting(
                    "dialect",
                    format!("{other:?} is not one of duckdb"),
                ));
            }
        },
        Command::Query => Job::Query(Box::new(query_options(s, schemas)?)),
        Command::Requeue => Job::Requeue(requeue_options(s, &schemas, dry_run)?),
        Command::Doctor => Job::Doctor,
        Command::Attach => Job::Attach {
            opts: AttachOptions {
                table: TableName::parse("table", s.text("table")?)?,
                name: s.get("name").map(str::to_string),
                exclude: s.list("exclude-columns"),
                dry_run,
            },
            print_sql: s.flag("print-sql"),
        },
        Command::Detach => Job::Detach {
            table: TableName::parse("table", s.text("table")?)?,
            dry_run,
        },
    })
}

/// `requeue`'s options: one schema and exactly one way of choosing rows.
fn requeue_options(s: &Resolved, schemas: &[String], dry_run: bool) -> Result<RequeueOptions> {
    let [schema] = schemas else {
        return Err(Error::setting(
            "schema",
            "must name exactly one schema for requeue",
        ));
    };
    let ids = s
        .list("row-id")
        .iter()
        .map(|v| {
            uuid::Uuid::parse_str(v)
                .map_err(|_| Error::setting("row-id", format!("{v:?} is not a row id (a UUID)")))
        })
        .collect::<Result<Vec<_>>>()?;
    let choices = [
        !ids.is_empty(),
        s.get("ids-from").is_some(),
        s.get("where").is_some(),
    ];
    if choices.iter().filter(|c| **c).count() != 1 {
        return Err(Error::setting(
            "row-id",
            "choose the rows to requeue in exactly one way: --row-id, --ids-from or --where",
        ));
    }
    let selection = if !ids.is_empty() {
        Selection::Ids(ids)
    } else if let Some(path) = s.path("ids-from") {
        Selection::File(path)
    } else {
        Selection::Where(s.text("where")?.to_string())
    };
    Ok(RequeueOptions {
        schema: schema.clone(),
        selection,
        dry_run,
        max_ids: s.number("max-ids")?.unwrap_or(100),
    })
}

/// `verify`'s options: re-hashing the lake, or (`--source`) comparing it with its database.
fn verify_options(s: &Resolved, schemas: Vec<String>) -> Result<VerifyOptions> {
    let (deep, repair) = (s.flag("deep"), s.flag("repair"));
    let source = if s.flag("source") {
        Some(SourceOptions {
            deep,
            repair,
            max_ids: s.number("max-ids")?.unwrap_or(100),
            readers: at_least_one(s, "readers")?,
            ..SourceOptions::default()
        })
    } else if deep || repair {
        return Err(Error::setting(
            if deep { "deep" } else { "repair" },
            "compares the lake with its source database: add --source",
        ));
    } else {
        None
    };
    Ok(VerifyOptions {
        schemas,
        parallelism: at_least_one(s, "parallelism")?,
        work_dir: work_dir(s)?,
        source,
        engine: EngineConfig {
            threads: 1,
            memory_limit: parse_memory_limit(s.text("memory-limit")?)?,
            temp_directory: None,
            max_spill_bytes: None,
        },
    })
}

/// `query`'s options: the SQL's source, the output and its format (by `--format`, else the
/// output file's extension, else a table on a terminal and CSV elsewhere), the cache.
fn query_options(s: &Resolved, schemas: Vec<String>) -> Result<QueryOptions> {
    use std::io::IsTerminal;
    let sql = match (s.get("sql"), s.path("file")) {
        (Some(_), Some(_)) => {
            return Err(Error::setting(
                "file",
                "and a SQL argument were both given: pass one",
            ));
        }
        (Some(text), None) => SqlSource::Text(text.to_string()),
        (None, Some(path)) => SqlSource::File(path),
        (None, None) => SqlSource::Stdin,
    };
    let output = s
        .path("output")
        .map_or(Destination::Stdout, Destination::File);
    let format = match (s.get("format"), &output) {
        (Some(name), _) => Format::parse(name).ok_or_else(|| {
            Error::setting(
                "format",
                format!("{name:?} is not one of {}", Format::NAMES),
            )
        })?,
        (None, Destination::File(path)) => Format::of_path(path).unwrap_or(Format::Csv),
        (None, Destination::Stdout) if s.flag("json") => Format::Json,
        (None, Destination::Stdout) if std::io::stdout().is_terminal() => Format::Table,
        (None, Destination::Stdout) => Format::Csv,
    };
    let cache_dir = match s.path("cache-dir") {
        Some(dir) => dir,
        None => {
            let env = |k: &str| s.env.get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
            match (env("XDG_CACHE_HOME"), env("HOME")) {
                (Some(xdg), _) => xdg.join("lakecdc"),
                (None, Some(home)) => home.join(".cache").join("lakecdc"),
                (None, None) => {
                    return Err(Error::setting(
                        "cache-dir",
                        "has no default (neither XDG_CACHE_HOME nor HOME is set): pass one",
                    ));
                }
            }
        }
    };
    let threads = match s.number::<usize>("threads")? {
        Some(t) => t.max(1),
        None => std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    Ok(QueryOptions {
        sql,
        schemas,
        format,
        output,
        as_of: s.get("as-of").map(str::to_string),
        verify: s.flag("verify"),
        cache_dir,
        cache_max: size(s, "cache-max")?,
        parallelism: at_least_one(s, "parallelism")?,
        work_dir: work_dir(s)?,
        engine: EngineConfig {
            threads,
            memory_limit: parse_memory_limit(s.text("memory-limit")?)?,
            temp_directory: None,
            max_spill_bytes: None,
        },
    })
}

/// inspect's report as the schemas' state (it holds every number).
fn inspected_state(r: &crate::inspect::InspectReport) -> Vec<crate::metrics::SchemaState> {
    let tier = |t: &crate::inspect::TierSummary| crate::metrics::TierSize {
        files: t.files as u64,
        bytes: t.bytes,
    };
    (r.schemas.iter())
        .filter(|s| s.error.is_none())
        .map(|s| crate::metrics::SchemaState {
            schema_id: s.schema_id,
            schema: s.schema.clone(),
            dirty_rows: s.dirty_rows,
            oldest_dirty_age_s: s.oldest_dirty_age_s as f64,
            manifest_version: s.manifest.then_some(s.manifest_version),
            base: Some(tier(&s.base)),
            delta: Some(tier(&s.delta)),
        })
        .collect()
}

/// A finished job: its report, rendered both ways, and the exit code it maps to.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The report as text.
    pub text: String,
    /// The report as pretty JSON.
    pub json: String,
    /// 0 done, 1 failed, 3 done but needs attention.
    pub exit_code: i32,
}

impl Outcome {
    fn of<R: Serialize>(report: &R, text: String, exit_code: i32) -> Result<Self> {
        let json = serde_json::to_string_pretty(report).map_err(Error::json("report"))?;
        Ok(Self {
            text: crate::report::printable(&text, true).into_owned(),
            json,
            exit_code,
        })
    }

    /// A `--print-sql` script: as it is, or with `--json` as `{"sql": …}`.
    fn script(sql: String) -> Result<Self> {
        #[derive(Serialize)]
        struct Script<'a> {
            sql: &'a str,
        }
        let json =
            serde_json::to_string_pretty(&Script { sql: &sql }).map_err(Error::json("script"))?;
        Ok(Self {
            text: sql,
            json,
            exit_code: 0,
        })
    }
}

/// What a run leaves for its metrics: the context it opened and its report's per-schema view.
#[derive(Default)]
struct Measured {
    ctx: Option<Context>,
    schemas: Vec<SchemaRun>,
    /// inspect reports the state itself.
    state: Option<Vec<crate::metrics::SchemaState>>,
}

impl Measured {
    fn of(ctx: Context, schemas: Vec<SchemaRun>) -> Self {
        Self {
            ctx: Some(ctx),
            schemas,
            state: None,
        }
    }
}

/// Runs the job of `config`, then publishes its metrics (`--metrics-file`, `--pushgateway`;
/// not for dry runs, which did nothing to measure). `progress` draws init's progress.
pub async fn run(config: RunConfig, progress: Option<crate::init::ProgressFn>) -> Result<Outcome> {
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let started = SystemTime::now();
    let clock = Instant::now();
    let mut measured = Measured::default();
    let result = execute(&config, progress, &mut measured).await;
    if config.metrics.enabled() && !config.is_dry_run() {
        // The run's duration, not the metrics' collection below.
        let duration = clock.elapsed();
        let exit_code = match &result {
            Ok(o) => o.exit_code,
            Err(e) => e.exit_code(),
        };
        let state = match (measured.state.take(), &measured.ctx) {
            (Some(state), _) => state,
            (None, Some(ctx)) => {
                let ids: Vec<_> = (measured.schemas.iter())
                    .map(|s| (s.schema_id, s.schema.clone()))
                    .collect();
                crate::metrics::state::gather(ctx, &ids)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::warn!("metrics: the schemas' state is left out: {}", e.chain());
                        Vec::new()
                    })
            }
            (None, None) => Vec::new(),
        };
        let record = RunRecord {
            command: config.command.name(),
            started,
            duration,
            exit_code,
            schemas: measured.schemas,
            state,
        };
        crate::metrics::publish(&config.metrics, &record).await;
    }
    result
}

impl RunConfig {
    /// Whether the run only reports what it would do.
    fn is_dry_run(&self) -> bool {
        match &self.job {
            Job::InitDb { dry_run, print_sql } => *dry_run || *print_sql,
            Job::Init(o) => o.dry_run,
            Job::Flush(o) => o.dry_run,
            Job::Compact(o) => o.dry_run,
            Job::Gc(o) => o.dry_run,
            Job::Requeue(o) => o.dry_run,
            Job::Attach { opts, print_sql } => opts.dry_run || *print_sql,
            Job::Detach { dry_run, .. } => *dry_run,
            Job::Verify(_) | Job::Inspect(..) | Job::View(_) | Job::Query(_) | Job::Doctor => false,
        }
    }
}

async fn execute(
    config: &RunConfig,
    progress: Option<crate::init::ProgressFn>,
    measured: &mut Measured,
) -> Result<Outcome> {
    match &config.job {
        Job::InitDb {
            print_sql: true, ..
        } => Outcome::script(crate::source::ddl::script(&config.tables)),
        Job::Attach {
            opts,
            print_sql: true,
        } => Outcome::script(
            crate::attach::script(&config.connector, &config.tables, &SystemClock, opts).await?,
        ),
        Job::Attach { opts, .. } => {
            let r =
                crate::attach::run(&config.connector, &config.tables, &SystemClock, opts).await?;
            Outcome::of(&r, r.to_text(), 0)
        }
        Job::Detach { table, dry_run } => {
            let r =
                crate::attach::detach(&config.connector, &config.tables, table, *dry_run).await?;
            Outcome::of(&r, r.to_text(), 0)
        }
        Job::InitDb { dry_run, .. } => {
            let dir = config.schema_dir.as_deref();
            let r = crate::init_db::run(&config.connector, &config.tables, dir, *dry_run).await?;
            Outcome::of(&r, r.to_text(), 0)
        }
        Job::Flush(opts) => {
            let ctx = config.context().await?;
            let r = crate::flush::run(&ctx, opts).await?;
            *measured = Measured::of(ctx, crate::metrics::of_flush(&r));
            Outcome::of(&r, r.to_text(), i32::from(r.failed()))
        }
        Job::Init(opts) => {
            let ctx = config.context().await?;
            let opts = InitOptions {
                progress,
                ..opts.as_ref().clone()
            };
            let r = crate::init::run(&ctx, &opts).await?;
            *measured = Measured::of(ctx, crate::metrics::of_init(&r));
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::View(opts) => {
            let ctx = config.context().await?;
            let r = crate::view::run(&ctx, opts).await?;
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::Query(opts) => {
            let ctx = config.context().await?;
            // The rows went to the output; the report is the log's.
            crate::query::run(&ctx, opts).await?;
            Ok(Outcome {
                text: String::new(),
                json: String::new(),
                exit_code: 0,
            })
        }
        Job::Inspect(flush, compact) => {
            let ctx = config.context().await?;
            let r = crate::inspect::run(&ctx, &config.schemas, flush, compact).await?;
            measured.state = Some(inspected_state(&r));
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::Compact(opts) => {
            let ctx = config.context().await?;
            let r = crate::compact::run(&ctx, opts).await?;
            *measured = Measured::of(ctx, crate::metrics::of_compact(&r));
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::Gc(opts) => {
            let ctx = config.context().await?;
            let r = crate::gc::run(&ctx, opts).await?;
            *measured = Measured::of(ctx, crate::metrics::of_gc(&r));
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::Verify(opts) => {
            let ctx = config.context().await?;
            let r = crate::verify::run(&ctx, opts).await?;
            *measured = Measured::of(ctx, crate::metrics::of_verify(&r));
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::Requeue(opts) => {
            let ctx = config.context().await?;
            let r = crate::requeue::run(&ctx, opts).await?;
            let schema = SchemaRun {
                schema_id: r.schema_id,
                schema: r.schema.clone(),
                ..SchemaRun::default()
            };
            *measured = Measured::of(ctx, vec![schema]);
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
        Job::Doctor => {
            let r = crate::doctor::run(&config.doctor_inputs().await).await;
            Outcome::of(&r, r.to_text(), r.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::Layers;

    /// The defaults of the settings table and of the options' `Default` agree.
    #[test]
    fn the_settings_defaults_are_the_options_defaults() {
        let none = |_: &str| None;
        let layers = Layers {
            flags: Default::default(),
            env: &none,
            file: None,
        };
        let resolved = |c| Resolved::merge(c, &layers, &[]);
        let Job::Flush(f) = job(&resolved(Command::Flush), &[]).unwrap() else {
            panic!("not a flush")
        };
        let d = FlushOptions::default();
        assert_eq!(
            (
                f.parallelism,
                f.min_records,
                f.max_age,
                f.force,
                f.batch_size
            ),
            (
                d.parallelism,
                d.min_records,
                d.max_age,
                d.force,
                d.batch_size
            )
        );
        assert_eq!(
            (f.max_batches, f.time_budget),
            (d.max_batches, d.time_budget)
        );
        assert_eq!(
            f.engine.threads, 1,
            "flush's files are small: one DuckDB thread"
        );
        let Job::Compact(c) = job(&resolved(Command::Compact), &[]).unwrap() else {
            panic!("not a compact")
        };
        let d = CompactOptions::default();
        assert_eq!(c.thresholds(), d.thresholds());
        assert_eq!(c.max_retries, d.max_retries);
        let Job::Gc(g) = job(&resolved(Command::Gc), &[]).unwrap() else {
            panic!("not a gc")
        };
        assert_eq!(g.grace, Duration::from_secs(15 * 60));
    }
}

//! The `lakecdc` binary: parses flags and environment into the library's typed configuration,
//! sets up logging, runs one job, prints its report, and maps the outcome to an exit code
//! (0 done, 1 failed, 2 usage or configuration error, 3 done but needs attention).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod config_file;

use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::sync::Arc;

use lakecdc::clock::SystemClock;
use lakecdc::compact::CompactOptions;
use lakecdc::config::{
    LakeLocation, TableName, Tables, parse_duration, parse_memory_limit, parse_ratio, parse_size,
};
use lakecdc::engine::EngineConfig;
use lakecdc::flush::{Context as FlushContext, FlushHooks, FlushOptions};
use lakecdc::gc::GcOptions;
use lakecdc::init::InitOptions;
use lakecdc::job::Context as JobContext;
use lakecdc::lake::manifest::CommitPolicy;
use lakecdc::lake::{Lake, Layout};
use lakecdc::shutdown::Shutdown;
use lakecdc::source::connect::PG_ENV_VARS;
use lakecdc::source::conninfo;
use lakecdc::source::{Connector, PgSettings};
use lakecdc::store::s3::{S3Options, check_env_credentials};
use lakecdc::verify::VerifyOptions;
use lakecdc::{Error, Result};

/// Exports a PostgreSQL entity store into a verifiable Parquet lake on S3 or a local directory.
#[derive(Debug, Parser)]
#[command(name = "lakecdc", version, about, max_term_width = 100)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct Global {
    /// PostgreSQL URL or keyword DSN; falls back to DATABASE_URL, then the libpq PG* variables
    /// (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT). Given as a
    /// flag it may not carry a password (others can read a command line): use PGPASSWORD, or
    /// the whole string in LAKECDC_PG_URL.
    #[arg(
        long,
        env = "LAKECDC_PG_URL",
        hide_env_values = true,
        hide_default_value = true,
        global = true
    )]
    pg_url: Option<String>,

    /// A TOML file of settings (keys are the long flag names; a [flush], [compact], … table
    /// for one command's own flags), below flags and the environment, above the defaults.
    #[arg(long, env = "LAKECDC_CONFIG", global = true)]
    config: Option<PathBuf>,

    /// The lake: s3://bucket/root, file:///path, or a local path (an existing directory).
    #[arg(long, env = "LAKECDC_LAKE", default_value = "./lake", global = true)]
    lake: String,

    /// S3 endpoint override (S3-compatible servers); otherwise aws-config's
    /// AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS.
    #[arg(long, env = "LAKECDC_S3_ENDPOINT", global = true)]
    s3_endpoint: Option<String>,

    /// Path-style S3 addressing (endpoint/bucket/key), needed by most S3-compatible servers.
    #[arg(long, env = "LAKECDC_S3_PATH_STYLE", global = true)]
    s3_path_style: bool,

    /// S3 region; otherwise aws-config's chain (AWS_REGION, profile), else us-east-1.
    #[arg(long, env = "LAKECDC_S3_REGION", global = true)]
    s3_region: Option<String>,

    /// Directory of <schema>.json and <schema>_attributes.json metadata files.
    #[arg(long, env = "LAKECDC_SCHEMA_DIR", global = true)]
    schema_dir: Option<PathBuf>,

    /// Limit the run to these schemas (name or id); repeatable; default all.
    #[arg(long, env = "LAKECDC_SCHEMA", value_delimiter = ',', global = true)]
    schema: Vec<String>,

    /// Schema registry table.
    #[arg(
        long,
        env = "LAKECDC_REGISTRY_TABLE",
        default_value = "schema_registry",
        global = true
    )]
    registry_table: String,

    /// Entity table.
    #[arg(
        long,
        env = "LAKECDC_ENTITY_TABLE",
        default_value = "entity_main",
        global = true
    )]
    entity_table: String,

    /// EAV table.
    #[arg(
        long,
        env = "LAKECDC_EAV_TABLE",
        default_value = "eav_data",
        global = true
    )]
    eav_table: String,

    /// Change-log table.
    #[arg(
        long,
        env = "LAKECDC_CHANGE_LOG_TABLE",
        default_value = "change_log",
        global = true
    )]
    change_log_table: String,

    /// Key prefix of data files under the lake root.
    #[arg(
        long,
        env = "LAKECDC_DATA_PREFIX",
        default_value = "data",
        global = true
    )]
    data_prefix: String,

    /// Manifest key under the lake root; {schema_id} (or {{.SchemaID}}) is replaced.
    #[arg(
        long,
        env = "LAKECDC_MANIFEST_TEMPLATE",
        default_value = "manifest/{schema_id}.json",
        global = true
    )]
    manifest_template: String,

    /// Print the report as JSON.
    #[arg(long, env = "LAKECDC_JSON", global = true)]
    json: bool,

    /// Log format on stderr.
    #[arg(long, env = "LAKECDC_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    /// More logging (-v debug, -vv trace); LAKECDC_LOG / RUST_LOG override.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    /// Less logging (-q warnings, -qq errors only).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    quiet: u8,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct EngineArgs {
    /// DuckDB worker threads (default: 1 for flush, whose files are small — a second thread
    /// only spins waiting for work — and for init, which writes two files at once, each on
    /// one thread; 2 for compact).
    #[arg(long, env = "LAKECDC_THREADS")]
    threads: Option<usize>,
    /// DuckDB memory limit (e.g. 1GB, 512MiB, 50%); beyond it DuckDB spills to --work-dir.
    /// Init's two engines (it writes two files at once) share it.
    #[arg(long, env = "LAKECDC_MEMORY_LIMIT", default_value = "1GB")]
    memory_limit: String,
    /// Directory for local Parquet files and DuckDB spill files (default: the system temp dir).
    #[arg(long, env = "LAKECDC_WORK_DIR")]
    work_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct FlushArgs {
    /// Schemas flushed at once.
    #[arg(long, env = "LAKECDC_PARALLELISM", default_value_t = 2)]
    parallelism: usize,
    /// Flush a schema when at least this many rows are dirty.
    #[arg(long, env = "LAKECDC_MIN_RECORDS", default_value_t = 20_000)]
    min_records: i64,
    /// Flush a schema when its oldest dirty row is at least this old (90s, 5m, 1h).
    #[arg(long, env = "LAKECDC_MAX_AGE", default_value = "1h")]
    max_age: String,
    /// Flush regardless of --min-records and --max-age.
    #[arg(long, env = "LAKECDC_FORCE")]
    force: bool,
    /// Rows per batch (one delta file per batch).
    #[arg(long, env = "LAKECDC_BATCH_SIZE", default_value_t = 10_000)]
    batch_size: i64,
    /// Stop each schema after this many batches.
    #[arg(long, env = "LAKECDC_MAX_BATCHES")]
    max_batches: Option<u32>,
    /// Start no new batch after this long (keeps a per-minute cron from overlapping itself).
    #[arg(long, env = "LAKECDC_TIME_BUDGET", default_value = "50s")]
    time_budget: String,
    /// Show what would be flushed; write nothing anywhere.
    #[arg(long, env = "LAKECDC_DRY_RUN")]
    dry_run: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// Objects downloaded and re-hashed at once.
    #[arg(long, env = "LAKECDC_VERIFY_PARALLELISM", default_value_t = 4)]
    parallelism: usize,
    /// Where downloads are staged while checked (default: the system temp dir).
    #[arg(long, env = "LAKECDC_WORK_DIR")]
    work_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct GcArgs {
    /// Delete an orphan only when it was first seen, and was written, at least this long ago.
    #[arg(long, env = "LAKECDC_GC_GRACE", default_value = "15m")]
    grace: String,
    /// Report what would be deleted; delete and record nothing.
    #[arg(long, env = "LAKECDC_DRY_RUN")]
    dry_run: bool,
}

#[derive(Debug, Args)]
struct CompactArgs {
    /// Promote (relabel) the deltas as base once they hold this many bytes.
    #[arg(long, env = "LAKECDC_TARGET_BASE_SIZE", default_value = "256MiB")]
    target_base_size: String,
    /// Merge everything into one new base when delta rows / base rows exceeds this (0.05 or 5%).
    #[arg(long, env = "LAKECDC_DIRTY_RATIO", default_value = "5%")]
    dirty_ratio: String,
    /// Merge even when a source's bytes do not match its manifest checksum.
    #[arg(long, env = "LAKECDC_SKIP_INPUT_CHECKSUM_VERIFY")]
    skip_input_checksum_verify: bool,
    /// Whole-pass retries after losing a race with another writer.
    #[arg(long, env = "LAKECDC_MAX_RETRIES", default_value_t = 5)]
    max_retries: u32,
    /// Print the plan; write nothing.
    #[arg(long, env = "LAKECDC_DRY_RUN")]
    dry_run: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// The flush threshold to evaluate: rows.
    #[arg(long, env = "LAKECDC_MIN_RECORDS", default_value_t = 20_000)]
    min_records: i64,
    /// The flush threshold to evaluate: age of the oldest dirty row.
    #[arg(long, env = "LAKECDC_MAX_AGE", default_value = "1h")]
    max_age: String,
    /// The compaction promote threshold to evaluate.
    #[arg(long, env = "LAKECDC_TARGET_BASE_SIZE", default_value = "256MiB")]
    target_base_size: String,
    /// The compaction rewrite threshold to evaluate.
    #[arg(long, env = "LAKECDC_DIRTY_RATIO", default_value = "5%")]
    dirty_ratio: String,
}

#[derive(Debug, Args)]
struct InitArgs {
    /// Replace a delta tier (retired by the save that commits the new base tier; gc deletes its
    /// files past the grace) instead of refusing.
    #[arg(long, env = "LAKECDC_REPLACE_DELTA")]
    replace_delta: bool,
    /// Aimed-for size of each base file.
    #[arg(long, env = "LAKECDC_TARGET_FILE_SIZE", default_value = "256MiB")]
    target_file_size: String,
    /// Most rows in one base file (bounds the rows held in memory at once; a file is also cut
    /// at 96 MiB of staged rows; each reader stages one file at a time).
    #[arg(long, env = "LAKECDC_MAX_FILE_ROWS", default_value_t = 200_000)]
    max_file_rows: u64,
    /// Rows read per keyset page.
    #[arg(long, env = "LAKECDC_PAGE_ROWS", default_value_t = 50_000)]
    page_rows: i64,
    /// Connections reading disjoint row-id ranges at once (each stages its own files, so base
    /// files never overlap in row-id range).
    #[arg(long, env = "LAKECDC_READERS", default_value_t = 2)]
    readers: u32,
    /// Count live rows and estimate files and bytes; write nothing.
    #[arg(long, env = "LAKECDC_DRY_RUN")]
    dry_run: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Export every live entity as base files, replacing the base tier (once per schema, or to
    /// rebuild it).
    Init(InitArgs),
    /// Show per schema what each job would do now (read-only: no lock, nothing written).
    Inspect(InspectArgs),
    /// Promote or merge deltas into UUID-named bases (run on a schedule; no lock needed).
    Compact(CompactArgs),
    /// Delete staging, merged-base and init-base orphans past a grace period; report unlisted
    /// deltas and unknown keys (never deleted).
    Gc(GcArgs),
    /// Re-hash every listed object and check size, SHA-256, footer and columns against the
    /// manifest; exit 3 on any divergence or dangling entry.
    Verify(VerifyArgs),
    /// Export dirty change_log rows as delta Parquet files (run every minute from cron).
    Flush(FlushArgs),
    /// Create the source tables and change_log index if missing, and register the schemas of
    /// --schema-dir (new names get the next id from 100; existing names keep theirs).
    InitDb(InitDbArgs),
}

#[derive(Debug, Args)]
struct InitDbArgs {
    /// Report what would be created and registered (with the ids), changing nothing.
    #[arg(long, env = "LAKECDC_DRY_RUN")]
    dry_run: bool,
}

/// Everything validated from the flags before any connection is opened.
struct Validated {
    connector: Connector,
    tables: Tables,
    lake: LakeLocation,
    layout: Layout,
    s3: S3Options,
    flush: Option<FlushOptions>,
    verify: Option<VerifyOptions>,
    gc: Option<GcOptions>,
    compact: Option<CompactOptions>,
    inspect: Option<(FlushOptions, CompactOptions)>,
    init: Option<InitOptions>,
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the settings that other tools' variables also set came from: a value from the config
/// file (clap's default, since the file fills the defaults) yields to those variables.
struct Sources {
    pg_url: Option<ValueSource>,
    s3_region: Option<ValueSource>,
    s3_endpoint: Option<ValueSource>,
}

/// `value` unless it came from the config file (`source`) while one of `vars` is set: the
/// environment beats the file (DESIGN §5).
fn unless_env(
    source: Option<ValueSource>,
    value: &Option<String>,
    vars: &[&str],
) -> Option<String> {
    let from_file = source == Some(ValueSource::DefaultValue);
    if from_file && vars.iter().any(|v| env_var(v).is_some()) {
        None
    } else {
        value.clone()
    }
}

fn validate(g: &Global, sources: &Sources) -> Result<Validated> {
    // Secrets never come from flags: any user of the host can read a command line.
    let pg_url_flag = sources.pg_url == Some(ValueSource::CommandLine);
    if pg_url_flag && g.pg_url.as_deref().is_some_and(conninfo::has_password) {
        return Err(Error::config(
            "--pg-url carries a password, which other users of this host can read in its process list: put the connection string in LAKECDC_PG_URL (or the password in PGPASSWORD) instead",
        ));
    }
    let tables = Tables {
        registry: TableName::parse("--registry-table", &g.registry_table)?,
        entity: TableName::parse("--entity-table", &g.entity_table)?,
        eav: TableName::parse("--eav-table", &g.eav_table)?,
        change_log: TableName::parse("--change-log-table", &g.change_log_table)?,
    };
    let lake = LakeLocation::parse(&g.lake)?;
    let layout = Layout::new(lake.root(), &g.data_prefix, &g.manifest_template)?;
    let mut s3 = S3Options::new("");
    s3.endpoint = unless_env(
        sources.s3_endpoint,
        &g.s3_endpoint,
        &["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"],
    );
    s3.path_style = g.s3_path_style;
    s3.region = unless_env(
        sources.s3_region,
        &g.s3_region,
        &["AWS_REGION", "AWS_DEFAULT_REGION"],
    );
    if matches!(lake, LakeLocation::S3 { .. }) {
        check_env_credentials(
            env_var("AWS_ACCESS_KEY_ID").as_deref(),
            env_var("AWS_SECRET_ACCESS_KEY").as_deref(),
        )
        .map_err(Error::Config)?;
    }
    if let Some(dir) = &g.schema_dir
        && !dir.is_dir()
    {
        return Err(Error::config(format!(
            "--schema-dir {} is not a directory",
            dir.display()
        )));
    }
    let env: BTreeMap<String, String> = PG_ENV_VARS
        .iter()
        .filter_map(|k| env_var(k).map(|v| (k.to_string(), v)))
        .collect();
    let settings = PgSettings {
        conninfo: unless_env(sources.pg_url, &g.pg_url, &["DATABASE_URL"])
            .or_else(|| env_var("DATABASE_URL")),
        env,
        application_name: "lakecdc".to_string(),
        connect_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(300),
    };
    let connector = Connector::new(&settings)?;
    Ok(Validated {
        connector,
        tables,
        lake,
        layout,
        s3,
        flush: None,
        verify: None,
        gc: None,
        compact: None,
        inspect: None,
        init: None,
    })
}

fn engine_config(a: &EngineArgs, default_threads: usize) -> Result<(EngineConfig, PathBuf)> {
    let work_dir = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    if !work_dir.is_dir() {
        return Err(Error::config(format!(
            "--work-dir {} is not a directory",
            work_dir.display()
        )));
    }
    Ok((
        EngineConfig {
            threads: a.threads.unwrap_or(default_threads).max(1),
            memory_limit: parse_memory_limit(&a.memory_limit)?,
            temp_directory: Some(work_dir.join("lakecdc-spill")),
        },
        work_dir,
    ))
}

fn flush_options(g: &Global, a: &FlushArgs) -> Result<FlushOptions> {
    if a.batch_size < 1 {
        return Err(Error::config("--batch-size must be at least 1"));
    }
    if a.parallelism < 1 {
        return Err(Error::config("--parallelism must be at least 1"));
    }
    let (engine, work_dir) = engine_config(&a.engine, 1)?;
    Ok(FlushOptions {
        schemas: g.schema.clone(),
        parallelism: a.parallelism,
        min_records: a.min_records,
        max_age: parse_duration("--max-age", &a.max_age)?,
        force: a.force,
        batch_size: a.batch_size,
        max_batches: a.max_batches,
        time_budget: parse_duration("--time-budget", &a.time_budget)?,
        dry_run: a.dry_run,
        work_dir,
        engine,
        commit: CommitPolicy::default(),
    })
}

fn verify_options(g: &Global, a: &VerifyArgs) -> Result<VerifyOptions> {
    let work_dir = a.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    if !work_dir.is_dir() {
        return Err(Error::config(format!(
            "--work-dir {} is not a directory",
            work_dir.display()
        )));
    }
    Ok(VerifyOptions {
        schemas: g.schema.clone(),
        parallelism: a.parallelism.max(1),
        work_dir,
    })
}

/// The context of the jobs that read the source (flush, init), with signal handling.
async fn source_context(v: &Validated, cli: &Cli) -> Result<FlushContext> {
    let job = job_context(v).await?;
    Ok(FlushContext {
        connector: job.connector,
        tables: job.tables,
        schema_dir: cli.global.schema_dir.clone(),
        lake: job.lake,
        clock: job.clock,
        shutdown: job.shutdown,
    })
}

/// The shared context of the lake jobs (verify, gc, compact), with signal handling.
async fn job_context(v: &Validated) -> Result<JobContext> {
    let lake = open_lake(v).await?;
    let shutdown = Shutdown::new();
    watch_signals(shutdown.clone());
    Ok(JobContext {
        connector: v.connector.clone(),
        tables: v.tables.clone(),
        lake,
        clock: Arc::new(SystemClock),
        shutdown,
    })
}

async fn open_lake(v: &Validated) -> Result<Lake> {
    let store = lakecdc::store::open(&v.lake, &v.s3)
        .await
        .map_err(Error::storage("open lake", v.lake.describe()))?;
    Ok(Lake {
        store,
        layout: v.layout.clone(),
    })
}

/// A progress bar on stderr when it is a terminal (rows done / total, rows/s, ETA); `None`
/// otherwise, and init logs one line per file instead.
fn progress_bar() -> Option<lakecdc::init::ProgressFn> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let style = indicatif::ProgressStyle::with_template(
        "schema {prefix} [{bar:40}] {human_pos}/{human_len} rows  {msg}",
    )
    .ok()?
    .progress_chars("=> ");
    // One bar per schema, made at its first call (so it is never drawn without its length);
    // the schema's last call (done == total) clears it, leaving nothing above the report.
    // Rows/s and ETA are the schema's average so far: the pages arrive in large steps, which
    // indicatif's own short-window estimate reads as bursts of millions of rows a second.
    type Bar = (i16, indicatif::ProgressBar, std::time::Instant, u64);
    let current = std::sync::Mutex::new(None::<Bar>);
    Some(Arc::new(move |schema_id, done, total| {
        let Ok(mut current) = current.lock() else {
            return;
        };
        let (bar, started, first) = match &mut *current {
            Some((id, bar, started, first)) if *id == schema_id => (bar, *started, *first),
            slot => {
                let bar = indicatif::ProgressBar::new(total.max(done))
                    .with_style(style.clone())
                    .with_prefix(schema_id.to_string());
                let new = (schema_id, bar, std::time::Instant::now(), done);
                let (_, bar, started, first) = slot.insert(new);
                (bar, *started, *first)
            }
        };
        // Counted from the first call: the rows it reports were read before the bar existed.
        let secs = started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            done.saturating_sub(first) as f64 / secs
        } else {
            0.0
        };
        let eta = if rate > 0.0 {
            total.saturating_sub(done) as f64 / rate
        } else {
            0.0
        };
        bar.set_length(total.max(done));
        bar.set_position(done);
        bar.set_message(format!("{rate:.0} rows/s  ETA {eta:.0}s"));
        if done >= total {
            bar.finish_and_clear();
        }
    }))
}

/// Raises the shutdown flag on the first SIGTERM or SIGINT; a second one exits at once (with
/// 128 + the signal number, as a shell reports it). Every step is safe to cut short: what a
/// killed run leaves behind is unlisted, and unmarked rows stay dirty.
fn watch_signals(shutdown: Shutdown) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        let mut requested = false;
        loop {
            let code = tokio::select! {
                _ = term.recv() => 143,
                _ = int.recv() => 130,
            };
            if requested {
                tracing::warn!("second stop request: exiting now");
                std::process::exit(code);
            }
            requested = true;
            tracing::warn!("stop requested: finishing the current step (signal again to exit now)");
            shutdown.request();
        }
    });
}

fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce() -> String,
) -> Result<()> {
    if json {
        let out =
            serde_json::to_string_pretty(report).map_err(|e| Error::Invariant(e.to_string()))?;
        println!("{out}");
    } else {
        print!("{}", text());
    }
    Ok(())
}

fn init_logging(g: &Global) {
    let level = match (g.verbose, g.quiet) {
        (0, 0) => "info",
        (1, _) => "debug",
        (v, _) if v >= 2 => "trace",
        (_, 1) => "warn",
        _ => "error",
    };
    let filter = env_var("LAKECDC_LOG")
        .or_else(|| env_var("RUST_LOG"))
        .unwrap_or_else(|| format!("warn,lakecdc={level}"));
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match g.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(cli: &Cli, v: Validated) -> Result<i32> {
    match &cli.command {
        Command::InitDb(a) => {
            let report = lakecdc::init_db::run(
                &v.connector,
                &v.tables,
                cli.global.schema_dir.as_deref(),
                a.dry_run,
            )
            .await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(0)
        }
        Command::Flush(_) => {
            let opts = v
                .flush
                .clone()
                .ok_or_else(|| Error::Invariant("flush options missing".into()))?;
            let ctx = source_context(&v, cli).await?;
            let report = lakecdc::flush::run(&ctx, &opts, &FlushHooks::default()).await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(if report.failed() { 1 } else { 0 })
        }
        Command::Init(_) => {
            let opts = v
                .init
                .clone()
                .ok_or_else(|| Error::Invariant("init options missing".into()))?;
            let ctx = source_context(&v, cli).await?;
            let report = lakecdc::init::run(&ctx, &opts).await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(report.exit_code())
        }
        Command::Inspect(_) => {
            let (flush, compact) = v
                .inspect
                .clone()
                .ok_or_else(|| Error::Invariant("inspect options missing".into()))?;
            let ctx = job_context(&v).await?;
            let report = lakecdc::inspect::run(&ctx, &cli.global.schema, &flush, &compact).await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(report.exit_code())
        }
        Command::Compact(_) => {
            let opts = v
                .compact
                .clone()
                .ok_or_else(|| Error::Invariant("compact options missing".into()))?;
            let ctx = job_context(&v).await?;
            let report = lakecdc::compact::run(&ctx, &opts, None).await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(report.exit_code())
        }
        Command::Gc(_) => {
            let opts =
                v.gc.clone()
                    .ok_or_else(|| Error::Invariant("gc options missing".into()))?;
            let ctx = job_context(&v).await?;
            let report = lakecdc::gc::run(&ctx, &opts).await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(report.exit_code())
        }
        Command::Verify(_) => {
            let opts = v
                .verify
                .clone()
                .ok_or_else(|| Error::Invariant("verify options missing".into()))?;
            let ctx = job_context(&v).await?;
            let report = lakecdc::verify::run(&ctx, &opts).await?;
            print_report(cli.global.json, &report, || report.to_text())?;
            Ok(report.exit_code())
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut command = Cli::command();
    if let Some(file) = config_file::path(&args) {
        command = match config_file::apply(command, &file) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("lakecdc: error: {e}");
                return ExitCode::from(2);
            }
        };
    }
    let matches = command.get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let sources = Sources {
        pg_url: matches.value_source("pg_url"),
        s3_region: matches.value_source("s3_region"),
        s3_endpoint: matches.value_source("s3_endpoint"),
    };
    let validated = match validate(&cli.global, &sources).and_then(|mut v| {
        match &cli.command {
            Command::Flush(a) => v.flush = Some(flush_options(&cli.global, a)?),
            Command::Verify(a) => v.verify = Some(verify_options(&cli.global, a)?),
            Command::Init(a) => {
                let (engine, work_dir) = engine_config(&a.engine, 1)?;
                if a.page_rows < 1 {
                    return Err(Error::config("--page-rows must be at least 1"));
                }
                v.init = Some(InitOptions {
                    schemas: cli.global.schema.clone(),
                    replace_delta: a.replace_delta,
                    target_file_size: parse_size("--target-file-size", &a.target_file_size)?,
                    max_file_rows: a.max_file_rows,
                    page_rows: a.page_rows,
                    readers: a.readers.max(1),
                    dry_run: a.dry_run,
                    work_dir,
                    engine,
                    after_page: None,
                    progress: progress_bar(),
                });
            }
            Command::Inspect(a) => {
                let flush = FlushOptions {
                    min_records: a.min_records,
                    max_age: parse_duration("--max-age", &a.max_age)?,
                    ..FlushOptions::default()
                };
                let compact = CompactOptions {
                    target_base_size: parse_size("--target-base-size", &a.target_base_size)?,
                    dirty_ratio: parse_ratio("--dirty-ratio", &a.dirty_ratio)?,
                    ..CompactOptions::default()
                };
                v.inspect = Some((flush, compact));
            }
            Command::Compact(a) => {
                let (engine, work_dir) = engine_config(&a.engine, 2)?;
                v.compact = Some(CompactOptions {
                    schemas: cli.global.schema.clone(),
                    target_base_size: parse_size("--target-base-size", &a.target_base_size)?,
                    dirty_ratio: parse_ratio("--dirty-ratio", &a.dirty_ratio)?,
                    skip_input_checksum_verify: a.skip_input_checksum_verify,
                    max_retries: a.max_retries,
                    dry_run: a.dry_run,
                    work_dir,
                    engine,
                    ..CompactOptions::default()
                });
            }
            Command::Gc(a) => {
                let grace = parse_duration("--grace", &a.grace)?;
                lakecdc::gc::check_grace(grace)?;
                v.gc = Some(GcOptions {
                    schemas: cli.global.schema.clone(),
                    grace,
                    dry_run: a.dry_run,
                });
            }
            Command::InitDb(_) => {}
        }
        Ok(v)
    }) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("lakecdc: error: {}", e.chain());
            return ExitCode::from(2);
        }
    };
    init_logging(&cli.global);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lakecdc: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match runtime.block_on(run(&cli, validated)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lakecdc: error: {}", e.chain());
            e.exit_code()
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

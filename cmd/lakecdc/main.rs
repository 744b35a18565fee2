//! The `lakecdc` binary: parses the command line, hands the flags, the environment and the
//! config file to the library's one validating conversion, sets up logging, runs the job and
//! prints its report. Exit codes: 0 done, 1 failed, 2 usage or configuration error, 3 done but
//! needs attention. Settings, their defaults and their variables live in the library
//! (`lakecdc::config::settings`); this file only names the flags and describes them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use lakecdc::config::settings::{self, ConfigFile, Layers, Resolved};
use lakecdc::run::{LogFormat, RunConfig};

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
    /// PostgreSQL URL or keyword DSN; else DATABASE_URL, then libpq's PG* variables (PGHOST,
    /// PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT, PGCHANNELBINDING).
    #[arg(long, global = true)]
    pg_url: Option<String>,
    /// A TOML file of settings (keys are the long flag names; [flush], [compact], … tables for
    /// one command's own), below flags and the environment, above the defaults.
    #[arg(long, env = "LAKECDC_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// The lake: s3://bucket/root, file:///path, or a local path (an existing directory).
    #[arg(long, global = true)]
    lake: Option<String>,
    /// S3 endpoint (S3-compatible servers); else AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS.
    #[arg(long, global = true)]
    s3_endpoint: Option<String>,
    /// Path-style S3 addressing (endpoint/bucket/key), needed by most S3-compatible servers.
    #[arg(long, global = true)]
    s3_path_style: bool,
    /// S3 region; otherwise aws-config's chain (AWS_REGION, profile), else us-east-1.
    #[arg(long, global = true)]
    s3_region: Option<String>,
    /// Directory of <schema>.json and <schema>_attributes.json metadata files.
    #[arg(long, global = true)]
    schema_dir: Option<PathBuf>,
    /// Limit the run to these schemas (name or id); repeatable; default all.
    #[arg(long, value_delimiter = ',', global = true)]
    schema: Vec<String>,
    /// Schema registry table.
    #[arg(long, global = true)]
    registry_table: Option<String>,
    /// Entity table.
    #[arg(long, global = true)]
    entity_table: Option<String>,
    /// EAV table.
    #[arg(long, global = true)]
    eav_table: Option<String>,
    /// Change-log table.
    #[arg(long, global = true)]
    change_log_table: Option<String>,
    /// Key prefix of data files under the lake root.
    #[arg(long, global = true)]
    data_prefix: Option<String>,
    /// Manifest key under the lake root; {schema_id} (or {{.SchemaID}}) is replaced.
    #[arg(long, global = true)]
    manifest_template: Option<String>,
    /// The largest manifest (or gc state) read, e.g. 64MiB; a larger one is refused unread.
    #[arg(long, global = true)]
    max_manifest_size: Option<String>,
    /// How long manifest history (time travel) is kept, e.g. 24h; 0 writes and keeps none.
    #[arg(long, global = true)]
    history_retention: Option<String>,
    /// Print the report as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Log format on stderr: text or json.
    #[arg(long, global = true)]
    log_format: Option<String>,
    /// Read COPY data straight off TLS connections (on) or through tokio-postgres only (off).
    #[arg(long, global = true)]
    copy_tap: Option<String>,
    /// Write the run's Prometheus metrics to this file (atomically; {job} is replaced by the
    /// command's name), for node-exporter's textfile collector.
    #[arg(long, global = true)]
    metrics_file: Option<PathBuf>,
    /// Push the run's metrics to this Prometheus Pushgateway (http(s)://host:9091); put
    /// credentials (user:password@) only in the variable, never on the command line.
    #[arg(long, global = true)]
    pushgateway: Option<String>,
    /// The Pushgateway's instance label [default: the host name].
    #[arg(long, global = true)]
    metrics_instance: Option<String>,
    /// More logging (-v debug, -vv trace); LAKECDC_LOG / RUST_LOG override.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    /// Less logging (-q warnings, -qq errors only).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    quiet: u8,
}

/// DuckDB settings of the jobs that run it (the writers and query).
#[derive(Debug, Args)]
struct EngineArgs {
    /// DuckDB worker threads.
    #[arg(long)]
    threads: Option<String>,
    /// DuckDB memory limit (e.g. 1GB, 512MiB, 50%); beyond it DuckDB spills to --work-dir.
    #[arg(long)]
    memory_limit: Option<String>,
    /// Where each run makes its private (0700) scratch directory for local Parquet files and
    /// DuckDB's spill files (default: the system temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the source tables and change_log index if missing; register --schema-dir's schemas.
    InitDb {
        /// Report what would be created and registered (with the ids), changing nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the DDL it runs (tables and index, idempotent) for a migration tool; connect
        /// to nothing.
        #[arg(long)]
        print_sql: bool,
    },
    /// Export every live entity as base files, replacing the base tier (once, or to rebuild it).
    Init {
        /// Replace (retire) a delta tier instead of refusing.
        #[arg(long)]
        replace_delta: bool,
        /// Aimed-for size of each base file.
        #[arg(long)]
        target_file_size: Option<String>,
        /// Most rows in one base file (bounds the rows held in memory at once).
        #[arg(long)]
        max_file_rows: Option<String>,
        /// Rows read per keyset page (per heap range, in heap order).
        #[arg(long)]
        page_rows: Option<String>,
        /// Connections reading disjoint row-id ranges (or heap ranges) at once.
        #[arg(long)]
        readers: Option<String>,
        /// How live rows are read: row-id (keyset pages), heap (heap ranges into row-id
        /// buckets, spilled to --work-dir), or auto (heap when the ids are not in heap order).
        #[arg(long)]
        read_order: Option<String>,
        /// How long to wait for a schema another run holds before reporting it `locked`
        /// (0: do not wait; 30s, 5m).
        #[arg(long)]
        lock_wait: Option<String>,
        /// Count live rows and estimate files and bytes; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Take over a lake whose manifests name another source database (after a restore or
        /// migration; then run verify --source --repair).
        #[arg(long)]
        adopt_source: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Export dirty change_log rows as delta Parquet files (run every minute from cron).
    Flush {
        /// Schemas flushed at once.
        #[arg(long)]
        parallelism: Option<String>,
        /// Flush a schema when at least this many rows are dirty.
        #[arg(long)]
        min_records: Option<String>,
        /// Flush a schema when its oldest dirty row is at least this old (90s, 5m, 1h).
        #[arg(long)]
        max_age: Option<String>,
        /// Flush regardless of --min-records and --max-age.
        #[arg(long)]
        force: bool,
        /// Rows per batch (one delta file per batch).
        #[arg(long)]
        batch_size: Option<String>,
        /// Stop each schema after this many batches.
        #[arg(long)]
        max_batches: Option<String>,
        /// Start no new batch after this long (keeps a per-minute cron from overlapping itself).
        #[arg(long)]
        time_budget: Option<String>,
        /// How long to wait for a schema another run holds before reporting it `locked`
        /// (0: do not wait; 30s, 5m).
        #[arg(long)]
        lock_wait: Option<String>,
        /// How a large backlog of scattered row ids is read: row-id (lookups by id, batch by
        /// batch), heap (one scan of both tables per pass, spilled to --work-dir), or auto.
        #[arg(long)]
        read_order: Option<String>,
        /// The most row bytes a table source's scan keeps at once (a larger backlog takes
        /// more passes over the table).
        #[arg(long)]
        scan_memory: Option<String>,
        /// Show what would be flushed; write nothing anywhere.
        #[arg(long)]
        dry_run: bool,
        /// Take over a lake whose manifests name another source database (after a restore or
        /// migration; then run verify --source --repair).
        #[arg(long)]
        adopt_source: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Promote or merge deltas into UUID-named bases (run on a schedule; no lock needed).
    Compact {
        /// The most bytes a base file holds; with no base yet, deltas this large become bases.
        #[arg(long)]
        target_base_size: Option<String>,
        /// Rewrite a base range once the deltas' rows in it reach this share of its rows.
        #[arg(long)]
        dirty_ratio: Option<String>,
        /// Fold the deltas into one consolidated delta once more than this many are listed.
        #[arg(long)]
        max_deltas: Option<String>,
        /// The most bytes one pass reads (the deltas and the rewritten ranges' bases); other
        /// ranges wait for the next pass.
        #[arg(long)]
        max_rewrite_bytes: Option<String>,
        /// Merge even when a source's bytes do not match its manifest checksum.
        #[arg(long)]
        skip_input_checksum_verify: bool,
        /// Whole-pass retries after losing a race with another writer.
        #[arg(long)]
        max_retries: Option<String>,
        /// Print the plan; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Take over a lake whose manifests name another source database (after a restore or
        /// migration; then run verify --source --repair).
        #[arg(long)]
        adopt_source: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Delete orphans past a grace period (unlisted deltas once the lake covers their rows);
    /// report lost data and unknown keys.
    Gc {
        /// Delete an orphan only when it was first seen, and was written, at least this long ago.
        #[arg(long)]
        grace: Option<String>,
        /// How long to wait for a schema another run holds before reporting it `locked`
        /// (0: do not wait; 30s, 5m).
        #[arg(long)]
        lock_wait: Option<String>,
        /// Report what would be deleted; delete and record nothing.
        #[arg(long)]
        dry_run: bool,
        /// Requeue the rows of unlisted deltas that the lake lacks, so the next flush lists them.
        #[arg(long)]
        repair: bool,
        /// Take over a lake whose manifests name another source database (after a restore or
        /// migration; then run verify --source --repair).
        #[arg(long)]
        adopt_source: bool,
    },
    /// Re-hash every listed object against the manifest; exit 3 on any divergence.
    Verify {
        /// Objects downloaded and re-hashed at once.
        #[arg(long)]
        parallelism: Option<String>,
        /// How long to wait for a schema another run holds before reporting it `locked`
        /// (0: do not wait; 30s, 5m).
        #[arg(long)]
        lock_wait: Option<String>,
        /// Where downloads are staged while checked (default: the system temp dir).
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// Compare the lake with its source database instead: rows missing, extra or stale in
        /// the lake (dirty rows are left to the next flush); exit 3 on any divergence.
        #[arg(long)]
        source: bool,
        /// With --source, also compare the values of rows whose versions agree.
        #[arg(long)]
        deep: bool,
        /// With --source, requeue every divergent row so the next flush puts it right.
        #[arg(long)]
        repair: bool,
        /// Ids listed per divergence class (--json lists up to this many too).
        #[arg(long)]
        max_ids: Option<String>,
        /// DuckDB memory limit of --deep's exports.
        #[arg(long)]
        memory_limit: Option<String>,
        /// With --source, connections reading the source table at once (in one snapshot).
        #[arg(long)]
        readers: Option<String>,
    },
    /// Print CREATE VIEW statements of each schema's current state for DuckDB (--json: the plan).
    View {
        /// The SQL dialect: duckdb.
        #[arg(long)]
        dialect: Option<String>,
    },
    /// Run SQL over the lake: each schema is a view of its current state, <name>__history of
    /// every copy; every file checked before it is read.
    Query {
        /// The SQL (else -f FILE, else standard input); after `--` when it starts with `-`.
        sql: Option<String>,
        /// Read the SQL from this file.
        #[arg(short = 'f', long)]
        file: Option<PathBuf>,
        /// Result format: table, csv, json, ndjson, parquet (default: by --output's extension,
        /// else a table on a terminal and CSV elsewhere).
        #[arg(long)]
        format: Option<String>,
        /// Write the result to this file (replaced whole when the query succeeds).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Read the lake as of a manifest version, an RFC 3339 time, or an age like -1h.
        #[arg(long, allow_hyphen_values = true)]
        as_of: Option<String>,
        /// Also re-hash each cached file before reading it (a local lake's files are always
        /// hashed).
        #[arg(long)]
        verify: bool,
        /// Where an S3 lake's verified files are cached (default $XDG_CACHE_HOME/lakecdc or
        /// ~/.cache/lakecdc).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// The most the cache holds; least recently used files are evicted.
        #[arg(long)]
        cache_max: Option<String>,
        /// Downloads at once.
        #[arg(long)]
        parallelism: Option<String>,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Make the next flush re-export chosen rows of one schema (--schema): their versions are
    /// bumped (values untouched); rows gone from the source get tombstones.
    Requeue {
        /// Row ids to requeue (repeatable, or comma-separated).
        #[arg(long, value_delimiter = ',')]
        row_id: Vec<String>,
        /// A file of row ids, one per line (# comments allowed).
        #[arg(long)]
        ids_from: Option<PathBuf>,
        /// The entity rows matching this SQL predicate (run in a read-only transaction).
        #[arg(long = "where", id = "where", allow_hyphen_values = true)]
        where_sql: Option<String>,
        /// List what would be requeued; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Ids listed per class in the report.
        #[arg(long)]
        max_ids: Option<String>,
    },
    /// Check everything the jobs rely on (database, privileges, index, schema directory, lake,
    /// conditional writes, clocks, ownership): one ok/warn/fail line each with its fix; exit 1
    /// on any fail. Writes only a probe object under <lake>/_doctor/, and removes it.
    Doctor {
        /// Report a manifest written from another database as a warning: the writers run with
        /// --adopt-source will take it over.
        #[arg(long)]
        adopt_source: bool,
    },
    /// Capture a PostgreSQL table with a primary key as a source of the lake: statement-level
    /// triggers record each touched row in lakecdc_touch (no replication slot).
    Attach {
        /// The table: name or schema.name.
        table: String,
        /// The source's name in the lake and for --schema [default: the table's name].
        #[arg(long)]
        name: Option<String>,
        /// Columns left out of the lake (comma-separated).
        #[arg(long, value_delimiter = ',')]
        exclude_columns: Vec<String>,
        /// Check the table and report what would be attached; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the SQL attach runs (one transaction), for a migration tool; change nothing.
        #[arg(long)]
        print_sql: bool,
    },
    /// Stop capturing a table: its triggers are dropped; the source's lake stays.
    Detach {
        /// The table: name or schema.name.
        table: String,
        /// Report what would be dropped; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show per schema what each job would do now (read-only: no lock, nothing written).
    Inspect {
        /// The flush threshold to evaluate: rows.
        #[arg(long)]
        min_records: Option<String>,
        /// The flush threshold to evaluate: age of the oldest dirty row.
        #[arg(long)]
        max_age: Option<String>,
        /// The compaction base file size to evaluate.
        #[arg(long)]
        target_base_size: Option<String>,
        /// The compaction range rewrite share to evaluate.
        #[arg(long)]
        dirty_ratio: Option<String>,
        /// The compaction delta count to evaluate.
        #[arg(long)]
        max_deltas: Option<String>,
        /// The compaction pass size to evaluate.
        #[arg(long)]
        max_rewrite_bytes: Option<String>,
    },
}

/// The command-line definition, each setting's help ending with its variable and its
/// default (the config file's value over the built-in one).
fn command(file: Option<&ConfigFile>) -> clap::Command {
    let describe = |command: Option<settings::Command>, mut cmd: clap::Command| {
        let ids: Vec<_> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
        for id in ids {
            let key = id.as_str().replace('_', "-");
            let found = settings::SETTINGS
                .iter()
                .find(|s| s.key == key && command.is_none_or(|c| s.applies_to(c)));
            if let Some(s) = found {
                let default = ConfigFile::shown_default(file, command, s)
                    .map(|d| format!(" [default: {d}]"))
                    .unwrap_or_default();
                cmd = cmd.mut_arg(id, |a| {
                    let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                    a.help(format!("{help} [env: {}]{default}", s.env))
                });
            }
        }
        cmd
    };
    let mut cmd = describe(None, Cli::command());
    for c in settings::Command::ALL {
        cmd = cmd.mut_subcommand(c.name(), |sub| describe(Some(c), sub));
    }
    cmd
}

/// The flags given on the command line, as setting key → value (repeated values comma-joined).
fn flags(matches: &ArgMatches, into: &mut BTreeMap<String, String>) {
    for id in matches.ids() {
        if matches.value_source(id.as_str()) != Some(ValueSource::CommandLine) {
            continue;
        }
        let Ok(Some(raw)) = matches.try_get_raw(id.as_str()) else {
            continue;
        };
        let values: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
        into.insert(id.as_str().replace('_', "-"), values.join(","));
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The command's settings merged and validated, or the one-line error.
/// On failure, also the output formats the merged settings asked for, so the error is printed
/// as the run would have printed its report.
fn configure(
    matches: &ArgMatches,
    file: Option<ConfigFile>,
) -> Result<RunConfig, (lakecdc::Error, Asked)> {
    let (name, sub) = matches.subcommand().unwrap_or(("", matches));
    let command = settings::Command::parse(name).ok_or_else(|| {
        let e = lakecdc::Error::config(format!("unknown command {name}"));
        (e, Asked::default())
    })?;
    let mut given = BTreeMap::new();
    flags(matches, &mut given);
    flags(sub, &mut given);
    given.remove("config");
    let layers = Layers {
        flags: given,
        env: &env_var,
        file,
    };
    let resolved = Resolved::merge(command, &layers, &lakecdc::run::passed_env());
    RunConfig::from_settings(&resolved).map_err(|e| (e, Asked::of(&resolved)))
}

/// The one error line: a setting is named by its flag.
fn error_line(e: &lakecdc::Error) -> String {
    match e {
        lakecdc::Error::Setting { setting, reason } => format!("--{setting} {reason}"),
        e => e.chain(),
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let named = settings::config_path(&args, std::env::var_os("LAKECDC_CONFIG"));
    let file = match named.as_deref().map(ConfigFile::load).transpose() {
        Ok(file) => file,
        Err(e) => {
            eprintln!("lakecdc: error: {}", error_line(&e));
            return ExitCode::from(2);
        }
    };
    let matches = command(file.as_ref()).get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let filter = env_var("LAKECDC_LOG").or_else(|| env_var("RUST_LOG"));
    let verbosity = i8::try_from(cli.global.verbose).unwrap_or(i8::MAX)
        - i8::try_from(cli.global.quiet).unwrap_or(i8::MAX);
    let config = match configure(&matches, file) {
        Ok(c) => c,
        Err((e, asked)) => {
            let format = if asked.json_logs {
                LogFormat::Json
            } else {
                LogFormat::Text
            };
            lakecdc::logging::init(format, verbosity, filter.as_deref());
            return asked.fail(&error_line(&e), 2);
        }
    };
    lakecdc::logging::init(config.log_format, verbosity, filter.as_deref());
    let asked = Asked {
        json: config.json,
        json_logs: config.log_format == LogFormat::Json,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return asked.fail(&format!("cannot start the async runtime: {e}"), 1),
    };
    let code = match runtime.block_on(lakecdc::run::run(config, lakecdc::progress::progress_bar()))
    {
        Ok(outcome) => {
            if asked.json && !outcome.json.is_empty() {
                println!("{}", outcome.json);
            } else {
                print!("{}", outcome.text);
            }
            outcome.exit_code
        }
        Err(e) => return asked.fail(&error_line(&e), e.exit_code()),
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// The output formats a run was asked for: a JSON report on stdout, JSON log lines on stderr.
#[derive(Default)]
struct Asked {
    json: bool,
    json_logs: bool,
}

impl Asked {
    /// As the merged settings ask, for a run whose settings did not all validate.
    fn of(s: &Resolved) -> Self {
        Self {
            json: s.flag("json"),
            json_logs: s.get("log-format") == Some("json"),
        }
    }

    /// Ends a failed run: the one error line on stderr (a JSON log event with `--log-format
    /// json`), and with `--json` a JSON object on stdout too, so a caller parsing stdout gets
    /// the failure and its exit code rather than nothing.
    fn fail(&self, line: &str, code: i32) -> ExitCode {
        if self.json_logs {
            tracing::error!(exit_code = code, "lakecdc: error: {line}");
        } else {
            eprintln!("lakecdc: error: {line}");
        }
        if self.json {
            println!(
                "{}",
                serde_json::json!({ "error": line, "exit_code": code })
            );
        }
        ExitCode::from(u8::try_from(code).unwrap_or(1))
    }
}

//! The `lakecdc` binary: parses flags and environment into the library's typed configuration,
//! sets up logging, runs one job, prints its report, and maps the outcome to an exit code
//! (0 done, 1 failed, 2 usage or configuration error, 3 done but needs attention).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lakecdc::config::{LakeLocation, TableName, Tables};
use lakecdc::lake::Layout;
use lakecdc::source::connect::PG_ENV_VARS;
use lakecdc::source::{Connector, PgSettings};
use lakecdc::store::s3::{S3Options, check_env_credentials};
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
    /// (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT). Prefer
    /// PGPASSWORD for the password.
    #[arg(long, env = "LAKECDC_PG_URL", hide_env_values = true, global = true)]
    pg_url: Option<String>,

    /// The lake: s3://bucket/root, file:///path, or a local path.
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

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the source tables and change_log index if missing, and register the schemas of
    /// --schema-dir (new names get the next id from 100; existing names keep theirs).
    InitDb,
}

/// Everything validated from the flags before any connection is opened.
struct Validated {
    connector: Connector,
    tables: Tables,
    #[allow(dead_code)] // read by the lake jobs as they land
    lake: LakeLocation,
    #[allow(dead_code)] // read by the lake jobs as they land
    layout: Layout,
    #[allow(dead_code)] // read by the lake jobs as they land
    s3: S3Options,
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn validate(g: &Global) -> Result<Validated> {
    let tables = Tables {
        registry: TableName::parse("--registry-table", &g.registry_table)?,
        entity: TableName::parse("--entity-table", &g.entity_table)?,
        eav: TableName::parse("--eav-table", &g.eav_table)?,
        change_log: TableName::parse("--change-log-table", &g.change_log_table)?,
    };
    let lake = LakeLocation::parse(&g.lake)?;
    let layout = Layout::new(lake.root(), &g.data_prefix, &g.manifest_template)?;
    let mut s3 = S3Options::new("");
    s3.endpoint = g.s3_endpoint.clone();
    s3.path_style = g.s3_path_style;
    s3.region = g.s3_region.clone();
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
        conninfo: g.pg_url.clone().or_else(|| env_var("DATABASE_URL")),
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
    })
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
    match cli.command {
        Command::InitDb => {
            let report =
                lakecdc::init_db::run(&v.connector, &v.tables, cli.global.schema_dir.as_deref())
                    .await?;
            if cli.global.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report)
                        .map_err(|e| Error::Invariant(e.to_string()))?
                );
            } else {
                print!("{}", report.to_text());
            }
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let validated = match validate(&cli.global) {
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

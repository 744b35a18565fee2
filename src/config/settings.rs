//! Every setting of every command in one table — its key (the long flag name and config-file
//! key), its environment variable, its default and the commands that have it — and the layers
//! they are merged from: a flag beats the environment, which beats the config file, which
//! beats the default (docs/operations.md). The binary hands over the flags it was given and a
//! way to look up environment variables; the library never reads the environment itself.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A command of the binary, in the order a user meets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Command {
    /// `init-db`.
    InitDb,
    /// `init`.
    Init,
    /// `flush`.
    Flush,
    /// `compact`.
    Compact,
    /// `gc`.
    Gc,
    /// `verify`.
    Verify,
    /// `inspect`.
    Inspect,
    /// `view`.
    View,
    /// `query`.
    Query,
    /// `requeue`.
    Requeue,
    /// `doctor`.
    Doctor,
    /// `attach`.
    Attach,
    /// `detach`.
    Detach,
}

impl Command {
    /// Every command, in the order a user meets them.
    pub const ALL: [Command; 13] = [
        Command::InitDb,
        Command::Init,
        Command::Flush,
        Command::Compact,
        Command::Gc,
        Command::Verify,
        Command::Inspect,
        Command::View,
        Command::Query,
        Command::Requeue,
        Command::Doctor,
        Command::Attach,
        Command::Detach,
    ];

    /// The command's name on the command line and in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Command::InitDb => "init-db",
            Command::Init => "init",
            Command::Flush => "flush",
            Command::Compact => "compact",
            Command::Gc => "gc",
            Command::Verify => "verify",
            Command::Inspect => "inspect",
            Command::View => "view",
            Command::Query => "query",
            Command::Requeue => "requeue",
            Command::Doctor => "doctor",
            Command::Attach => "attach",
            Command::Detach => "detach",
        }
    }

    /// The command named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Which commands have a setting.
#[derive(Debug, Clone, Copy)]
pub enum Scope {
    /// Every command.
    Global,
    /// These commands.
    Of(&'static [Command]),
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The long flag name, also the config-file key.
    pub key: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// The default, as it would be written on the command line.
    pub default: Option<&'static str>,
    /// The commands having it.
    pub scope: Scope,
    /// Other tools' variables that a value from the config file yields to (the environment
    /// beats the file, also where another tool reads it).
    pub yields_to: &'static [&'static str],
    /// May hold a secret: its value is never shown (not even as a default in help).
    pub secret: bool,
}

impl Setting {
    /// Whether `command` has this setting.
    pub fn applies_to(&self, command: Command) -> bool {
        match self.scope {
            Scope::Global => true,
            Scope::Of(commands) => commands.contains(&command),
        }
    }
}

use Command::{
    Attach, Compact, Detach, Doctor, Flush, Gc, Init, InitDb, Inspect, Query, Requeue, Verify, View,
};

const fn global(key: &'static str, env: &'static str, default: Option<&'static str>) -> Setting {
    Setting {
        key,
        env,
        default,
        scope: Scope::Global,
        yields_to: &[],
        secret: false,
    }
}

const fn of(
    commands: &'static [Command],
    key: &'static str,
    env: &'static str,
    default: Option<&'static str>,
) -> Setting {
    Setting {
        key,
        env,
        default,
        scope: Scope::Of(commands),
        yields_to: &[],
        secret: false,
    }
}

const ENGINE: &[Command] = &[Init, Flush, Compact];
const WRITERS: &[Command] = &[InitDb, Init, Flush, Compact, Gc, Requeue, Attach, Detach];

/// Every setting. Defaults live here and nowhere else.
pub const SETTINGS: &[Setting] = &[
    Setting {
        yields_to: &["DATABASE_URL"],
        secret: true,
        ..global("pg-url", "LAKECDC_PG_URL", None)
    },
    global("lake", "LAKECDC_LAKE", Some("./lake")),
    Setting {
        yields_to: &["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"],
        ..global("s3-endpoint", "LAKECDC_S3_ENDPOINT", None)
    },
    global("s3-path-style", "LAKECDC_S3_PATH_STYLE", Some("false")),
    Setting {
        yields_to: &["AWS_REGION", "AWS_DEFAULT_REGION"],
        ..global("s3-region", "LAKECDC_S3_REGION", None)
    },
    global("schema-dir", "LAKECDC_SCHEMA_DIR", None),
    global("schema", "LAKECDC_SCHEMA", None),
    global(
        "registry-table",
        "LAKECDC_REGISTRY_TABLE",
        Some("schema_registry"),
    ),
    global("entity-table", "LAKECDC_ENTITY_TABLE", Some("entity_main")),
    global("eav-table", "LAKECDC_EAV_TABLE", Some("eav_data")),
    global(
        "change-log-table",
        "LAKECDC_CHANGE_LOG_TABLE",
        Some("change_log"),
    ),
    global("data-prefix", "LAKECDC_DATA_PREFIX", Some("data")),
    global(
        "manifest-template",
        "LAKECDC_MANIFEST_TEMPLATE",
        Some("manifest/{schema_id}.json"),
    ),
    global(
        "max-manifest-size",
        "LAKECDC_MAX_MANIFEST_SIZE",
        Some("64MiB"),
    ),
    global(
        "history-retention",
        "LAKECDC_HISTORY_RETENTION",
        Some("24h"),
    ),
    global("json", "LAKECDC_JSON", Some("false")),
    global("log-format", "LAKECDC_LOG_FORMAT", Some("text")),
    global("copy-tap", "LAKECDC_COPY_TAP", Some("on")),
    global("metrics-file", "LAKECDC_METRICS_FILE", None),
    Setting {
        // A Pushgateway URL may carry basic-auth credentials.
        secret: true,
        ..global("pushgateway", "LAKECDC_PUSHGATEWAY", None)
    },
    global("metrics-instance", "LAKECDC_METRICS_INSTANCE", None),
    of(WRITERS, "dry-run", "LAKECDC_DRY_RUN", Some("false")),
    // DuckDB threads: flush's files are small (a second thread only spins waiting for work);
    // init writes two files at once, each on one thread.
    of(&[Init, Flush], "threads", "LAKECDC_THREADS", Some("1")),
    of(&[Compact], "threads", "LAKECDC_THREADS", Some("2")),
    of(ENGINE, "memory-limit", "LAKECDC_MEMORY_LIMIT", Some("1GB")),
    of(
        &[Verify],
        "memory-limit",
        "LAKECDC_MEMORY_LIMIT",
        Some("1GB"),
    ),
    of(&[Query], "threads", "LAKECDC_THREADS", None),
    of(
        &[Query],
        "memory-limit",
        "LAKECDC_MEMORY_LIMIT",
        Some("80%"),
    ),
    of(
        &[Init, Flush, Compact, Verify, Query],
        "work-dir",
        "LAKECDC_WORK_DIR",
        None,
    ),
    of(&[Flush], "parallelism", "LAKECDC_PARALLELISM", Some("2")),
    // A flush runs again within the minute: it leaves a held schema to that run (its own
    // variable, so that one exported for the maintenance jobs does not make flushes queue).
    // The maintenance jobs wait their turn behind a flush (seconds) rather than report
    // `locked`.
    of(&[Flush], "lock-wait", "LAKECDC_FLUSH_LOCK_WAIT", Some("0s")),
    of(
        &[Init, Gc, Verify],
        "lock-wait",
        "LAKECDC_LOCK_WAIT",
        Some("1m"),
    ),
    of(
        &[Flush, Inspect],
        "min-records",
        "LAKECDC_MIN_RECORDS",
        Some("20000"),
    ),
    of(&[Flush, Inspect], "max-age", "LAKECDC_MAX_AGE", Some("1h")),
    of(&[Flush], "force", "LAKECDC_FORCE", Some("false")),
    of(&[Flush], "batch-size", "LAKECDC_BATCH_SIZE", Some("10000")),
    of(&[Flush], "max-batches", "LAKECDC_MAX_BATCHES", None),
    of(&[Flush], "time-budget", "LAKECDC_TIME_BUDGET", Some("50s")),
    of(
        &[Flush],
        "scan-memory",
        "LAKECDC_SCAN_MEMORY",
        Some("256MiB"),
    ),
    of(
        &[Verify],
        "parallelism",
        "LAKECDC_VERIFY_PARALLELISM",
        Some("4"),
    ),
    of(&[Gc], "grace", "LAKECDC_GC_GRACE", Some("15m")),
    of(
        &[InitDb, Attach],
        "print-sql",
        "LAKECDC_PRINT_SQL",
        Some("false"),
    ),
    of(&[Attach, Detach], "table", "LAKECDC_TABLE", None),
    of(&[Attach], "name", "LAKECDC_SOURCE_NAME", None),
    of(
        &[Attach],
        "exclude-columns",
        "LAKECDC_EXCLUDE_COLUMNS",
        None,
    ),
    of(&[Verify], "source", "LAKECDC_VERIFY_SOURCE", Some("false")),
    of(&[Verify], "deep", "LAKECDC_VERIFY_DEEP", Some("false")),
    of(&[Verify, Gc], "repair", "LAKECDC_REPAIR", Some("false")),
    of(
        &[Verify, Requeue],
        "max-ids",
        "LAKECDC_MAX_IDS",
        Some("100"),
    ),
    of(&[Verify], "readers", "LAKECDC_READERS", Some("2")),
    of(&[Requeue], "row-id", "LAKECDC_ROW_ID", None),
    of(&[Requeue], "ids-from", "LAKECDC_IDS_FROM", None),
    of(&[Requeue], "where", "LAKECDC_WHERE", None),
    of(
        &[Init, Flush, Compact, Gc, Doctor],
        "adopt-source",
        "LAKECDC_ADOPT_SOURCE",
        Some("false"),
    ),
    of(&[View], "dialect", "LAKECDC_VIEW_DIALECT", Some("duckdb")),
    of(&[Query], "sql", "LAKECDC_SQL", None),
    of(&[Query], "file", "LAKECDC_SQL_FILE", None),
    of(&[Query], "format", "LAKECDC_FORMAT", None),
    of(&[Query], "output", "LAKECDC_OUTPUT", None),
    of(&[Query], "as-of", "LAKECDC_AS_OF", None),
    of(&[Query], "verify", "LAKECDC_VERIFY", Some("false")),
    of(&[Query], "cache-dir", "LAKECDC_CACHE_DIR", None),
    of(&[Query], "cache-max", "LAKECDC_CACHE_MAX", Some("10GiB")),
    of(
        &[Query],
        "parallelism",
        "LAKECDC_QUERY_PARALLELISM",
        Some("8"),
    ),
    of(
        &[Compact, Inspect],
        "target-base-size",
        "LAKECDC_TARGET_BASE_SIZE",
        Some("256MiB"),
    ),
    of(
        &[Compact, Inspect],
        "dirty-ratio",
        "LAKECDC_DIRTY_RATIO",
        Some("5%"),
    ),
    of(
        &[Compact, Inspect],
        "max-deltas",
        "LAKECDC_MAX_DELTAS",
        Some("32"),
    ),
    of(
        &[Compact, Inspect],
        "max-rewrite-bytes",
        "LAKECDC_MAX_REWRITE_BYTES",
        Some("8GiB"),
    ),
    of(
        &[Compact],
        "skip-input-checksum-verify",
        "LAKECDC_SKIP_INPUT_CHECKSUM_VERIFY",
        Some("false"),
    ),
    of(&[Compact], "max-retries", "LAKECDC_MAX_RETRIES", Some("5")),
    of(
        &[Init],
        "replace-delta",
        "LAKECDC_REPLACE_DELTA",
        Some("false"),
    ),
    of(
        &[Init],
        "target-file-size",
        "LAKECDC_TARGET_FILE_SIZE",
        Some("256MiB"),
    ),
    of(
        &[Init],
        "max-file-rows",
        "LAKECDC_MAX_FILE_ROWS",
        Some("200000"),
    ),
    of(&[Init], "page-rows", "LAKECDC_PAGE_ROWS", Some("50000")),
    of(&[Init], "readers", "LAKECDC_READERS", Some("2")),
    of(
        &[Init, Flush],
        "read-order",
        "LAKECDC_READ_ORDER",
        Some("auto"),
    ),
];

/// The setting `key` of `command`.
pub fn setting(command: Command, key: &str) -> Option<&'static Setting> {
    SETTINGS
        .iter()
        .find(|s| s.key == key && s.applies_to(command))
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Env(&'static str),
    /// The config file.
    File(PathBuf),
    /// The built-in default.
    Default,
}

/// A `--config` file: top-level settings and per-command tables.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    path: PathBuf,
    top: BTreeMap<String, String>,
    sections: BTreeMap<Command, BTreeMap<String, String>>,
    /// The file's mode when it holds a password and group or others may read or write it.
    exposed_mode: Option<u32>,
}

/// The most of a `--config` file read.
const CONFIG_LIMIT: u64 = 1024 * 1024;

impl ConfigFile {
    /// Reads and checks the TOML file at `path`: every key must be a setting (a top-level key
    /// of some command, a table's key of that command), so a misspelt setting is an error, not
    /// silently ignored.
    pub fn load(path: &Path) -> Result<Self> {
        let at = |what: String| Error::setting("config", format!("{}: {what}", path.display()));
        let bytes = std::fs::File::open(path)
            .and_then(|f| super::read_at_most(f, CONFIG_LIMIT))
            .map_err(|e| at(format!("cannot read it ({e})")))?
            .ok_or_else(|| {
                at(format!(
                    "longer than {} KiB: not a settings file",
                    CONFIG_LIMIT >> 10
                ))
            })?;
        let text = String::from_utf8(bytes).map_err(|_| at("not UTF-8 text".to_string()))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            at(format!(
                "not valid TOML ({})",
                e.message().lines().next().unwrap_or_default()
            ))
        })?;
        let mut file = ConfigFile {
            path: path.to_path_buf(),
            ..ConfigFile::default()
        };
        for (key, value) in table {
            match (value, Command::parse(&key)) {
                (toml::Value::Table(t), Some(command)) => {
                    let mut section = BTreeMap::new();
                    for (k, v) in t {
                        check_section_key(command, &k).map_err(at)?;
                        section.insert(k, text_of(&v).map_err(at)?);
                    }
                    file.sections.insert(command, section);
                }
                (toml::Value::Table(_), None) => {
                    let names: Vec<_> = Command::ALL.iter().map(|c| c.name()).collect();
                    return Err(at(format!(
                        "[{key}] is not a command (tables: {})",
                        names.join(", ")
                    )));
                }
                (value, _) => {
                    if key == "config" || !SETTINGS.iter().any(|s| s.key == key) {
                        return Err(at(format!(
                            "{key} is not a setting of any command (keys are the long flag names)"
                        )));
                    }
                    file.top.insert(key, text_of(&value).map_err(at)?);
                }
            }
        }
        file.exposed_mode = file.exposed_mode(&text);
        Ok(file)
    }

    /// The file's mode when a secret setting in it holds a password and the file is open to
    /// group or others: libpq refuses such a `.pgpass`; lakecdc warns (docs/security.md).
    fn exposed_mode(&self, text: &str) -> Option<u32> {
        use std::os::unix::fs::PermissionsExt;
        let secrets = SETTINGS.iter().filter(|s| s.secret);
        let values = self.sections.values().chain([&self.top]);
        let holds_password = values
            .flat_map(|section| secrets.clone().filter_map(|s| section.get(s.key)))
            .any(|v| may_hold_password(v));
        let mode = std::fs::metadata(&self.path).ok()?.permissions().mode() & 0o777;
        (holds_password && !text.is_empty() && mode & 0o077 != 0).then_some(mode)
    }

    /// A warning for each thing in the file that puts a secret at risk.
    pub fn warnings(&self) -> Vec<String> {
        self.exposed_mode
            .map(|mode| {
                format!(
                    "config file {} holds a password and other users may read it (mode {mode:03o}): chmod 600 it",
                    self.path.display()
                )
            })
            .into_iter()
            .collect()
    }

    /// The default `setting` shows in the help of `command` (`None`: the program's own help):
    /// the file's value over the built-in one; nothing for a secret.
    pub fn shown_default(
        file: Option<&Self>,
        command: Option<Command>,
        setting: &Setting,
    ) -> Option<String> {
        if setting.secret {
            return None;
        }
        let from_file = file.and_then(|f| match command {
            Some(c) => f.get(c, setting.key),
            None => f.top.get(setting.key),
        });
        from_file.cloned().or(setting.default.map(str::to_string))
    }

    /// The file's value of `key` for `command`: the command's own table first (for inspect,
    /// which judges with flush's and compact's thresholds, theirs next), then the top level.
    fn get(&self, command: Command, key: &str) -> Option<&String> {
        let mut tables = vec![command];
        if command == Inspect {
            tables.extend([Flush, Compact]);
        }
        tables
            .iter()
            .find_map(|c| self.sections.get(c).and_then(|s| s.get(key)))
            .or_else(|| self.top.get(key))
    }
}

fn check_section_key(command: Command, key: &str) -> std::result::Result<(), String> {
    let name = command.name();
    if SETTINGS
        .iter()
        .any(|s| s.key == key && matches!(s.scope, Scope::Global))
    {
        return Err(format!(
            "[{name}] {key}: this setting applies to every command; set it at the top level"
        ));
    }
    if setting(command, key).is_none() {
        return Err(format!("[{name}] {key} is not a setting of {name}"));
    }
    Ok(())
}

/// A setting's value as its flag would take it (a list as comma-separated values).
fn text_of(value: &toml::Value) -> std::result::Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => items
            .iter()
            .map(text_of)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(|v| v.join(",")),
        other => Err(format!("a {} is not a setting value", other.type_str())),
    }
}

/// True when a connection string may carry a password: a `password` keyword or parameter, or
/// a URL whose user part has a `user:password` form.
fn may_hold_password(value: &str) -> bool {
    let url_password = value.split_once("://").is_some_and(|(_, rest)| {
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        authority
            .rsplit_once('@')
            .is_some_and(|(user, _)| user.contains(':'))
    });
    url_password || value.to_ascii_lowercase().contains("password")
}

/// The config file named by `--config FILE` or `--config=FILE` in `args` (the first is the
/// program), else by `from_env` (`LAKECDC_CONFIG`). Read before the command line is parsed,
/// so that `--help` shows the file's values.
pub fn config_path(args: &[OsString], from_env: Option<OsString>) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--" {
            break;
        } else if arg == "--config" {
            return it.next().map(PathBuf::from);
        } else if let Some(value) = arg.as_bytes().strip_prefix(b"--config=") {
            // Byte-wise, so that a path that is not UTF-8 is still found.
            return Some(PathBuf::from(OsStr::from_bytes(value)));
        }
    }
    from_env.filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The layers a command's settings are merged from.
pub struct Layers<'a> {
    /// The flags given on the command line: key → value (a repeated flag comma-joined).
    pub flags: BTreeMap<String, String>,
    /// Looks up an environment variable (`None` when unset or empty).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// The config file, if one was named.
    pub file: Option<ConfigFile>,
}

/// A command's settings after merging.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The command.
    pub command: Command,
    values: BTreeMap<&'static str, (String, Origin)>,
    /// The environment variables the jobs pass on to their own clients (libpq's PG*, AWS's).
    pub env: BTreeMap<String, String>,
    /// Warnings about the configuration itself (a config file exposing a password), logged
    /// when the job starts.
    pub warnings: Vec<String>,
}

impl Resolved {
    /// Merges the layers for `command` (flag > env > file > default). `passed_env` names the
    /// variables other clients read, kept for them.
    pub fn merge(command: Command, layers: &Layers<'_>, passed_env: &[&str]) -> Self {
        let mut values = BTreeMap::new();
        for s in SETTINGS.iter().filter(|s| s.applies_to(command)) {
            let env_set = |var: &str| (layers.env)(var).is_some();
            let value = if let Some(v) = layers.flags.get(s.key) {
                Some((v.clone(), Origin::Flag))
            } else if let Some(v) = (layers.env)(s.env) {
                Some((v, Origin::Env(s.env)))
            } else if let Some(v) = layers.file.as_ref().and_then(|f| f.get(command, s.key)) {
                // The environment beats the file, also where another tool reads it.
                let path = layers
                    .file
                    .as_ref()
                    .map(|f| f.path.clone())
                    .unwrap_or_default();
                (!s.yields_to.iter().any(|v| env_set(v))).then(|| (v.clone(), Origin::File(path)))
            } else {
                s.default.map(|d| (d.to_string(), Origin::Default))
            };
            if let Some(v) = value {
                values.insert(s.key, v);
            }
        }
        let env = passed_env
            .iter()
            .filter_map(|k| (layers.env)(k).map(|v| (k.to_string(), v)))
            .collect();
        Self {
            command,
            values,
            env,
            warnings: layers
                .file
                .as_ref()
                .map(ConfigFile::warnings)
                .unwrap_or_default(),
        }
    }

    /// The value of `key` (`None` when unset and without default).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(|(v, _)| v.as_str())
    }

    /// Where the value of `key` came from.
    pub fn origin(&self, key: &str) -> Option<&Origin> {
        self.values.get(key).map(|(_, o)| o)
    }

    /// A value that must be there (it has a default).
    pub fn text(&self, key: &str) -> Result<&str> {
        self.get(key)
            .ok_or_else(|| Error::Invariant(format!("setting {key} has no value and no default")))
    }

    /// A boolean setting: a flag given is true; from the environment or the file, `false`,
    /// `no`, `off`, `n`, `f`, `0` and an empty value are false, anything else true.
    pub fn flag(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| {
            !matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "" | "false" | "no" | "off" | "n" | "f" | "0"
            )
        })
    }

    /// A number.
    pub fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>> {
        self.get(key)
            .map(|v| {
                v.trim()
                    .parse::<T>()
                    .map_err(|_| Error::setting(key, format!("{v:?} is not a valid number")))
            })
            .transpose()
    }

    /// A comma-separated list (empty when unset).
    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A path.
    pub fn path(&self, key: &str) -> Option<PathBuf> {
        self.get(key).map(PathBuf::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers<'a>(
        flags: &[(&str, &str)],
        env: &'a dyn Fn(&str) -> Option<String>,
        file: Option<ConfigFile>,
    ) -> Layers<'a> {
        Layers {
            flags: flags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env,
            file,
        }
    }

    fn file(text: &str) -> Result<ConfigFile> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lakecdc.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile::load(&path)
    }

    #[test]
    fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
        let f =
            || Some(file("min-records = 7\nmax-age = \"5m\"\n[flush]\nbatch-size = 3").unwrap());
        let env = |k: &str| (k == "LAKECDC_MAX_AGE").then(|| "9m".to_string());
        let r = Resolved::merge(Flush, &layers(&[("min-records", "1")], &env, f()), &[]);
        assert_eq!(r.get("min-records"), Some("1"));
        assert_eq!(r.origin("min-records"), Some(&Origin::Flag));
        assert_eq!(r.get("max-age"), Some("9m"));
        assert_eq!(r.get("batch-size"), Some("3"));
        assert_eq!(r.get("time-budget"), Some("50s"));
        assert_eq!(r.origin("time-budget"), Some(&Origin::Default));
        // inspect judges with flush's thresholds, also from flush's table.
        let none = |_: &str| None;
        let r = Resolved::merge(Inspect, &layers(&[], &none, f()), &[]);
        assert_eq!(r.get("min-records"), Some("7"));
        assert_eq!(r.get("batch-size"), None);
    }

    #[test]
    fn a_file_value_yields_to_another_tools_variable() {
        let f = Some(file("s3-region = \"eu-west-1\"").unwrap());
        let env = |k: &str| (k == "AWS_REGION").then(|| "us-east-2".to_string());
        let r = Resolved::merge(Gc, &layers(&[], &env, f), &[]);
        assert_eq!(r.get("s3-region"), None);
    }

    #[test]
    fn a_misspelt_or_misplaced_key_is_an_error() {
        let e = file("min-recrods = 1").unwrap_err().to_string();
        assert!(
            e.contains("min-recrods is not a setting of any command"),
            "{e}"
        );
        let e = file("[flsh]\nx = 1").unwrap_err().to_string();
        assert!(e.contains("[flsh] is not a command"), "{e}");
        let e = file("[gc]\nbatch-size = 1").unwrap_err().to_string();
        assert!(e.contains("[gc] batch-size is not a setting of gc"), "{e}");
        let e = file("[gc]\nlake = \"x\"").unwrap_err().to_string();
        assert!(e.contains("set it at the top level"), "{e}");
    }

    #[test]
    fn the_file_is_named_by_the_flag_in_either_form() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let env = Some(OsString::from("env.toml"));
        let path = |a: &[&str]| config_path(&args(a), env.clone());
        assert_eq!(
            path(&["lakecdc", "flush", "--config", "a.toml"]),
            Some("a.toml".into())
        );
        assert_eq!(
            path(&["lakecdc", "--config=b.toml", "gc"]),
            Some("b.toml".into())
        );
        assert_eq!(
            path(&["lakecdc", "flush", "--", "--config", "c.toml"]),
            Some("env.toml".into())
        );
        let not_utf8 = vec![
            OsString::from("lakecdc"),
            OsString::from(OsStr::from_bytes(b"--config=caf\xe9.toml")),
        ];
        assert_eq!(
            config_path(&not_utf8, None),
            Some(PathBuf::from(OsStr::from_bytes(b"caf\xe9.toml")))
        );
        assert_eq!(
            config_path(&args(&["lakecdc"]), Some(OsString::new())),
            None
        );
    }

    #[test]
    fn every_setting_key_is_unique_per_command() {
        for c in Command::ALL {
            let mut keys: Vec<_> = SETTINGS
                .iter()
                .filter(|s| s.applies_to(c))
                .map(|s| s.key)
                .collect();
            let n = keys.len();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), n, "{c:?}");
        }
    }

    #[test]
    fn an_endless_or_binary_config_file_is_refused_in_one_line() {
        let err = ConfigFile::load(Path::new("/dev/zero")).unwrap_err();
        assert!(
            err.to_string().contains("/dev/zero: longer than 1024 KiB"),
            "{err}"
        );
        assert_eq!(err.exit_code(), 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, b"lake = \"\xff\"\n").unwrap();
        let err = ConfigFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn a_config_file_holding_a_password_and_open_to_others_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lakecdc.toml");
        let warnings = |text: &str, mode: u32| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            ConfigFile::load(&path).unwrap().warnings()
        };
        let url = "pg-url = \"postgres://app:hunter2@db/x\"\n";
        let kv = "pg-url = \"host=db password=hunter2\"\n";
        for (text, mode) in [(url, 0o644), (url, 0o640), (kv, 0o604)] {
            let w = warnings(text, mode);
            assert_eq!(w.len(), 1, "{text} {mode:o}");
            assert!(w[0].contains(&format!("mode {mode:03o}")), "{}", w[0]);
            assert!(w[0].contains("chmod 600"), "{}", w[0]);
            assert!(!w[0].contains("hunter2"), "{}", w[0]);
        }
        // Private, or no password in it: nothing to say.
        assert!(warnings(url, 0o600).is_empty());
        assert!(warnings("pg-url = \"postgres://app@db/x\"\n", 0o644).is_empty());
        assert!(warnings("lake = \"./lake\"\n", 0o644).is_empty());
        // The warning reaches the merged settings that the job logs.
        warnings(url, 0o644);
        let file = Some(ConfigFile::load(&path).unwrap());
        let none = |_: &str| None;
        let layers = Layers {
            flags: Default::default(),
            env: &none,
            file,
        };
        assert_eq!(
            Resolved::merge(Command::Flush, &layers, &[]).warnings.len(),
            1
        );
    }
}

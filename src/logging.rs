//! Logging on stderr: text or JSON lines, at a level the binary's `-v`/`-q` set, unless a
//! filter (`LAKECDC_LOG`, `RUST_LOG`) says otherwise. Messages are lowercase constants with the
//! values in fields; row values and secrets are never logged.

use crate::run::LogFormat;

/// Installs the global subscriber. `verbosity` is the count of `-v` less the count of `-q`;
/// `filter`, when given, is an `EnvFilter` directive that replaces the level.
pub fn init(format: LogFormat, verbosity: i8, filter: Option<&str>) {
    let level = match verbosity {
        0 => "info",
        1 => "debug",
        v if v >= 2 => "trace",
        -1 => "warn",
        _ => "error",
    };
    let filter = filter
        .map(str::to_string)
        .unwrap_or_else(|| format!("warn,lakecdc={level}"));
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

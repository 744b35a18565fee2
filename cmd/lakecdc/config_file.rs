//! `--config FILE` (or `LAKECDC_CONFIG`): an optional TOML file of settings, below flags and
//! the environment and above the built-in defaults (DESIGN §5). Its keys are the long flag
//! names (`lake = "s3://bucket/root"`, `min-records = 500`, `schema = ["a", "b"]`). A top-level
//! key applies to every command that has the flag; a `[flush]`, `[compact]`, … table holds
//! settings of that command alone (overriding a top-level one). A key no command has, or a
//! table that is no command, is an error: a misspelt setting must not be silently ignored.
//! Secrets may live here (a file is not a command line).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::Command;

/// The file named by `--config FILE` or `--config=FILE` in `args` (the first is the program),
/// else by `LAKECDC_CONFIG`.
pub fn path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return it.next().map(PathBuf::from);
        }
        // Byte-wise, so that a path that is not UTF-8 is still found.
        if let Some(value) = arg.as_bytes().strip_prefix(b"--config=") {
            return Some(PathBuf::from(OsStr::from_bytes(value)));
        }
    }
    std::env::var_os("LAKECDC_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `cmd` with the settings of `file` as its defaults (a flag or an environment variable still
/// wins). The error is one line naming the file and the key.
pub fn apply(mut cmd: Command, file: &Path) -> Result<Command, String> {
    let at = |what: String| format!("--config {}: {what}", file.display());
    let text = std::fs::read_to_string(file).map_err(|e| at(format!("cannot read it ({e})")))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        at(format!(
            "not valid TOML ({})",
            e.message().lines().next().unwrap_or_default()
        ))
    })?;
    let commands: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let mut sections = Vec::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(t) if commands.contains(&key) => sections.push((key, t)),
            toml::Value::Table(_) => {
                return Err(at(format!(
                    "[{key}] is not a command (tables: {})",
                    commands.join(", ")
                )));
            }
            value => {
                cmd = set_everywhere(cmd, &key, &text_of(&value).map_err(&at)?).map_err(&at)?
            }
        }
    }
    // Each command's own table after the top level, so that it overrides it. inspect judges
    // with flush's and compact's thresholds: their tables apply to it too (where it has the
    // flag), and its own table, taken last, overrides them.
    sections.sort_by_key(|(command, _)| command == "inspect");
    for (command, settings) in sections {
        for (key, value) in settings {
            let value = text_of(&value).map_err(&at)?;
            cmd = set_in(cmd, &command, &key, &value).map_err(&at)?;
            if command == "flush" || command == "compact" {
                cmd = set_if_present(cmd, "inspect", &key, &value);
            }
        }
    }
    Ok(cmd)
}

/// The id of the argument of `cmd` whose long name is `key` (the `config` flag excluded).
fn arg_id(cmd: &Command, key: &str) -> Option<clap::Id> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(key) && key != "config")
        .map(|a| a.get_id().clone())
}

/// Sets the default of `key` on the program (a flag every command has) or on every command
/// that has it.
fn set_everywhere(mut cmd: Command, key: &str, value: &str) -> Result<Command, String> {
    if let Some(id) = arg_id(&cmd, key) {
        return Ok(cmd.mut_arg(id, |a| a.default_value(value.to_string())));
    }
    let having: Vec<(String, clap::Id)> = cmd
        .get_subcommands()
        .filter_map(|c| arg_id(c, key).map(|id| (c.get_name().to_string(), id)))
        .collect();
    if having.is_empty() {
        return Err(format!(
            "{key} is not a setting of any command (keys are the long flag names)"
        ));
    }
    for (command, id) in having {
        cmd = cmd.mut_subcommand(command, |c| {
            c.mut_arg(id, |a| a.default_value(value.to_string()))
        });
    }
    Ok(cmd)
}

/// Sets the default of `key` for `command` alone.
fn set_in(cmd: Command, command: &str, key: &str, value: &str) -> Result<Command, String> {
    if arg_id(&cmd, key).is_some() {
        return Err(format!(
            "[{command}] {key}: this setting applies to every command; set it at the top level"
        ));
    }
    let id = cmd
        .find_subcommand(command)
        .and_then(|c| arg_id(c, key))
        .ok_or_else(|| format!("[{command}] {key} is not a setting of {command}"))?;
    Ok(cmd.mut_subcommand(command, |c| {
        c.mut_arg(id, |a| a.default_value(value.to_string()))
    }))
}

/// Sets the default of `key` for `command` when it has that flag.
fn set_if_present(cmd: Command, command: &str, key: &str, value: &str) -> Command {
    match cmd.find_subcommand(command).and_then(|c| arg_id(c, key)) {
        Some(id) => cmd.mut_subcommand(command, |c| {
            c.mut_arg(id, |a| a.default_value(value.to_string()))
        }),
        None => cmd,
    }
}

/// A setting's value as its flag would take it (a list as comma-separated values).
fn text_of(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Array(items) => items
            .iter()
            .map(text_of)
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join(",")),
        other => Err(format!("a {} is not a setting value", other.type_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_named_by_the_flag_in_either_form() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            path(&args(&["lakecdc", "flush", "--config", "a.toml"])),
            Some(PathBuf::from("a.toml"))
        );
        assert_eq!(
            path(&args(&["lakecdc", "--config=b.toml", "gc"])),
            Some(PathBuf::from("b.toml"))
        );
        let not_utf8 = vec![
            OsString::from("lakecdc"),
            OsString::from(OsStr::from_bytes(b"--config=caf\xe9.toml")),
        ];
        assert_eq!(
            path(&not_utf8),
            Some(PathBuf::from(OsStr::from_bytes(b"caf\xe9.toml")))
        );
        assert_eq!(
            path(&args(&["lakecdc", "flush", "--", "--config", "c.toml"])),
            std::env::var_os("LAKECDC_CONFIG")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        );
    }
}

//! Typed configuration shared by every job, with validation. The binary converts its flags and
//! environment into these types once; the library never reads the environment or sees clap.

use std::path::PathBuf;

pub mod settings;

use crate::error::{Error, Result};

/// A PostgreSQL table name, optionally schema-qualified, validated so it can be quoted safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// Parses `table` or `schema.table` (the value of `setting`); each part must be a plain
    /// identifier.
    pub fn parse(setting: &str, s: &str) -> Result<Self> {
        let bad = || {
            Error::setting(
                setting,
                format!(
                    "{s:?} is not a valid table name: use letters, digits and _ (optionally schema.table)"
                ),
            )
        };
        let (schema, name) = match s.split_once('.') {
            Some((a, b)) => (Some(a), b),
            None => (None, s),
        };
        if !is_plain_identifier(name) || schema.is_some_and(|sc| !is_plain_identifier(sc)) {
            return Err(bad());
        }
        Ok(Self {
            schema: schema.map(str::to_string),
            name: name.to_string(),
        })
    }

    /// The quoted SQL identifier, e.g. `"public"."change_log"`.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote_ident(s), quote_ident(&self.name)),
            None => quote_ident(&self.name),
        }
    }

    /// The unqualified table name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A quoted identifier derived from the table name (e.g. an index name).
    pub fn derived(&self, suffix: &str) -> String {
        quote_ident(&format!("{}_{suffix}", self.name))
    }

    /// The table's schema, when the name is qualified.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Another table of the same schema (`name` is a plain identifier chosen by lakecdc).
    pub fn sibling(&self, name: &str) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: name.to_string(),
        }
    }

    /// This table qualified with `schema` when it is not already (for SQL that runs with a
    /// pinned `search_path`, such as a `SECURITY DEFINER` trigger function); `None` when
    /// `schema` is needed and is not a plain identifier without `$` (it comes from the
    /// database, and the function's body is dollar-quoted).
    pub fn qualified_in(&self, schema: &str) -> Option<TableName> {
        if self.schema.is_none() && (!is_plain_identifier(schema) || schema.contains('$')) {
            return None;
        }
        Some(TableName {
            schema: Some(self.schema.clone().unwrap_or_else(|| schema.to_string())),
            name: self.name.clone(),
        })
    }
}

/// Whether `p` is an identifier that needs no quoting to mean itself, lowercased: a letter or
/// `_`, then letters, digits, `_` and `$`, at most 63 bytes.
fn is_plain_identifier(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 63
        && p.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && p.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// The first of the views a reader makes of schema `a` (`<a>` and `<a>__history`) that DuckDB
/// would take for one of `b`'s: it matches names without regard to ASCII case.
pub fn shared_view(a: &str, b: &str) -> Option<String> {
    let views = |n: &str| [n.to_string(), format!("{n}__history")];
    let theirs = views(b);
    views(a)
        .into_iter()
        .find(|v| theirs.iter().any(|t| t.eq_ignore_ascii_case(v)))
}

/// At most `limit` bytes of `from`, or `None` when it holds more: a settings file, an id list
/// or a query is text a person wrote, and a path such as `/dev/zero` must not grow the process
/// without end.
pub fn read_at_most(from: impl std::io::Read, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    from.take(limit + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

/// Quotes a SQL identifier (PostgreSQL and DuckDB spell it the same): `"` doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Escapes a SQL string literal's content (`'` doubled; standard-conforming strings).
pub fn sql_string(s: &str) -> String {
    s.replace('\'', "''")
}

/// Percent-decodes `s` (RFC 3986): each `%XX` becomes its byte; `None` when a `%` is not
/// followed by two hex digits.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(out)
}

/// The longest schema name, in bytes: a PostgreSQL identifier's limit (`NAMEDATALEN` - 1).
pub const SCHEMA_NAME_MAX: usize = 63;

/// The rule [`check_schema_name`] enforces, as the operator reads it in errors.
pub const SCHEMA_NAME_RULE: &str = "schema names are 1 to 63 letters, digits, '_', '.' or '-', starting with a letter, digit or '_' (so never '.', '..' or a path)";

/// The most characters of a refused name an error shows.
const SHOWN_NAME_MAX: usize = 80;

/// A schema name that may not be used: it would not stay a plain file name inside the schema
/// directory (docs/hazards.md S6), or could not be a PostgreSQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown} is not a valid schema name: {SCHEMA_NAME_RULE}")]
pub struct SchemaNameError {
    /// The name as errors show it: quoted, escaped by [`escape_name`], shortened.
    pub shown: String,
}

/// Checks a schema name — a registry row's, a `--schema` selector's, a metadata file's stem —
/// against [`SCHEMA_NAME_RULE`]: `[A-Za-z0-9_][A-Za-z0-9_.-]*`, at most [`SCHEMA_NAME_MAX`]
/// bytes. Such a name joined to the schema directory names a file directly inside it.
pub fn check_schema_name(name: &str) -> std::result::Result<(), SchemaNameError> {
    let first_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    let rest_ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if first_ok && rest_ok && name.len() <= SCHEMA_NAME_MAX {
        Ok(())
    } else {
        Err(SchemaNameError {
            shown: escape_name(name),
        })
    }
}

/// A name from outside lakecdc (a registry row, a file name) made safe for one line of a
/// terminal or a log: quoted, printable ASCII kept, `"` and `\` escaped, control characters as
/// `\xNN`, everything else as `\u{…}`; past [`SHOWN_NAME_MAX`] characters it is cut and its
/// length given.
pub fn escape_name(name: &str) -> String {
    let mut out = String::from("\"");
    for c in name.chars().take(SHOWN_NAME_MAX) {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            c if c.is_ascii() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    out.push('"');
    if name.chars().nth(SHOWN_NAME_MAX).is_some() {
        out.push_str(&format!("… ({} bytes)", name.len()));
    }
    out
}

/// The warning an S3 endpoint deserves, if any: plain `http://` to a host that is not loopback
/// (`localhost`, 127.0.0.0/8, `::1`) carries every lake object and request unencrypted and
/// unauthenticated, so anyone on the path can read or alter the lake (docs/hazards.md S7).
/// `None` for `https://`, for loopback, and for anything that is not an `http://` URL.
pub fn s3_endpoint_warning(endpoint: &str) -> Option<String> {
    let scheme_end = endpoint.find("://")?;
    let (scheme, rest) = (&endpoint[..scheme_end], &endpoint[scheme_end + 3..]);
    if !scheme.eq_ignore_ascii_case("http") {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or(v6, |(h, _)| h),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    if is_loopback(host) {
        return None;
    }
    Some(format!(
        "the S3 endpoint {} is plain http to a host that is not loopback: lake objects and requests travel unencrypted and unauthenticated, so anyone on the network path can read or alter the lake; use https",
        escape_name(host)
    ))
}

/// `localhost`, an address in 127.0.0.0/8, or `::1` (also as an IPv4-mapped address).
fn is_loopback(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(std::net::IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// The four source tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    /// `schema_registry(schema_name, schema_id)`.
    pub registry: TableName,
    /// `entity_main`.
    pub entity: TableName,
    /// `eav_data`.
    pub eav: TableName,
    /// `change_log`.
    pub change_log: TableName,
}

impl Tables {
    /// The table sources attached with `lakecdc attach` (docs/design.md §9), beside the
    /// registry.
    pub fn sources(&self) -> TableName {
        self.registry.sibling("lakecdc_sources")
    }

    /// The touch log of the table sources' triggers, beside the registry (docs/design.md §9.1).
    pub fn touch_log(&self) -> TableName {
        self.registry.sibling("lakecdc_touch")
    }
}

impl Default for Tables {
    fn default() -> Self {
        let t = |n: &str| TableName {
            schema: None,
            name: n.to_string(),
        };
        Self {
            registry: t("schema_registry"),
            entity: t("entity_main"),
            eav: t("eav_data"),
            change_log: t("change_log"),
        }
    }
}

/// Where the lake lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LakeLocation {
    /// A local directory.
    Local(PathBuf),
    /// An S3 bucket and a root prefix inside it (possibly empty).
    S3 {
        /// The bucket.
        bucket: String,
        /// Key prefix of the lake inside the bucket.
        root: String,
    },
}

impl LakeLocation {
    /// Parses `s3://bucket[/root]`, `file:///path`, or a plain path.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, root) = rest.split_once('/').unwrap_or((rest, ""));
            let valid = (3..=63).contains(&bucket.len())
                && bucket
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                && !bucket.starts_with(['-', '.'])
                && !bucket.ends_with(['-', '.']);
            if !valid {
                return Err(Error::setting(
                    "lake",
                    format!(
                        "{s:?}: {bucket:?} is not a valid S3 bucket name (3-63 lowercase letters, digits, '-' or '.')"
                    ),
                ));
            }
            return Ok(LakeLocation::S3 {
                bucket: bucket.to_string(),
                root: root.trim_end_matches('/').to_string(),
            });
        }
        if s.contains("://") && !s.starts_with("file://") {
            return Err(Error::setting(
                "lake",
                format!("{s:?}: unsupported scheme; use s3://bucket/root, file:///path or a path"),
            ));
        }
        let path = s.strip_prefix("file://").unwrap_or(s);
        // `file://host/path` names a host, which a local lake cannot have: `file://tmp/x`
        // would otherwise be the relative path `tmp/x`.
        if s.starts_with("file://") && !path.starts_with('/') {
            return Err(Error::setting(
                "lake",
                format!("{s:?} names a host; a local lake is file:///absolute/path or a path"),
            ));
        }
        if path.is_empty() {
            return Err(Error::setting(
                "lake",
                "is empty: give s3://bucket/root, file:///path or a path",
            ));
        }
        Ok(LakeLocation::Local(PathBuf::from(path)))
    }

    /// For messages: the location as the operator wrote it.
    pub fn describe(&self) -> String {
        match self {
            LakeLocation::Local(p) => p.display().to_string(),
            LakeLocation::S3 { bucket, root } if root.is_empty() => format!("s3://{bucket}"),
            LakeLocation::S3 { bucket, root } => format!("s3://{bucket}/{root}"),
        }
    }

    /// The root prefix inside the store (empty for a local directory).
    pub fn root(&self) -> &str {
        match self {
            LakeLocation::Local(_) => "",
            LakeLocation::S3 { root, .. } => root,
        }
    }
}

/// Parses a DuckDB memory limit such as `4GB`, `512MiB` or `75%`, refusing anything that could
/// not be passed to `SET memory_limit` verbatim.
pub fn parse_memory_limit(s: &str) -> Result<String> {
    let (num, unit) = number_and_unit(s.trim());
    let unit_ok = [
        "", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "%",
    ]
    .iter()
    .any(|u| u.eq_ignore_ascii_case(unit.trim()));
    if num.is_empty() || num.parse::<f64>().is_err() || !unit_ok {
        return Err(Error::setting(
            "memory-limit",
            format!("{s:?} is not a size like 4GB, 512MiB or 75%"),
        ));
    }
    if unit.trim() == "%" {
        // DuckDB takes no percentage: a share of this machine's memory, in bytes.
        let pct: f64 = num.parse().unwrap_or(0.0);
        if !(pct > 0.0 && pct <= 100.0) {
            return Err(Error::setting(
                "memory-limit",
                format!("{s:?} is not a percentage above 0 and at most 100"),
            ));
        }
        let total = total_memory().ok_or_else(|| {
            Error::setting(
                "memory-limit",
                format!("{s:?} needs the machine's memory size, which /proc/meminfo does not give: pass a size like 4GB"),
            )
        })?;
        return Ok(format!("{}B", (total as f64 * pct / 100.0) as u64));
    }
    Ok(format!("{num}{}", unit.trim()))
}

/// The machine's memory in bytes (`MemTotal` of /proc/meminfo).
fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// One of `parts` equal shares of a memory limit already checked by [`parse_memory_limit`]
/// (`512MB` in two is `256MB`, `75%` is `37.5%`), for jobs that run several engines at once.
pub fn share_memory_limit(limit: &str, parts: usize) -> String {
    let (num, unit) = number_and_unit(limit);
    match num.parse::<f64>() {
        Ok(n) if parts > 1 => format!("{}{unit}", n / parts as f64),
        _ => limit.to_string(),
    }
}

/// `4.5GB` → (`4.5`, `GB`).
fn number_and_unit(s: &str) -> (&str, &str) {
    let digits = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .count();
    s.split_at(digits)
}

/// Parses a byte size such as `256MiB`, `1GB`, `512KiB` or a bare number of bytes (the value
/// of `setting`).
pub fn parse_size(setting: &str, s: &str) -> Result<u64> {
    let bad = || {
        Error::setting(
            setting,
            format!("{s:?} is not a size like 256MiB, 1GB or 1048576"),
        )
    };
    let t = s.trim();
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    n.checked_mul(factor).ok_or_else(bad)
}

/// Parses a ratio given as a fraction (`0.05`) or a percentage (`5%`) (the value of `setting`).
pub fn parse_ratio(setting: &str, s: &str) -> Result<f64> {
    let bad = || Error::setting(setting, format!("{s:?} is not a ratio like 0.05 or 5%"));
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => t.parse::<f64>().map_err(|_| bad())?,
    };
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(bad())
    }
}

/// Parses a duration such as `90s`, `5m`, `1h`, `1h30m`, `250ms` or a bare number of seconds
/// (the value of `setting`).
pub fn parse_duration(setting: &str, s: &str) -> Result<std::time::Duration> {
    let bad = || {
        Error::setting(
            setting,
            format!("{s:?} is not a duration like 90s, 5m, 1h or 1h30m"),
        )
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(secs));
    }
    let mut total_ms: u64 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
        let (num, tail) = rest.split_at(digits);
        let n: u64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail.chars().take_while(|c| c.is_ascii_alphabetic()).count();
        let (unit, next) = tail.split_at(unit_len);
        let factor = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        total_ms = n
            .checked_mul(factor)
            .and_then(|v| total_ms.checked_add(v))
            .ok_or_else(bad)?;
        rest = next;
    }
    Ok(std::time::Duration::from_millis(total_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_is_shared_in_equal_parts() {
        assert_eq!(share_memory_limit("512MB", 2), "256MB");
        assert_eq!(share_memory_limit("75%", 2), "37.5%");
        assert_eq!(share_memory_limit("1GiB", 2), "0.5GiB");
        assert_eq!(share_memory_limit("1GB", 1), "1GB");
    }

    #[test]
    fn table_names() {
        assert_eq!(
            TableName::parse("t", "change_log").unwrap().quoted(),
            "\"change_log\""
        );
        assert_eq!(
            TableName::parse("t", "cdc.log_1").unwrap().quoted(),
            "\"cdc\".\"log_1\""
        );
        for bad in ["", "a.b.c", "1abc", "a-b", "a\"b", "a;drop", "a b", ".x"] {
            let e = TableName::parse("change-log-table", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("change-log-table"), "{e}");
        }
    }

    #[test]
    fn schema_names_stay_plain_file_names() {
        for ok in [
            "customer",
            "order_v2",
            "a",
            "9lives",
            "_x",
            "a.b-c",
            "a..b",
            &"x".repeat(63),
        ] {
            assert_eq!(check_schema_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../evil/pwn",
            "/etc/passwd",
            "evil/pwn",
            "a\\b",
            ".hidden",
            "-x",
            "a b",
            "é",
            "cust\u{1b}[31mred",
            "nul\0",
            &"x".repeat(64),
        ] {
            let e = check_schema_name(bad).unwrap_err().to_string();
            assert!(e.contains("is not a valid schema name"), "{e}");
            assert!(
                !e.chars()
                    .any(|c| c.is_control() || (!c.is_ascii() && c != '…')),
                "{e:?}"
            );
        }
    }

    #[test]
    fn names_are_escaped_for_one_terminal_line() {
        assert_eq!(escape_name("plain"), "\"plain\"");
        assert_eq!(
            escape_name("a\u{1b}[2J\n\"q\"\\é\u{202e}"),
            r#""a\x1b[2J\x0a\"q\"\\\u{e9}\u{202e}""#
        );
        let long = escape_name(&"y".repeat(1000));
        assert!(
            long.ends_with("… (1000 bytes)") && long.len() < 120,
            "{long}"
        );
    }

    #[test]
    fn plain_http_s3_endpoints_off_loopback_are_warned_about() {
        for warned in [
            "http://s3.example.com",
            "http://s3.example.com:9000/",
            "HTTP://10.0.0.5:9000",
            "http://[2001:db8::1]:9000",
            "http://user@s3.example.com",
            "http://127.0.0.1.example.com",
            "http://localhost.example.com",
        ] {
            let w = s3_endpoint_warning(warned).unwrap_or_else(|| panic!("{warned}"));
            assert!(w.contains("plain http") && w.contains("https"), "{w}");
        }
        for quiet in [
            "https://s3.example.com",
            "https://s3.amazonaws.com:443",
            "http://127.0.0.1:9000",
            "http://127.8.9.10",
            "http://localhost:9000",
            "http://LOCALHOST./x",
            "http://[::1]:9000",
            "http://[::ffff:127.0.0.1]:9000",
        ] {
            assert_eq!(s3_endpoint_warning(quiet), None, "{quiet}");
        }
    }

    #[test]
    fn lake_locations() {
        assert_eq!(
            LakeLocation::parse("s3://my-bucket/a/b/").unwrap(),
            LakeLocation::S3 {
                bucket: "my-bucket".into(),
                root: "a/b".into()
            }
        );
        assert_eq!(
            LakeLocation::parse("s3://my-bucket").unwrap(),
            LakeLocation::S3 {
                bucket: "my-bucket".into(),
                root: String::new()
            }
        );
        assert_eq!(
            LakeLocation::parse("./lake").unwrap(),
            LakeLocation::Local("./lake".into())
        );
        assert_eq!(
            LakeLocation::parse("file:///srv/l").unwrap(),
            LakeLocation::Local("/srv/l".into())
        );
        for bad in [
            "s3://B",
            "s3://",
            "gs://x/y",
            "",
            "s3://-ab",
            "file://tmp/x",
            "file://",
        ] {
            assert!(LakeLocation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_and_ratios() {
        assert_eq!(parse_size("t", "256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("t", "1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("t", "42").unwrap(), 42);
        assert!(
            parse_size("target-base-size", "12XB")
                .unwrap_err()
                .to_string()
                .contains("target-base-size")
        );
        assert!((parse_ratio("r", "5%").unwrap() - 0.05).abs() < 1e-12);
        assert!((parse_ratio("r", "0.2").unwrap() - 0.2).abs() < 1e-12);
        assert!(parse_ratio("r", "-1").is_err());
        assert!(parse_ratio("r", "x%").is_err());
    }

    #[test]
    fn durations() {
        let d = |s: &str| parse_duration("max-age", s).map(|d| d.as_millis());
        assert_eq!(d("90s").unwrap(), 90_000);
        assert_eq!(d("5m").unwrap(), 300_000);
        assert_eq!(d("1h30m").unwrap(), 5_400_000);
        assert_eq!(d("250ms").unwrap(), 250);
        assert_eq!(d("42").unwrap(), 42_000);
        for bad in ["", "1y", "m", "1.5h", "-1s"] {
            assert!(d(bad).unwrap_err().to_string().contains("max-age"), "{bad}");
        }
    }

    #[test]
    fn memory_limits() {
        assert_eq!(parse_memory_limit("4GB").unwrap(), "4GB");
        assert_eq!(parse_memory_limit("512 MiB").unwrap(), "512MiB");
        let total = total_memory().unwrap();
        assert_eq!(
            parse_memory_limit("50%").unwrap(),
            format!("{}B", total / 2)
        );
        assert!(parse_memory_limit("0%").is_err() && parse_memory_limit("150%").is_err());
        for bad in ["", "GB", "4XB", "4GB'; drop", "1e9"] {
            assert!(parse_memory_limit(bad).is_err(), "{bad}");
        }
    }
}

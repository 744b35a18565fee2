//! Connection-string handling without the driver: libpq keyword DSNs (quoted values, backslash
//! escapes, docs/hazards.md #301) and URLs, with the TLS parameters tokio-postgres does not know
//! (`sslmode=verify-ca|verify-full`, `sslrootcert`) taken out and handled by lakecdc. Errors
//! name the offending key, never a value, so a password cannot leak through them (#290/#306).

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Keys lakecdc handles itself rather than passing to the driver.
const OWN_KEYS: [&str; 2] = ["sslmode", "sslrootcert"];

/// A parsed connection string: driver-ready text plus the parameters lakecdc owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conninfo {
    /// Text tokio-postgres can parse (URL or keyword form), without `OWN_KEYS`.
    pub driver: String,
    /// `sslmode`, when given.
    pub sslmode: Option<String>,
    /// `sslrootcert`, when given.
    pub sslrootcert: Option<String>,
}

/// True for the URL form (`postgres://` or `postgresql://`).
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// Splits a URL or keyword DSN. `default_port` (from `PGPORT`) fills a URL that names no port,
/// as libpq does (the driver would otherwise assume 5432).
pub fn parse(s: &str, default_port: Option<u16>) -> Result<Conninfo> {
    if is_url(s) {
        let mut info = parse_url(s)?;
        if let Some(port) = default_port {
            info.driver = with_default_port(&info.driver, port);
        }
        Ok(info)
    } else {
        parse_keywords(s)
    }
}

/// True when the URL or keyword DSN carries a password (false when it does not parse: the
/// connection reports that).
pub fn has_password(s: &str) -> bool {
    parse(s, None)
        .ok()
        .and_then(|info| info.driver.parse::<tokio_postgres::Config>().ok())
        .is_some_and(|c| c.get_password().is_some())
}

/// Adds `:port` to every host of a URL whose hosts all lack one.
fn with_default_port(url: &str, port: u16) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let (head, rest) = url.split_at(scheme_end);
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => authority.split_at(i + 1),
        None => ("", authority),
    };
    let has_port = |h: &str| match h.strip_prefix('[') {
        Some(v6) => v6.split_once(']').is_some_and(|(_, r)| r.starts_with(':')),
        None => h.contains(':'),
    };
    if hosts.is_empty() || hosts.split(',').any(has_port) || tail.contains("port=") {
        return url.to_string();
    }
    let hosts: Vec<String> = hosts.split(',').map(|h| format!("{h}:{port}")).collect();
    format!("{head}{userinfo}{}{tail}", hosts.join(","))
}

/// Quotes a value for a keyword DSN: `\` → `\\`, `'` → `\'`, wrapped in single quotes.
pub fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Builds a keyword DSN from pairs, quoting every value.
pub fn to_keywords(pairs: &BTreeMap<String, String>) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse_url(s: &str) -> Result<Conninfo> {
    let (base, query) = match s.split_once('?') {
        Some((b, q)) => (b, q),
        None => (s, ""),
    };
    let mut kept = Vec::new();
    let mut info = Conninfo {
        driver: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = param.split_once('=').unwrap_or((param, ""));
        match k {
            "sslmode" => info.sslmode = Some(percent_decode(v, k)?),
            "sslrootcert" => info.sslrootcert = Some(percent_decode(v, k)?),
            _ => kept.push(param),
        }
    }
    info.driver = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(info)
}

fn percent_decode(v: &str, key: &str) -> Result<String> {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    Error::config(format!("connection URL: bad percent-encoding in {key}"))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::config(format!("connection URL: {key} is not valid UTF-8")))
}

/// Tokenises a libpq keyword DSN into pairs (later duplicates win, as in libpq).
pub fn keyword_pairs(s: &str) -> Result<BTreeMap<String, String>> {
    let mut pairs = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(Error::config(format!(
                "connection string: expected '=' after {key:?} (use key=value pairs or a postgres:// URL)"
            )));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => {
                        return Err(Error::config(format!(
                            "connection string: the quoted value of {key:?} is not closed"
                        )));
                    }
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => {
                            return Err(Error::config(format!(
                                "connection string: the value of {key:?} ends with a lone backslash"
                            )));
                        }
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        value.push(n);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        if key.is_empty() {
            return Err(Error::config("connection string: empty key before '='"));
        }
        pairs.insert(key, value);
    }
    Ok(pairs)
}

fn parse_keywords(s: &str) -> Result<Conninfo> {
    let mut pairs = keyword_pairs(s)?;
    let sslmode = pairs.remove(OWN_KEYS[0]);
    let sslrootcert = pairs.remove(OWN_KEYS[1]);
    Ok(Conninfo {
        driver: to_keywords(&pairs),
        sslmode,
        sslrootcert,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_password_is_found_in_either_form() {
        for (dsn, has) in [
            ("postgres://u:secret@h/d", true),
            ("postgres://u@h/d", false),
            ("postgresql://h/d?user=u&password=secret", true),
            ("host=h user=u password='a b'", true),
            ("host=h user=u", false),
            ("password=", true),
            ("not a dsn '", false),
        ] {
            assert_eq!(super::has_password(dsn), has, "{dsn}");
        }
    }

    use super::*;

    #[test]
    fn keyword_values_with_spaces_quotes_and_backslashes() {
        let pairs =
            keyword_pairs(r"host=db.local  port = 5433 password='a b\'c\\d' user=al\ ice dbname=x")
                .unwrap();
        assert_eq!(pairs["password"], r"a b'c\d");
        assert_eq!(pairs["user"], "al ice");
        assert_eq!(pairs["port"], "5433");
        // Re-quoting and re-parsing is the identity.
        assert_eq!(keyword_pairs(&to_keywords(&pairs)).unwrap(), pairs);
    }

    #[test]
    fn own_keys_are_taken_out() {
        let c = parse(
            "host=h sslmode=verify-full sslrootcert=/ca.pem user=u",
            None,
        )
        .unwrap();
        assert_eq!(c.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(c.sslrootcert.as_deref(), Some("/ca.pem"));
        assert_eq!(c.driver, "host='h' user='u'");
        let c = parse(
            "postgres://u:p@h:1/db?sslmode=verify-ca&application_name=x&sslrootcert=%2Fca.pem",
            Some(9),
        )
        .unwrap();
        assert_eq!(c.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(c.sslrootcert.as_deref(), Some("/ca.pem"));
        assert_eq!(c.driver, "postgres://u:p@h:1/db?application_name=x");
    }

    #[test]
    fn pgport_fills_a_url_without_port() {
        let p = |s: &str| parse(s, Some(6543)).unwrap().driver;
        assert_eq!(p("postgres://u:p@h/db"), "postgres://u:p@h:6543/db");
        assert_eq!(p("postgres://h1,h2?x=1"), "postgres://h1:6543,h2:6543?x=1");
        assert_eq!(p("postgres://[::1]/db"), "postgres://[::1]:6543/db");
        assert_eq!(p("postgres://u@h:5/db"), "postgres://u@h:5/db");
        assert_eq!(p("postgres://u@[::1]:5/db"), "postgres://u@[::1]:5/db");
        assert_eq!(p("postgres:///db?host=/run"), "postgres:///db?host=/run");
    }

    #[test]
    fn errors_never_carry_values() {
        let secret = "s3cr3t pass";
        for bad in [
            format!("password='{secret}"),
            format!("password {secret}"),
            format!("password='{secret}\\"),
            format!("={secret}"),
            format!("postgres://u@h/db?sslmode=%zz{secret}"),
        ] {
            let e = parse(&bad, None).unwrap_err().to_string();
            assert!(!e.contains("s3cr3t"), "{e}");
        }
    }
}

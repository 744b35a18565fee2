//! Connection-string handling without the driver: libpq keyword DSNs (quoted values, backslash
//! escapes, docs/hazards.md #301) and URLs, both turned into one keyword DSN for the driver,
//! with the TLS parameters tokio-postgres does not know (`sslmode=verify-ca|verify-full`,
//! `sslrootcert`) taken out and handled by lakecdc.
//!
//! Errors never show a value, nor a word that is not a known parameter name: an unquoted
//! password with a space in it (`password=hunter2 secret`) makes its second half look like a
//! parameter name, so an unknown word is named by its position only (docs/hazards.md S5,
//! #290/#306). A URL is split here, not by the driver, so that a password is never taken for a
//! user, host or database name, which connection errors do show.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Error, Result};

/// Keys lakecdc handles itself rather than passing to the driver.
const OWN_KEYS: [&str; 2] = ["sslmode", "sslrootcert"];

/// Every parameter name a connection string may use: those tokio-postgres knows, and
/// [`OWN_KEYS`]. Only these are ever named in an error.
pub const KNOWN_KEYS: [&str; 20] = [
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslrootcert",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// A parsed connection string: driver-ready text plus the parameters lakecdc owns.
#[derive(Clone, PartialEq, Eq)]
pub struct Conninfo {
    /// A keyword DSN tokio-postgres parses (every value quoted), without `OWN_KEYS`.
    pub driver: String,
    /// `sslmode`, when given.
    pub sslmode: Option<String>,
    /// `sslrootcert`, when given.
    pub sslrootcert: Option<String>,
    /// The names of the parameters the string sets (including `OWN_KEYS`).
    pub keys: BTreeSet<String>,
}

impl std::fmt::Debug for Conninfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conninfo")
            .field("keys", &self.keys)
            .field("sslmode", &self.sslmode)
            .finish_non_exhaustive()
    }
}

/// Which form of connection string an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `key=value` pairs.
    Keywords,
    /// `postgres://…`.
    Url,
}

impl std::fmt::Display for Form {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Form::Keywords => "connection string",
            Form::Url => "connection URL",
        })
    }
}

/// A parameter as an error names it: its name when that is a known parameter name, else its
/// position (1-based), since an unknown word may be part of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// One of [`KNOWN_KEYS`].
    Known(&'static str),
    /// The n-th parameter of the string.
    Nth(usize),
}

impl Param {
    fn of(key: &str, n: usize) -> Self {
        known(key).map_or(Param::Nth(n), Param::Known)
    }
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Param::Known(k) => f.write_str(k),
            Param::Nth(n) => write!(f, "parameter {n}"),
        }
    }
}

/// A part of a connection URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlPart {
    /// The user name before `:` or `@`.
    User,
    /// The password between `:` and `@`.
    Password,
    /// The n-th host (1-based).
    Host(usize),
    /// The n-th host's port.
    Port(usize),
    /// The path: the database name.
    Dbname,
    /// The name of the n-th query parameter.
    ParamName(usize),
    /// The value of a query parameter.
    ParamValue(Param),
}

impl std::fmt::Display for UrlPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UrlPart::User => f.write_str("the user name"),
            UrlPart::Password => f.write_str("the password"),
            UrlPart::Host(n) => write!(f, "host {n}"),
            UrlPart::Port(n) => write!(f, "the port of host {n}"),
            UrlPart::Dbname => f.write_str("the database name"),
            UrlPart::ParamName(n) => write!(f, "the name of query parameter {n}"),
            UrlPart::ParamValue(p) => write!(f, "the value of {p}"),
        }
    }
}

/// Why a connection string is refused. No variant carries any text of the string: only known
/// parameter names, positions and fixed words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConninfoError {
    /// A URL of another scheme than `postgres` or `postgresql` (its scheme: letters, digits,
    /// `+`, `-` and `.` only, so no secret is shown).
    #[error(
        "connection string: a {0}:// URL is not a PostgreSQL one (use postgres://… or postgresql://…, or key=value pairs)"
    )]
    OtherScheme(String),
    /// A word is not followed by `=`.
    #[error(
        "connection string: parameter {0} has no '=' after its name (write key=value pairs, quoting a value that has spaces as key='a b', or use a postgres:// URL)"
    )]
    NoEquals(usize),
    /// `=` with no name before it.
    #[error("connection string: parameter {0} has no name before its '='")]
    EmptyKey(usize),
    /// A quoted value runs to the end of the string.
    #[error(
        "connection string: the quoted value of {0} is not closed (a ' inside a value is written \\')"
    )]
    UnclosedQuote(Param),
    /// A quoted value ends with an escaping backslash.
    #[error("connection string: the quoted value of {0} ends with a lone backslash (write \\\\)")]
    LoneBackslash(Param),
    /// A parameter name lakecdc does not know.
    #[error("{form}: {param} is not a parameter name lakecdc knows (known: {known})", known = KNOWN_KEYS.join(", "))]
    UnknownKey {
        /// The string's form.
        form: Form,
        /// Which parameter, by position.
        param: Param,
    },
    /// The driver refuses a known parameter's value.
    #[error("{form}: the value of {key} is not valid")]
    InvalidValue {
        /// The string's form.
        form: Form,
        /// The parameter.
        key: &'static str,
    },
    /// A `%` not followed by two hex digits.
    #[error("connection URL: {0} is not valid percent-encoding (write %XX with two hex digits)")]
    BadPercent(UrlPart),
    /// Percent-decoding gives bytes that are not UTF-8.
    #[error("connection URL: {0} is not UTF-8 once percent-decoded")]
    NotUtf8(UrlPart),
    /// An IPv6 host's `[` is not closed, or something other than `:port` follows its `]`.
    #[error("connection URL: host {0} is not a host name, an address or [an IPv6 address]")]
    BadHost(usize),
    /// A port that is not a number from 0 to 65535.
    #[error("connection URL: the port of host {0} is not a number from 0 to 65535")]
    BadPort(usize),
    /// An `@` after the host part: the user name or password holds an unencoded `/`, `?` or
    /// `@`, and part of it would be taken for the database name or a parameter.
    #[error(
        "connection URL: '@' after the host part; percent-encode '@', '/', '?' and ':' in the user name and password (%40, %2F, %3F, %3A)"
    )]
    AtAfterHost,
    /// A query parameter without `=`.
    #[error("connection URL: query parameter {0} has no '='")]
    ParamNoEquals(usize),
    /// The driver refuses the string, and no one parameter on its own.
    #[error("{0}: refused by the PostgreSQL driver")]
    Refused(Form),
}

impl From<ConninfoError> for Error {
    fn from(e: ConninfoError) -> Self {
        Error::config(e.to_string())
    }
}

/// The known parameter name equal to `key`, as a `'static` string.
fn known(key: &str) -> Option<&'static str> {
    KNOWN_KEYS.iter().copied().find(|k| *k == key)
}

/// True for the URL form (`postgres://` or `postgresql://`).
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// Splits a URL or keyword DSN into the driver's keyword DSN and lakecdc's own parameters,
/// checking every parameter name and every value the driver would refuse. `default_port`
/// (from `PGPORT`) fills the port of a URL host that names none when another host names one,
/// as libpq does; with no port at all, none is set (the caller applies `PGPORT`).
pub fn parse(s: &str, default_port: Option<u16>) -> Result<Conninfo> {
    Ok(split(s, default_port)?)
}

/// [`parse`], with the error typed.
pub fn split(s: &str, default_port: Option<u16>) -> std::result::Result<Conninfo, ConninfoError> {
    if let Some((scheme, _)) = s.split_once("://")
        && !is_url(s)
        && !scheme.is_empty()
        && scheme.len() <= 32
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(ConninfoError::OtherScheme(scheme.to_string()));
    }
    let (form, mut pairs) = match url_body(s) {
        Some(body) => (Form::Url, url_pairs(body, default_port)?),
        None => (Form::Keywords, checked_keyword_pairs(s)?),
    };
    let keys = pairs.keys().cloned().collect();
    let sslmode = pairs.remove(OWN_KEYS[0]);
    let sslrootcert = pairs.remove(OWN_KEYS[1]);
    let driver = to_keywords(&pairs);
    if driver.parse::<tokio_postgres::Config>().is_err() {
        // Name the first parameter the driver refuses on its own; its error text is not shown.
        let refused = pairs
            .iter()
            .find(|(k, v)| {
                format!("{k}={}", quote(v))
                    .parse::<tokio_postgres::Config>()
                    .is_err()
            })
            .and_then(|(k, _)| known(k));
        return Err(match refused {
            Some(key) => ConninfoError::InvalidValue { form, key },
            None => ConninfoError::Refused(form),
        });
    }
    Ok(Conninfo {
        driver,
        sslmode,
        sslrootcert,
        keys,
    })
}

/// True when the URL or keyword DSN carries a password (false when it does not parse: the
/// connection reports that).
pub fn has_password(s: &str) -> bool {
    split(s, None).is_ok_and(|info| info.keys.contains("password"))
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

/// The URL without its scheme, or `None` for a keyword DSN.
fn url_body(s: &str) -> Option<&str> {
    s.strip_prefix("postgres://")
        .or_else(|| s.strip_prefix("postgresql://"))
}

/// `postgresql://[user[:password]@][host[:port][,...]][/dbname][?param=value&...]` as pairs.
/// The user part ends at the last `@` before the first `/`; the host part then ends at the
/// first `/` or `?`.
fn url_pairs(
    body: &str,
    default_port: Option<u16>,
) -> std::result::Result<BTreeMap<String, String>, ConninfoError> {
    let mut pairs = BTreeMap::new();
    // The user part ends at the last `@` before the first `/`, as in libpq: a password may
    // hold a `?` (docs/hazards.md S5).
    let first_slash = body.find('/').unwrap_or(body.len());
    let (userinfo, rest) = match body.get(..first_slash).and_then(|a| a.rfind('@')) {
        Some(at) => (body.get(..at), body.get(at + 1..).unwrap_or_default()),
        None => (None, body),
    };
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (hosts, path) = before_query.split_once('/').unwrap_or((before_query, ""));
    if path.contains('@') {
        return Err(ConninfoError::AtAfterHost);
    }
    if let Some(userinfo) = userinfo {
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (userinfo, None),
        };
        let user = decode(user, UrlPart::User)?;
        if !user.is_empty() {
            pairs.insert("user".to_string(), user);
        }
        if let Some(p) = password {
            pairs.insert("password".to_string(), decode(p, UrlPart::Password)?);
        }
    }
    if !hosts.is_empty() {
        let mut names = Vec::new();
        let mut ports = Vec::new();
        for (i, chunk) in hosts.split(',').enumerate() {
            let n = i + 1;
            let (host, port) = match chunk.strip_prefix('[') {
                Some(v6) => {
                    let (host, rest) = v6.split_once(']').ok_or(ConninfoError::BadHost(n))?;
                    let port = match rest {
                        "" => None,
                        r => Some(r.strip_prefix(':').ok_or(ConninfoError::BadHost(n))?),
                    };
                    (host, port)
                }
                None => match chunk.split_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (chunk, None),
                },
            };
            names.push(decode(host, UrlPart::Host(n))?);
            let port = match port.map(|p| decode(p, UrlPart::Port(n))).transpose()? {
                Some(p) if !p.is_empty() => {
                    p.parse::<u16>().map_err(|_| ConninfoError::BadPort(n))?;
                    Some(p)
                }
                _ => None,
            };
            ports.push(port);
        }
        if names.iter().any(|h| !h.is_empty()) {
            pairs.insert("host".to_string(), names.join(","));
        }
        if ports.iter().any(Option::is_some) {
            let fill = default_port.map(|p| p.to_string()).unwrap_or_default();
            let ports: Vec<String> = ports
                .into_iter()
                .map(|p| p.unwrap_or_else(|| fill.clone()))
                .collect();
            pairs.insert("port".to_string(), ports.join(","));
        }
    }
    if !path.is_empty() {
        pairs.insert("dbname".to_string(), decode(path, UrlPart::Dbname)?);
    }
    for (i, param) in query.split('&').filter(|p| !p.is_empty()).enumerate() {
        let n = i + 1;
        let (k, v) = param
            .split_once('=')
            .ok_or(ConninfoError::ParamNoEquals(n))?;
        let key = known(&decode(k, UrlPart::ParamName(n))?).ok_or(ConninfoError::UnknownKey {
            form: Form::Url,
            param: Param::Nth(n),
        })?;
        let value = decode(v, UrlPart::ParamValue(Param::Known(key)))?;
        pairs.insert(key.to_string(), value);
    }
    Ok(pairs)
}

/// Percent-decodes one part of a URL.
fn decode(v: &str, part: UrlPart) -> std::result::Result<String, ConninfoError> {
    let out = crate::config::percent_decode(v).ok_or(ConninfoError::BadPercent(part))?;
    String::from_utf8(out).map_err(|_| ConninfoError::NotUtf8(part))
}

/// Tokenises a libpq keyword DSN into pairs (later duplicates win, as in libpq); every name
/// must be one of [`KNOWN_KEYS`].
pub fn keyword_pairs(s: &str) -> Result<BTreeMap<String, String>> {
    Ok(checked_keyword_pairs(s)?)
}

fn checked_keyword_pairs(s: &str) -> std::result::Result<BTreeMap<String, String>, ConninfoError> {
    let mut pairs = BTreeMap::new();
    let mut chars = s.chars().peekable();
    let mut n = 0;
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        n += 1;
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConninfoError::NoEquals(n));
        }
        if key.is_empty() {
            return Err(ConninfoError::EmptyKey(n));
        }
        let param = Param::of(&key, n);
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(ConninfoError::UnclosedQuote(param)),
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(ConninfoError::LoneBackslash(param)),
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
        let Param::Known(key) = param else {
            return Err(ConninfoError::UnknownKey {
                form: Form::Keywords,
                param,
            });
        };
        pairs.insert(key.to_string(), value);
    }
    Ok(pairs)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

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
            assert_eq!(has_password(dsn), has, "{dsn}");
        }
    }

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
        assert!(c.keys.contains("sslmode") && c.keys.contains("host"));
        let c = parse(
            "postgres://u:p@h:1/db?sslmode=verify-ca&application_name=x&sslrootcert=%2Fca.pem",
            Some(9),
        )
        .unwrap();
        assert_eq!(c.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(c.sslrootcert.as_deref(), Some("/ca.pem"));
        assert_eq!(
            c.driver,
            "application_name='x' dbname='db' host='h' password='p' port='1' user='u'"
        );
    }

    #[test]
    fn urls_become_keyword_pairs() {
        let d = |s: &str| parse(s, None).unwrap().driver;
        assert_eq!(
            d(
                "postgresql://al%20ice:p%40ss%2Fw%3Ard@[::1]:6000,db.local/my%20db?connect_timeout=3"
            ),
            "connect_timeout='3' dbname='my db' host='::1,db.local' password='p@ss/w:rd' port='6000,' user='al ice'"
        );
        // A raw '@' in the password: the user part ends at the last '@' of the host part.
        assert_eq!(
            d("postgres://u:p@ss@h/db"),
            "dbname='db' host='h' password='p@ss' user='u'"
        );
        // A '?' in the password: still the password, never a user, host or database name.
        assert_eq!(
            d("postgres://u:?user=Secret@h/db"),
            "dbname='db' host='h' password='?user=Secret' user='u'"
        );
        assert_eq!(
            d("postgres://u:5432?dbname=x@h/db"),
            "dbname='db' host='h' password='5432?dbname=x' user='u'"
        );
        assert_eq!(d("postgres://"), "");
        assert_eq!(
            d("postgres:///db?host=%2Frun%2Fpg"),
            "dbname='db' host='/run/pg'"
        );
        assert_eq!(d("postgres://u:@h"), "host='h' password='' user='u'");
        // A query parameter wins over the same setting in the URL's body, as in libpq.
        assert_eq!(d("postgres://h:1/d?port=2"), "dbname='d' host='h' port='2'");
    }

    #[test]
    fn pgport_fills_a_url_host_without_port_when_others_have_one() {
        let p = |s: &str| parse(s, Some(6543)).unwrap().driver;
        assert_eq!(
            p("postgres://u:p@h/db"),
            "dbname='db' host='h' password='p' user='u'"
        );
        assert_eq!(p("postgres://h1,h2:5?"), "host='h1,h2' port='6543,5'");
        assert_eq!(p("postgres://[::1]/db"), "dbname='db' host='::1'");
        assert_eq!(
            p("postgres://u@h:5/db"),
            "dbname='db' host='h' port='5' user='u'"
        );
        assert_eq!(
            parse("postgres://h1,h2:5", None).unwrap().driver,
            "host='h1,h2' port=',5'"
        );
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
            format!("mysql://u:{secret}@h/db"),
            format!("my{secret}://u@h/db"),
        ] {
            let e = parse(&bad, None).unwrap_err().to_string();
            assert!(!e.contains("s3cr3t"), "{e}");
        }
        // A URL of another scheme is named as such.
        let e = parse("mysql://u:p@h/db", None).unwrap_err().to_string();
        assert!(e.contains("a mysql:// URL is not a PostgreSQL one"), "{e}");
    }

    /// Every substring of `secret` at least 3 characters long.
    pub(crate) fn fragments(secret: &str) -> Vec<String> {
        let chars: Vec<char> = secret.chars().collect();
        let mut out = Vec::new();
        for start in 0..chars.len() {
            for end in start + 3..=chars.len() {
                out.push(chars[start..end].iter().collect());
            }
        }
        out
    }

    /// Fails if `text` shows any 3-character run of `secret`.
    pub(crate) fn assert_hides(text: &str, secret: &str, what: &str) {
        for f in fragments(secret) {
            assert!(
                !text.contains(&f),
                "{what}: shows {f:?} of the password: {text}"
            );
        }
    }

    /// A password made of characters no error message uses, so any run of three in an error
    /// can only come from it.
    pub(crate) const PW: &str = "Qz7Kx9Vw2Jy";

    #[test]
    fn no_parse_error_shows_a_fragment_of_the_password() {
        use ConninfoError as E;
        let cases: Vec<(String, ConninfoError)> = vec![
            // An unquoted password with a space: its tail is a parameter with no '='.
            (format!("host=h password={PW} {PW}"), E::NoEquals(3)),
            (
                format!("password={} {}", &PW[..5], &PW[5..]),
                E::NoEquals(2),
            ),
            (format!("password={PW} ={PW}"), E::EmptyKey(2)),
            (format!("={PW}"), E::EmptyKey(1)),
            (
                format!("password='{PW}"),
                E::UnclosedQuote(Param::Known("password")),
            ),
            (
                format!("password='{PW}\\"),
                E::LoneBackslash(Param::Known("password")),
            ),
            // A tail that looks like key=value is an unknown parameter, named by position.
            (
                format!("password={} {}={}", &PW[..4], &PW[4..8], &PW[8..]),
                E::UnknownKey {
                    form: Form::Keywords,
                    param: Param::Nth(2),
                },
            ),
            (
                format!("{PW}='x' password={PW}"),
                E::UnknownKey {
                    form: Form::Keywords,
                    param: Param::Nth(1),
                },
            ),
            (format!("{PW}='unclosed"), E::UnclosedQuote(Param::Nth(1))),
            (
                format!("password={PW} port={PW}"),
                E::InvalidValue {
                    form: Form::Keywords,
                    key: "port",
                },
            ),
            (
                format!("password={PW} keepalives_idle={PW}"),
                E::InvalidValue {
                    form: Form::Keywords,
                    key: "keepalives_idle",
                },
            ),
            (
                format!("password='{PW}' channel_binding={PW}"),
                E::InvalidValue {
                    form: Form::Keywords,
                    key: "channel_binding",
                },
            ),
            (format!("postgres://u:{PW}@h:{PW}/db"), E::BadPort(1)),
            (format!("postgres://u:{PW}@h:1,g:99999/db"), E::BadPort(2)),
            (format!("postgres://u:{PW}@[::1/db"), E::BadHost(1)),
            (format!("postgres://u:{PW}@[::1]{PW}/db"), E::BadHost(1)),
            (
                format!("postgres://u:{PW}%zz@h/db"),
                E::BadPercent(UrlPart::Password),
            ),
            (
                format!("postgres://u:{PW}%ff@h/db"),
                E::NotUtf8(UrlPart::Password),
            ),
            (
                format!("postgres://{PW}%zz:{PW}@h/db"),
                E::BadPercent(UrlPart::User),
            ),
            (
                format!("postgres://u:{PW}@h%zz{PW}/db"),
                E::BadPercent(UrlPart::Host(1)),
            ),
            (
                format!("postgres://u:{PW}@h:1%zz/db"),
                E::BadPercent(UrlPart::Port(1)),
            ),
            (
                format!("postgres://u:{PW}@h/{PW}%c3"),
                E::NotUtf8(UrlPart::Dbname),
            ),
            (
                format!("postgres://u@h/db?password={PW}%2"),
                E::BadPercent(UrlPart::ParamValue(Param::Known("password"))),
            ),
            (
                format!("postgres://u@h/db?{PW}%zz=1"),
                E::BadPercent(UrlPart::ParamName(1)),
            ),
            (
                format!("postgres://u@h/db?sslmode=%zz{PW}"),
                E::BadPercent(UrlPart::ParamValue(Param::Known("sslmode"))),
            ),
            // An unencoded '/' in the password puts its tail after the host part (a '?' does
            // not: the user part ends at the last '@' before the first '/').
            (format!("postgres://u:12/{PW}@h/db"), E::AtAfterHost),
            (
                format!("postgres://u:{PW}@h/db?password={PW}&{PW}"),
                E::ParamNoEquals(2),
            ),
            // An unencoded '&' in a password parameter makes its tail an unknown parameter.
            (
                format!(
                    "postgres://u@h/db?password={}&{}={}",
                    &PW[..4],
                    &PW[4..8],
                    &PW[8..]
                ),
                E::UnknownKey {
                    form: Form::Url,
                    param: Param::Nth(2),
                },
            ),
            (
                format!("postgres://u:{PW}@h:1/db?port={PW}"),
                E::InvalidValue {
                    form: Form::Url,
                    key: "port",
                },
            ),
            (
                format!("postgres://u:{PW}@h/db?target_session_attrs={PW}"),
                E::InvalidValue {
                    form: Form::Url,
                    key: "target_session_attrs",
                },
            ),
        ];
        for (s, want) in cases {
            let got = split(&s, None).unwrap_err();
            assert_eq!(got, want, "{s}");
            let err = parse(&s, None).unwrap_err();
            for text in [
                got.to_string(),
                format!("{got:?}"),
                err.chain(),
                format!("{err:?}"),
            ] {
                assert_hides(&text, PW, &s);
            }
        }
    }

    #[test]
    fn the_fragment_helper_sees_every_run_of_three() {
        let f = fragments("abcd");
        assert_eq!(f, ["abc", "abcd", "bcd"]);
        let caught = std::panic::catch_unwind(|| assert_hides("x bcd y", "abcd", "t"));
        assert!(caught.is_err());
    }

    #[test]
    fn debug_of_a_parsed_string_hides_the_password() {
        let c = parse(&format!("host=h password={PW}"), None).unwrap();
        assert_hides(&format!("{c:?}"), PW, "Debug");
    }
}

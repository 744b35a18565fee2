//! TLS (`sslmode` over rustls) and password authentication against the real cluster. Its server
//! certificate is signed by a throwaway CA for DNS:localhost only, so verify-full holds for
//! `localhost` and fails for `127.0.0.1`, while verify-ca passes for both. Every case is tried
//! as a keyword DSN, as a URL and through the `PG*` variables. Passwords never show in errors,
//! `Debug` output or the binary's stderr.

use lakecdc::source::conninfo::quote;
use lakecdc::source::{Connector, PgSettings};

use crate::support::harness::{
    self, PgFixtures, TestDb, pg_env_settings, pg_fixtures, pg_settings,
};

/// A wrong password with the same awkward characters as the right one.
const WRONG_PASSWORD: &str = r"Wr0ngHorse 'Battery\Staple";

/// The three ways to say where to connect.
#[derive(Debug, Clone, Copy)]
enum Form {
    Keyword,
    Url,
    Env,
}

const FORMS: [Form; 3] = [Form::Keyword, Form::Url, Form::Env];

/// One connection target, rendered in any [`Form`].
#[derive(Debug, Clone, Copy)]
struct Target<'a> {
    host: &'a str,
    port: u16,
    user: &'a str,
    password: Option<&'a str>,
    dbname: &'a str,
    sslmode: Option<&'a str>,
    sslrootcert: Option<&'a str>,
}

impl<'a> Target<'a> {
    /// The trusted superuser on the `postgres` database, no TLS settings.
    fn admin(f: &'a PgFixtures) -> Self {
        Target {
            host: &f.host,
            port: f.port,
            user: "postgres",
            password: None,
            dbname: "postgres",
            sslmode: None,
            sslrootcert: None,
        }
    }

    /// (libpq keyword, environment variable, value) of every setting given.
    fn params(&self) -> Vec<(&'static str, &'static str, String)> {
        let mut p = vec![
            ("host", "PGHOST", self.host.to_string()),
            ("port", "PGPORT", self.port.to_string()),
            ("user", "PGUSER", self.user.to_string()),
            ("dbname", "PGDATABASE", self.dbname.to_string()),
        ];
        if let Some(pw) = self.password {
            p.push(("password", "PGPASSWORD", pw.to_string()));
        }
        if let Some(m) = self.sslmode {
            p.push(("sslmode", "PGSSLMODE", m.to_string()));
        }
        if let Some(c) = self.sslrootcert {
            p.push(("sslrootcert", "PGSSLROOTCERT", c.to_string()));
        }
        p
    }

    /// `host='h' port='p' ...`, every value quoted.
    fn keyword_dsn(&self) -> String {
        self.params()
            .iter()
            .map(|(k, _, v)| format!("{k}={}", quote(v)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `postgres://user[:password]@host:port/dbname[?sslmode=..&sslrootcert=..]`.
    fn url(&self) -> String {
        let password = self
            .password
            .map(|pw| format!(":{}", percent_encode(pw)))
            .unwrap_or_default();
        let query: Vec<String> = [("sslmode", self.sslmode), ("sslrootcert", self.sslrootcert)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={}", percent_encode(v))))
            .collect();
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!(
            "postgres://{}{password}@{}:{}/{}{query}",
            percent_encode(self.user),
            self.host,
            self.port,
            percent_encode(self.dbname)
        )
    }

    fn settings(&self, form: Form) -> PgSettings {
        match form {
            Form::Keyword => pg_settings(&self.keyword_dsn()),
            Form::Url => pg_settings(&self.url()),
            Form::Env => {
                let params = self.params();
                let env: Vec<(&str, &str)> =
                    params.iter().map(|(_, k, v)| (*k, v.as_str())).collect();
                pg_env_settings(&env)
            }
        }
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Connects and returns the session's `current_user` and whether it runs over TLS.
pub(crate) async fn session(settings: &PgSettings) -> lakecdc::Result<(String, bool)> {
    let client = Connector::new(settings)?.connect().await?;
    let row = client
        .query_one(
            "SELECT current_user::text, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    Ok((row.get(0), row.get(1)))
}

/// Like [`session`], for a connection that must fail: returns the error's full chain.
async fn refused(settings: &PgSettings, what: &str) -> String {
    match session(settings).await {
        Ok(s) => panic!("{what}: connected as {s:?}, expected a refusal"),
        Err(e) => {
            assert!(
                matches!(e, lakecdc::Error::PostgresConnect { .. }),
                "{what}: not a connection error: {e:?}"
            );
            e.chain()
        }
    }
}

/// Fails if `text` shows `secret`, or any run of four or more letters and digits of it (which
/// catches escaped, quoted and percent-encoded renderings too).
fn assert_hidden(text: &str, secret: &str, what: &str) {
    assert!(!text.contains(secret), "{what} shows a password: {text}");
    for word in secret
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() >= 4)
    {
        assert!(
            !text.contains(word),
            "{what} shows {word:?} of a password: {text}"
        );
    }
}

#[tokio::test]
async fn sslmode_decides_whether_the_session_is_encrypted() {
    let f = pg_fixtures();
    for form in FORMS {
        // No sslmode means prefer, as in libpq; require and prefer do not verify the chain;
        // allow takes the plain connection a server accepts.
        for (mode, want) in [
            (Some("disable"), false),
            (Some("allow"), false),
            (Some("require"), true),
            (Some("prefer"), true),
            (None, true),
        ] {
            let t = Target {
                sslmode: mode,
                ..Target::admin(&f)
            };
            let (user, ssl) = session(&t.settings(form))
                .await
                .unwrap_or_else(|e| panic!("{form:?} sslmode={mode:?}: {}", e.chain()));
            assert_eq!(ssl, want, "{form:?} sslmode={mode:?}");
            assert_eq!(user, "postgres");
        }
    }
}

#[tokio::test]
async fn a_tls_only_role_is_refused_without_tls() {
    let f = pg_fixtures();
    for form in FORMS {
        let t = Target {
            user: &f.tls_user,
            ..Target::admin(&f)
        };
        let plain = Target {
            sslmode: Some("disable"),
            ..t
        };
        let e = refused(&plain.settings(form), &format!("{form:?} disable")).await;
        assert!(
            e.contains("pg_hba.conf rejects connection") && e.contains("no encryption"),
            "{form:?}: {e}"
        );
        // allow: the refused plain connection is tried again with TLS, as libpq does.
        for mode in ["require", "prefer", "allow"] {
            let tls = Target {
                sslmode: Some(mode),
                ..t
            };
            let got = session(&tls.settings(form))
                .await
                .unwrap_or_else(|e| panic!("{form:?} {mode}: {}", e.chain()));
            assert_eq!(got, (f.tls_user.clone(), true), "{form:?} {mode}");
        }
    }
}

#[tokio::test]
async fn verify_modes_check_the_chain_and_the_host_name() {
    let f = pg_fixtures();
    // (host, sslmode, CA, None if it connects, else what the error says)
    let name = Some("certificate not valid for name");
    let issuer = Some("invalid peer certificate: UnknownIssuer");
    let cases = [
        ("localhost", "verify-full", f.ca.as_str(), None),
        // The certificate names DNS:localhost only.
        ("127.0.0.1", "verify-full", f.ca.as_str(), name),
        ("127.0.0.1", "verify-ca", f.ca.as_str(), None),
        ("localhost", "verify-ca", f.ca.as_str(), None),
        ("localhost", "verify-full", f.other_ca.as_str(), issuer),
        ("127.0.0.1", "verify-full", f.other_ca.as_str(), issuer),
        ("localhost", "verify-ca", f.other_ca.as_str(), issuer),
        ("127.0.0.1", "verify-ca", f.other_ca.as_str(), issuer),
    ];
    for form in FORMS {
        for (host, mode, ca, refusal) in cases {
            let what = format!("{form:?} host={host} sslmode={mode} sslrootcert={ca}");
            let t = Target {
                host,
                sslmode: Some(mode),
                sslrootcert: Some(ca),
                ..Target::admin(&f)
            };
            match refusal {
                None => {
                    let got = session(&t.settings(form))
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {}", e.chain()));
                    assert_eq!(got, ("postgres".to_string(), true), "{what}");
                }
                Some(needle) => {
                    let e = refused(&t.settings(form), &what).await;
                    assert!(e.contains(needle), "{what}: {e}");
                }
            }
        }
    }
}

#[tokio::test]
async fn require_with_a_root_certificate_verifies_the_chain_as_libpq() {
    // libpq: "if a root CA file exists, sslmode=require behaves like verify-ca".
    let f = pg_fixtures();
    for form in FORMS {
        let t = Target {
            sslmode: Some("require"),
            sslrootcert: Some(&f.ca),
            ..Target::admin(&f)
        };
        let got = session(&t.settings(form))
            .await
            .unwrap_or_else(|e| panic!("{form:?}: {}", e.chain()));
        assert_eq!(got, ("postgres".to_string(), true), "{form:?}");
        let other = Target {
            sslrootcert: Some(&f.other_ca),
            ..t
        };
        let e = refused(&other.settings(form), &format!("{form:?} other CA")).await;
        assert!(e.contains("UnknownIssuer"), "{form:?}: {e}");
    }
}

#[tokio::test]
async fn the_right_password_authenticates_in_every_form() {
    let f = pg_fixtures();
    for form in FORMS {
        // Over plain TCP, and over TLS (SCRAM with channel binding).
        for (host, mode, ca) in [
            (f.host.as_str(), "disable", None),
            (f.host.as_str(), "require", None),
            ("localhost", "verify-full", Some(f.ca.as_str())),
        ] {
            let what = format!("{form:?} sslmode={mode}");
            let t = Target {
                host,
                user: &f.password_user,
                password: Some(&f.password),
                sslmode: Some(mode),
                sslrootcert: ca,
                ..Target::admin(&f)
            };
            let (user, ssl) = session(&t.settings(form))
                .await
                .unwrap_or_else(|e| panic!("{what}: {}", e.chain()));
            assert_eq!(user, f.password_user, "{what}");
            assert_eq!(ssl, mode != "disable", "{what}");
        }
    }
}

#[tokio::test]
async fn a_password_in_the_string_wins_over_pgpassword() {
    let f = pg_fixtures();
    for (conninfo, pgpassword, ok) in [
        (
            Target {
                user: &f.password_user,
                password: Some(&f.password),
                sslmode: Some("disable"),
                ..Target::admin(&f)
            },
            WRONG_PASSWORD,
            true,
        ),
        (
            Target {
                user: &f.password_user,
                password: Some(WRONG_PASSWORD),
                sslmode: Some("disable"),
                ..Target::admin(&f)
            },
            f.password.as_str(),
            false,
        ),
    ] {
        for s in [conninfo.keyword_dsn(), conninfo.url()] {
            let mut settings = pg_settings(&s);
            settings.env.insert("PGPASSWORD".into(), pgpassword.into());
            match session(&settings).await {
                Ok((user, _)) => {
                    assert!(ok, "connected with the wrong password in the string");
                    assert_eq!(user, f.password_user);
                }
                Err(e) => {
                    assert!(!ok, "{}", e.chain());
                    assert!(e.chain().contains("password authentication failed"));
                }
            }
        }
    }
}

#[tokio::test]
async fn a_wrong_password_is_refused_and_never_shown() {
    let f = pg_fixtures();
    for form in FORMS {
        for mode in ["disable", "require"] {
            let what = format!("{form:?} sslmode={mode}");
            let t = Target {
                user: &f.password_user,
                password: Some(WRONG_PASSWORD),
                sslmode: Some(mode),
                ..Target::admin(&f)
            };
            let settings = t.settings(form);
            let connector = Connector::new(&settings).unwrap();
            let err = connector.connect().await.unwrap_err();
            let chain = err.chain();
            assert!(
                chain.contains("password authentication failed"),
                "{what}: {chain}"
            );
            assert!(chain.contains(&f.password_user), "{what}: {chain}");
            for text in [
                chain,
                err.to_string(),
                format!("{err:?}"),
                format!("{connector:?}"),
                format!("{settings:?}"),
            ] {
                assert_hidden(&text, WRONG_PASSWORD, &what);
                assert_hidden(&text, &f.password, &what);
            }
        }
    }
}

/// Runs the binary with only the given `PG*` variables; returns (exit code, stdout, stderr).
fn run_bin(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = harness::bin();
    for var in lakecdc::source::connect::PG_ENV_VARS {
        cmd.env_remove(var);
    }
    cmd.env_remove("LAKECDC_PG_URL")
        .env_remove("DATABASE_URL")
        .env_remove("LAKECDC_LOG")
        .env_remove("RUST_LOG")
        .args(args)
        .envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_never_shows_a_wrong_password() {
    let f = pg_fixtures();
    let t = Target {
        user: &f.password_user,
        password: Some(WRONG_PASSWORD),
        ..Target::admin(&f)
    };
    let no_password = Target {
        password: None,
        ..t
    };
    // (--pg-url, environment): a password travels in the environment, never in a flag.
    let (dsn, url) = (t.keyword_dsn(), t.url());
    let cases = [
        (None, vec![("LAKECDC_PG_URL", dsn.as_str())]),
        (None, vec![("LAKECDC_PG_URL", url.as_str())]),
        (
            Some(no_password.keyword_dsn()),
            vec![("PGPASSWORD", WRONG_PASSWORD)],
        ),
    ];
    for (flag, env) in &cases {
        for extra in [&["-vv"][..], &["--log-format", "json", "-vv"]] {
            let mut args = vec!["init-db"];
            if let Some(flag) = flag {
                args.extend(["--pg-url", flag.as_str()]);
            }
            args.extend_from_slice(extra);
            let what = format!(
                "{} {extra:?} env={:?}",
                no_password.keyword_dsn(),
                env.len()
            );
            let (code, stdout, stderr) = run_bin(&args, env);
            assert_eq!(code, Some(1), "{what}: {stderr}");
            assert!(stderr.contains("lakecdc: error:"), "{what}: {stderr}");
            assert!(
                stderr.contains("password authentication failed"),
                "{what}: {stderr}"
            );
            for text in [&stdout, &stderr] {
                assert_hidden(text, WRONG_PASSWORD, &what);
                assert_hidden(text, &f.password, &what);
            }
        }
    }
}

#[tokio::test]
async fn the_binary_takes_pgpassword_from_the_environment() {
    let f = pg_fixtures();
    let db = TestDb::new().await;
    let dbname = db.url.rsplit_once('/').unwrap().1;
    let t = Target {
        user: &f.password_user,
        dbname,
        ..Target::admin(&f)
    };
    // A keyword DSN without password, then a URL over verified TLS with PGSSLMODE and
    // PGSSLROOTCERT from the environment (init-db is idempotent).
    let verified = Target {
        host: "localhost",
        ..t
    };
    let runs = [
        (t.keyword_dsn(), vec![("PGPASSWORD", f.password.as_str())]),
        (
            verified.url(),
            vec![
                ("PGPASSWORD", f.password.as_str()),
                ("PGSSLMODE", "verify-full"),
                ("PGSSLROOTCERT", f.ca.as_str()),
            ],
        ),
    ];
    for (url, env) in &runs {
        let (code, stdout, stderr) = run_bin(&["init-db", "--pg-url", url, "-vv"], env);
        assert_eq!(code, Some(0), "{url}: {stderr}");
        for text in [&stdout, &stderr] {
            assert_hidden(text, &f.password, url);
        }
    }
    // init-db ran as the password role: it owns what it created.
    let owners: Vec<(String, String)> = db
        .client()
        .await
        .query(
            "SELECT tablename::text, tableowner::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(owners.iter().any(|(t, _)| t == "change_log"), "{owners:?}");
    assert!(
        owners.iter().all(|(_, o)| *o == f.password_user),
        "{owners:?}"
    );
}

//! The password on its way to a server nobody verified (docs/hazards.md S7). Under
//! `sslmode=require` without `sslrootcert`, a server that asks for the password in clear text
//! or as MD5 — which is what a man in the middle with any certificate does — gets nothing: the
//! password goes only through SCRAM with channel binding. A password with an `sslmode` that does
//! not verify the server is warned about once, on one line, never showing it.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use lakecdc::source::conninfo::quote;
use lakecdc::source::{Connector, PgSettings};

use crate::support::harness::{self, TestDb, pg_fixtures, pg_settings};
use crate::tls::session;

/// A password whose every three-character run is its own (no message has one).
const SECRET: &str = "Hq3Zv8Wk5Rx";

/// Fails if `text` shows any run of three characters of `secret`.
fn assert_hides(text: &str, secret: &str, what: &str) {
    let chars: Vec<char> = secret.chars().collect();
    for start in 0..chars.len() {
        for end in start + 3..=chars.len() {
            let fragment: String = chars[start..end].iter().collect();
            assert!(
                !text.contains(&fragment),
                "{what}: shows {fragment:?} of a password: {text}"
            );
        }
    }
}

/// The password request a fake server sends.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Cleartext,
    Md5,
}

/// A self-signed certificate and its key for `localhost`, made by the `openssl` tool (which
/// `scripts/services.sh` needs too).
fn self_signed(dir: &std::path::Path) -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = (dir.join("fake.crt"), dir.join("fake.key"));
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl tool makes the fake server's certificate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let certs = CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap()
}

/// Reads one length-prefixed message body (the length counts itself).
fn read_body(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    let mut body = vec![0u8; len.saturating_sub(4)];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// Sends the password request `ask` says over `s` (right after the startup message) and
/// returns the body of the client's password message, or `None` when it sent none.
fn ask_for_the_password(s: &mut (impl Read + Write), ask: Ask) -> Option<Vec<u8>> {
    let request: &[u8] = match ask {
        Ask::Cleartext => b"R\0\0\0\x08\0\0\0\x03",
        Ask::Md5 => b"R\0\0\0\x0c\0\0\0\x05salt",
    };
    s.write_all(request).unwrap();
    s.flush().unwrap();
    let mut kind = [0u8; 1];
    match s.read_exact(&mut kind) {
        Ok(()) if kind[0] == b'p' => read_body(s).ok(),
        _ => None,
    }
}

/// How long a fake server waits for the client before it fails the test (never hangs it).
const ACCEPT_WITHIN: Duration = Duration::from_secs(20);

/// The next connection on a non-blocking listener, within [`ACCEPT_WITHIN`].
fn accept_within<S>(mut accept: impl FnMut() -> std::io::Result<S>) -> S {
    let deadline = std::time::Instant::now() + ACCEPT_WITHIN;
    loop {
        match accept() {
            Ok(s) => return s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the client never connected"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// A server that accepts one connection, agrees to TLS with any certificate, asks for the
/// password as `ask` says, and returns what the client answered: the body of its password
/// message, or `None` when it sent none.
fn fake_server(ask: Ask) -> (u16, std::thread::JoinHandle<Option<Vec<u8>>>) {
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(self_signed(dir.path()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let _dir = dir;
        let mut tcp = accept_within(|| listener.accept().map(|(s, _)| s));
        tcp.set_nonblocking(false).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // SSLRequest: length 8, code 80877103.
        let request = read_body(&mut tcp).unwrap();
        assert_eq!(request, 80877103u32.to_be_bytes());
        tcp.write_all(b"S").unwrap();
        let conn = rustls::ServerConnection::new(config).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        read_body(&mut tls).unwrap(); // the startup message
        ask_for_the_password(&mut tls, ask)
    });
    (port, server)
}

/// Settings for a fake server on `port` with the password set; `tls` gives `sslmode` and the
/// like.
fn settings_for(port: u16, tls: &str) -> PgSettings {
    with_secret(&format!("host=127.0.0.1 port={port} {tls}"))
}

/// Settings for `dsn` (its host, port and `sslmode`) as user `u` of database `d`, the
/// password set through `PGPASSWORD`.
fn with_secret(dsn: &str) -> PgSettings {
    let mut s = pg_settings(&format!("{dsn} user=u dbname=d connect_timeout=5"));
    s.env.insert("PGPASSWORD".into(), SECRET.into());
    s
}

/// Settings for a fake server on the Unix socket `dir/.s.PGSQL.5999`, the password set.
fn settings_for_unix(dir: &std::path::Path, tls: &str) -> PgSettings {
    with_secret(&format!(
        "host={} port=5999 {tls}",
        quote(&dir.display().to_string())
    ))
}

#[tokio::test]
async fn an_unverified_server_asking_for_the_password_in_clear_text_or_md5_gets_nothing() {
    for ask in [Ask::Cleartext, Ask::Md5] {
        let (port, server) = fake_server(ask);
        let connector = Connector::new(&settings_for(port, "sslmode=require")).unwrap();
        let err = connector.connect().await.unwrap_err();
        let answer = server.join().unwrap();
        assert_eq!(
            answer, None,
            "{ask:?}: the client answered the password request"
        );
        assert_refused(
            &err,
            &connector,
            &[
                "server did not use channel binding",
                "sslmode=verify-full",
                "channel_binding=prefer",
            ],
            &format!("{ask:?}"),
        );
    }
}

#[tokio::test]
async fn channel_binding_prefer_is_the_operators_way_to_accept_such_a_server() {
    // What the guard prevents: with channel binding merely preferred, the driver answers.
    let (port, server) = fake_server(Ask::Cleartext);
    let connector = Connector::new(&settings_for(
        port,
        "sslmode=require channel_binding=prefer",
    ))
    .unwrap();
    let _ = connector.connect().await;
    let answer = server.join().unwrap().expect("a password message");
    assert_eq!(answer, [SECRET.as_bytes(), b"\0"].concat());
}

#[tokio::test]
async fn a_scram_server_takes_the_password_over_require_with_channel_binding() {
    let f = pg_fixtures();
    for extra in ["", "channel_binding=require"] {
        let dsn = format!(
            "host={} port={} user={} password={} dbname=postgres sslmode=require {extra}",
            f.host,
            f.port,
            f.password_user,
            quote(&f.password)
        );
        let (user, ssl) = session(&pg_settings(&dsn))
            .await
            .unwrap_or_else(|e| panic!("{extra}: {}", e.chain()));
        assert_eq!(user, f.password_user);
        assert!(ssl);
    }
}

/// What a fake plain server saw: the client's password answer, if any, and the SSL requests.
type PlainSeen = (Option<Vec<u8>>, usize);

/// A plain server: it answers every SSL request with "no" (the client may then give up on that
/// connection and open another), and on the first connection that starts a session asks for
/// the password as `ask` says. Returns what the client answered (the body of its password
/// message, or `None`) and how many SSL requests it saw.
fn fake_plain_server(ask: Ask) -> (u16, std::thread::JoinHandle<PlainSeen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        plain_session(ask, || {
            let tcp = accept_within(|| listener.accept().map(|(s, _)| s));
            tcp.set_nonblocking(false).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            tcp
        })
    });
    (port, server)
}

/// [`fake_plain_server`] on a Unix socket, `dir/.s.PGSQL.{port}`.
fn fake_unix_server(
    dir: &std::path::Path,
    port: u16,
    ask: Ask,
) -> std::thread::JoinHandle<PlainSeen> {
    let listener =
        std::os::unix::net::UnixListener::bind(dir.join(format!(".s.PGSQL.{port}"))).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        plain_session(ask, || {
            let unix = accept_within(|| listener.accept().map(|(s, _)| s));
            unix.set_nonblocking(false).unwrap();
            unix.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            unix
        })
    })
}

/// The plain servers' part: connections from `accept` until one starts a session.
fn plain_session<S: Read + Write>(ask: Ask, mut accept: impl FnMut() -> S) -> PlainSeen {
    let mut ssl_requests = 0;
    loop {
        let mut s = accept();
        let mut first = read_body(&mut s).unwrap();
        if first == 80877103u32.to_be_bytes() {
            ssl_requests += 1;
            s.write_all(b"N").unwrap();
            match read_body(&mut s) {
                Ok(startup) => first = startup,
                Err(_) => continue, // the client gave up on this connection
            }
        }
        // A startup message: protocol 3.0.
        assert_eq!(first[..4], 196608u32.to_be_bytes());
        return (ask_for_the_password(&mut s, ask), ssl_requests);
    }
}

/// A local port that refuses connections for as long as the returned socket lives: bound,
/// never listening, so no other test can take it.
fn dead_port() -> (u16, socket2::Socket) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    (port, socket)
}

/// Asserts that `err` is the guard's refusal of a clear-text request and shows no secret.
fn assert_guard_refused(err: &lakecdc::Error, connector: &Connector, what: &str) {
    let words = [
        "asked for the password in clear text",
        "scram-sha-256",
        "sslmode=verify-full",
    ];
    assert_refused(err, connector, &words, what);
}

/// Asserts that `err`'s chain names every one of `words` and that neither it nor the
/// connector shows the password.
fn assert_refused(err: &lakecdc::Error, connector: &Connector, words: &[&str], what: &str) {
    let chain = err.chain();
    assert!(words.iter().all(|w| chain.contains(w)), "{what}: {chain}");
    for text in [chain, format!("{err:?}"), format!("{connector:?}")] {
        assert_hides(&text, SECRET, what);
    }
}

#[tokio::test]
async fn a_plain_server_asking_for_the_password_in_clear_text_gets_nothing() {
    // disable: no SSL request; allow: plain first; prefer: TLS asked for, refused, then plain.
    for (sslmode, ssl_requests) in [("disable", 0), ("allow", 0), ("prefer", 1)] {
        let (port, server) = fake_plain_server(Ask::Cleartext);
        let connector = Connector::new(&settings_for(port, &format!("sslmode={sslmode}"))).unwrap();
        let err = connector.connect().await.unwrap_err();
        let (answer, seen) = server.join().unwrap();
        assert_eq!(answer, None, "{sslmode}: the client answered in clear text");
        assert_eq!(seen, ssl_requests, "{sslmode}: SSL requests");
        assert_guard_refused(&err, &connector, sslmode);
    }
}

#[tokio::test]
async fn several_hosts_are_walked_by_lakecdc_and_each_plain_one_is_guarded() {
    // The first host refuses the connection; the second asks for the password in clear text.
    // The driver would walk such a list over sockets of its own, unguarded.
    for (sslmode, ssl_requests) in [("disable", 0), ("allow", 0), ("prefer", 1)] {
        let (port, server) = fake_plain_server(Ask::Cleartext);
        let (dead, _held) = dead_port();
        let connector = Connector::new(&with_secret(&format!(
            "host=127.0.0.1,127.0.0.1 port={dead},{port} sslmode={sslmode}"
        )))
        .unwrap();
        let err = connector.connect().await.unwrap_err();
        let (answer, seen) = server.join().unwrap();
        assert_eq!(answer, None, "{sslmode}: the client answered in clear text");
        assert_eq!(seen, ssl_requests, "{sslmode}: SSL requests");
        assert_guard_refused(&err, &connector, sslmode);
        // Every host's failure is reported, each named by its host and port, in order.
        let chain = err.chain();
        let first = chain.find(&format!(
            "127.0.0.1 port {dead}: could not open a connection"
        ));
        let last = chain.find(&format!("127.0.0.1 port {port}:"));
        assert!(
            chain.contains("2 hosts tried") && first.is_some() && first < last,
            "{sslmode}: {chain}"
        );
        // allow retries with TLS a server that refused, never a host that could not be reached.
        assert!(
            !chain.contains(&format!("failed (127.0.0.1 port {dead}")),
            "{sslmode}: {chain}"
        );
    }
}

#[tokio::test]
async fn a_server_that_never_answers_fails_the_connection_within_the_connect_timeout() {
    // The kernel accepts into the listener's backlog; nothing ever answers the startup (or the
    // SSL request). The driver bounded only the socket's opening, so this waited for ever.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for sslmode in ["disable", "require"] {
        let settings = pg_settings(&format!(
            "host=127.0.0.1 port={port} user=u dbname=d connect_timeout=1 sslmode={sslmode}"
        ));
        let started = std::time::Instant::now();
        let connected = tokio::time::timeout(
            Duration::from_secs(20),
            Connector::new(&settings).unwrap().connect(),
        )
        .await
        .unwrap_or_else(|_| panic!("{sslmode}: still connecting after 20 s"));
        let chain = connected.unwrap_err().chain();
        assert!(
            chain.contains(&format!(
                "127.0.0.1 port {port}: no session within the connect timeout (1s)"
            )),
            "{sslmode}: {chain}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{sslmode}");
    }
    drop(silent);
}

#[tokio::test]
async fn prefer_over_a_unix_socket_asks_for_no_tls() {
    // As libpq: PostgreSQL never has TLS on a Unix socket, so no SSL request is sent there;
    // the plain connection is guarded all the same.
    for (ask, answered) in [(Ask::Md5, true), (Ask::Cleartext, false)] {
        let dir = tempfile::tempdir().unwrap();
        let server = fake_unix_server(dir.path(), 5999, ask);
        let connector = Connector::new(&settings_for_unix(dir.path(), "")).unwrap();
        let result = connector.connect().await;
        let (answer, seen) = server.join().unwrap();
        assert_eq!(seen, 0, "{ask:?}: SSL requests over a Unix socket");
        if answered {
            assert!(answer.unwrap().starts_with(b"md5"), "{ask:?}");
        } else {
            assert_eq!(answer, None, "{ask:?}: the client answered in clear text");
            assert_guard_refused(&result.unwrap_err(), &connector, "unix");
        }
    }
    // Modes that need TLS fail over a Unix socket with the fix, before anything is sent.
    let dir = tempfile::tempdir().unwrap();
    let server = fake_unix_server(dir.path(), 5999, Ask::Cleartext);
    let chain = Connector::new(&settings_for_unix(dir.path(), "sslmode=require"))
        .unwrap()
        .connect()
        .await
        .unwrap_err()
        .chain();
    assert!(
        chain.contains("PostgreSQL has no TLS over a Unix socket")
            && chain.contains("sslmode=prefer or disable"),
        "{chain}"
    );
    // The server saw no connection: connecting now gets its session.
    let _ = Connector::new(&settings_for_unix(dir.path(), "sslmode=disable"))
        .unwrap()
        .connect()
        .await;
    assert_eq!(server.join().unwrap(), (None, 0), "require sent nothing");
}

#[tokio::test]
async fn the_hosts_of_a_list_are_tried_in_turn_tapped_and_checked_for_target_session_attrs() {
    let f = pg_fixtures();
    let (dead, _held) = dead_port();
    let dsn = |sslmode: &str, extra: &str| {
        format!(
            "host=127.0.0.1,{} port={dead},{} user={} password={} dbname=postgres connect_timeout=5 sslmode={sslmode} {extra}",
            f.host,
            f.port,
            f.password_user,
            quote(&f.password)
        )
    };
    // The dead first host is skipped; the session is the second host's, tapped.
    for (sslmode, ssl) in [("disable", false), ("prefer", true), ("require", true)] {
        let settings = pg_settings(&dsn(sslmode, ""));
        let got = session(&settings)
            .await
            .unwrap_or_else(|e| panic!("{sslmode}: {}", e.chain()));
        assert_eq!(got, (f.password_user.clone(), ssl), "{sslmode}");
        let conn = Connector::new(&settings)
            .unwrap()
            .connect_tapped()
            .await
            .unwrap();
        assert!(
            conn.tap.is_live(),
            "{sslmode}: a host list's connection is tapped"
        );
    }
    // hostaddr alone: TLS sends and checks the address, except verify-full, which needs a
    // host name (libpq's rule) and fails before connecting.
    let by_addr = |sslmode: &str| {
        format!(
            "hostaddr=127.0.0.1 port={} user={} password={} dbname=postgres connect_timeout=5 sslmode={sslmode} sslrootcert={}",
            f.port,
            f.password_user,
            quote(&f.password),
            quote(&f.ca)
        )
    };
    let got = session(&pg_settings(&by_addr("verify-ca")))
        .await
        .unwrap_or_else(|e| panic!("hostaddr, verify-ca: {}", e.chain()));
    assert_eq!(got, (f.password_user.clone(), true), "hostaddr, verify-ca");
    let chain = session(&pg_settings(&by_addr("verify-full")))
        .await
        .unwrap_err()
        .chain();
    assert!(
        chain.contains("TLS needs a host name; give host= along with hostaddr="),
        "{chain}"
    );
    // target_session_attrs, checked on the session as the driver and libpq do.
    let read_only = "options='-c default_transaction_read_only=on'";
    for (extra, wanted, found) in [
        (
            format!("target_session_attrs=read-write {read_only}"),
            "read-write",
            Some("read-only"),
        ),
        (
            "target_session_attrs=read-only".to_string(),
            "read-only",
            Some("read-write"),
        ),
        (
            format!("target_session_attrs=read-only {read_only}"),
            "read-only",
            None,
        ),
        (
            "target_session_attrs=read-write".to_string(),
            "read-write",
            None,
        ),
    ] {
        let result = session(&pg_settings(&dsn("require", &extra))).await;
        match found {
            None => assert!(
                result.is_ok(),
                "{extra}: {:?}",
                result.err().map(|e| e.chain())
            ),
            Some(found) => {
                let chain = result.unwrap_err().chain();
                assert!(
                    chain.contains(&format!(
                        "the server is {found}, and target_session_attrs asks for {wanted}"
                    )),
                    "{extra}: {chain}"
                );
            }
        }
    }
}

#[tokio::test]
async fn prefer_goes_on_in_plain_when_the_server_has_no_tls_and_md5_is_answered() {
    // The guard refuses clear text only: an MD5 request over the fallback is answered with
    // the salted hash, never the password.
    let (port, server) = fake_plain_server(Ask::Md5);
    let connector = Connector::new(&settings_for(port, "sslmode=prefer")).unwrap();
    let _ = connector.connect().await;
    let (answer, seen) = server.join().unwrap();
    let answer = answer.expect("an MD5 answer over the plain fallback");
    assert_eq!(seen, 1, "one SSL request, refused");
    assert!(answer.starts_with(b"md5"), "{answer:?}");
    assert_hides(&String::from_utf8_lossy(&answer), SECRET, "md5 answer");
}

#[tokio::test]
async fn plain_and_prefer_connections_to_the_real_server_still_authenticate() {
    // SCRAM over plain TCP (disable) and over TLS (prefer to a server that has it).
    let f = pg_fixtures();
    for (sslmode, ssl) in [("disable", false), ("prefer", true), ("allow", false)] {
        let dsn = format!(
            "host={} port={} user={} password={} dbname=postgres sslmode={sslmode}",
            f.host,
            f.port,
            f.password_user,
            quote(&f.password)
        );
        let got = session(&pg_settings(&dsn))
            .await
            .unwrap_or_else(|e| panic!("{sslmode}: {}", e.chain()));
        assert_eq!(got, (f.password_user.clone(), ssl), "{sslmode}");
    }
}

/// Runs `init-db` with only `env` for PostgreSQL; returns (exit code, stderr).
fn init_db(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = harness::bin();
    for var in lakecdc::source::connect::PG_ENV_VARS {
        cmd.env_remove(var);
    }
    let out = cmd
        .env_remove("LAKECDC_PG_URL")
        .env_remove("DATABASE_URL")
        .env_remove("LAKECDC_LOG")
        .env_remove("RUST_LOG")
        .arg("init-db")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_binary_warns_once_about_a_password_to_an_unverified_server() {
    let f = pg_fixtures();
    let db = TestDb::new().await;
    let dbname = db.url.rsplit_once('/').unwrap().1.to_string();
    let dsn = |host: &str, user: &str, extra: &str| {
        format!(
            "host={host} port={} user={user} dbname={dbname} {extra}",
            f.port
        )
    };
    let pw = f.password.as_str();
    // (what, environment, the warning names this, or None for no warning)
    let cases = [
        (
            "password, sslmode=require",
            vec![
                (
                    "LAKECDC_PG_URL",
                    dsn(&f.host, &f.password_user, "sslmode=require"),
                ),
                ("PGPASSWORD", pw.to_string()),
            ],
            Some("sslmode=require"),
        ),
        (
            "password, no sslmode (prefer)",
            vec![
                ("LAKECDC_PG_URL", dsn(&f.host, &f.password_user, "")),
                ("PGPASSWORD", pw.to_string()),
            ],
            Some("sslmode=prefer"),
        ),
        (
            "password, verify-full",
            vec![
                (
                    "LAKECDC_PG_URL",
                    dsn(
                        "localhost",
                        &f.password_user,
                        &format!("sslmode=verify-full sslrootcert={}", quote(&f.ca)),
                    ),
                ),
                ("PGPASSWORD", pw.to_string()),
            ],
            None,
        ),
        (
            "no password, prefer",
            vec![("LAKECDC_PG_URL", dsn(&f.host, "postgres", "sslmode=prefer"))],
            None,
        ),
    ];
    for (what, env, want) in &cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (code, stderr) = init_db(&env);
        assert_eq!(code, Some(0), "{what}: {stderr}");
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("a password is configured"))
            .collect();
        match want {
            Some(needle) => {
                assert_eq!(warnings.len(), 1, "{what}: {stderr}");
                assert!(warnings[0].contains("WARN"), "{what}: {stderr}");
                assert!(warnings[0].contains(needle), "{what}: {stderr}");
            }
            None => assert!(warnings.is_empty(), "{what}: {stderr}"),
        }
        assert!(!stderr.contains(pw), "{what}: {stderr}");
        for word in pw.split(|c: char| !c.is_ascii_alphanumeric()) {
            if word.len() >= 3 {
                assert!(!stderr.contains(word), "{what} shows {word:?}: {stderr}");
            }
        }
    }
}

/// The configuration warnings reach stderr once, when the job starts: a plain-http S3 endpoint
/// off loopback, and a config file holding a password that others may read (docs/security.md).
#[tokio::test]
async fn the_binary_warns_about_a_plain_http_endpoint_and_an_exposed_config_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lakecdc.toml");
    // A dead port: the job fails after its warnings, without touching a network.
    std::fs::write(
        &config,
        "pg-url = \"postgres://app:Hunter2Secret@127.0.0.1:9/x?connect_timeout=2\"\n",
    )
    .unwrap();
    let run = |endpoint: &str, mode: u32| {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = harness::bin()
            .args([
                "inspect",
                "--lake",
                "s3://lakecdc-warn-test",
                "--s3-path-style",
            ])
            .args(["--s3-endpoint", endpoint, "--config"])
            .arg(&config)
            .env("AWS_ACCESS_KEY_ID", "k")
            .env("AWS_SECRET_ACCESS_KEY", "s")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("Hunter2"), "{stderr}");
        let count = |needle: &str| stderr.lines().filter(|l| l.contains(needle)).count();
        (
            count("is plain http"),
            count("other users may read it"),
            stderr.clone(),
        )
    };
    let (http, exposed, stderr) = run("http://s3.example.invalid:9000", 0o644);
    assert_eq!((http, exposed), (1, 1), "{stderr}");
    assert!(stderr.contains("s3.example.invalid"), "{stderr}");
    assert!(
        stderr.contains("mode 644") && stderr.contains("chmod 600"),
        "{stderr}"
    );
    let (http, exposed, stderr) = run("http://127.0.0.1:9", 0o600);
    assert_eq!((http, exposed), (0, 0), "{stderr}");
    let (http, exposed, stderr) = run("https://s3.example.invalid", 0o640);
    assert_eq!((http, exposed), (0, 1), "{stderr}");
}

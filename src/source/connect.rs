//! Connecting to PostgreSQL: from a URL, a keyword DSN, or the libpq `PG*` variables (which
//! fill whatever the string leaves out, as in libpq), with `sslmode` disable / allow / prefer /
//! require / verify-ca / verify-full over rustls. The [`Connector`] never exposes the password:
//! its `Debug` and [`Connector::describe`] omit it, and driver errors are wrapped with the
//! operation only.
//!
//! The password and an unverified server (docs/hazards.md S7): the `sslmode`s keep libpq's
//! meanings, so disable / allow / prefer / require reach a server whose certificate nobody
//! checked, and the driver answers a clear-text or MD5 password request from whoever that is.
//! With a password and no verification, lakecdc warns once, on its first connection; under
//! `require` (TLS certain) it also requires SCRAM channel binding unless `channel_binding` (or
//! `PGCHANNELBINDING`) says otherwise, so the password is never sent in clear text nor as MD5,
//! and a man in the middle cannot relay the SCRAM exchange. Over plain TCP (disable, and
//! allow / prefer when the server has no TLS) channel binding cannot be had, so lakecdc opens
//! every socket itself, walking the string's hosts as the driver would (`super::socket`), and
//! a plain connection's startup is watched: a request for the password in clear text fails the
//! connection before the driver sees it (`super::password_guard`). `prefer` therefore asks a
//! TCP host for TLS first and, when the server has none, connects again on a guarded socket
//! (libpq goes on in plain on the same one); over a Unix socket it asks for no TLS, as libpq.
//! MD5 and SCRAM requests are answered: neither sends the password itself, though an impostor
//! may try to guess it offline from the answer, which the warning says.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::{ChannelBinding, Host};
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::copy_tap::{CopyTap, lock};
use super::socket;
use super::tls_connector::{BufferedTls, TapSlot};

use super::conninfo;
use crate::error::{ConnectAttempt, Error, Result};

/// What the operator gave us to reach PostgreSQL. The library never reads the environment:
/// the binary passes the `PG*` variables in `env`.
#[derive(Clone, Default)]
pub struct PgSettings {
    /// A URL or keyword DSN (`--pg-url`, `LAKECDC_PG_URL`, `DATABASE_URL`).
    pub conninfo: Option<String>,
    /// `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`,
    /// `PGCHANNELBINDING`, `PGAPPNAME`, `PGCONNECT_TIMEOUT` as set in the environment.
    pub env: BTreeMap<String, String>,
    /// Reported as `application_name` unless the string sets one.
    pub application_name: String,
    /// Limit for establishing a connection.
    pub connect_timeout: Duration,
    /// Limit for one statement.
    pub statement_timeout: Duration,
}

impl std::fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSettings")
            .field("conninfo", &self.conninfo.as_ref().map(|_| "<redacted>"))
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The `PG*` variables [`PgSettings::env`] may carry.
pub const PG_ENV_VARS: [&str; 10] = [
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGCHANNELBINDING",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
];

/// The TLS policy of `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// No TLS.
    Disable,
    /// No TLS, unless the server refuses the plain connection: then TLS, certificate not
    /// verified (libpq's `allow`).
    Allow,
    /// TLS if the server offers it, certificate not verified.
    Prefer,
    /// TLS required, certificate not verified (`require` without `sslrootcert`; with one it is
    /// [`TlsPolicy::VerifyCa`], as in libpq).
    Require,
    /// TLS required, chain verified against the CA, host name not checked.
    VerifyCa,
    /// TLS required, chain and host name verified.
    VerifyFull,
}

impl TlsPolicy {
    /// The policy of an `sslmode` value; an error does not show the value (it came from the
    /// connection string).
    fn parse(mode: &str) -> Result<Self> {
        Ok(match mode {
            "disable" => TlsPolicy::Disable,
            "allow" => TlsPolicy::Allow,
            "prefer" => TlsPolicy::Prefer,
            "require" => TlsPolicy::Require,
            "verify-ca" => TlsPolicy::VerifyCa,
            "verify-full" => TlsPolicy::VerifyFull,
            _ => {
                return Err(Error::config(
                    "sslmode (or PGSSLMODE) is not one of disable, allow, prefer, require, verify-ca, verify-full",
                ));
            }
        })
    }

    /// Whether the server's certificate is verified, so that it is the server the operator
    /// named.
    fn verifies_server(self) -> bool {
        matches!(self, TlsPolicy::VerifyCa | TlsPolicy::VerifyFull)
    }
}

/// The value of `PGCHANNELBINDING`.
fn parse_channel_binding(value: &str) -> Result<ChannelBinding> {
    match value {
        "disable" => Ok(ChannelBinding::Disable),
        "prefer" => Ok(ChannelBinding::Prefer),
        "require" => Ok(ChannelBinding::Require),
        _ => Err(Error::config(
            "PGCHANNELBINDING is not one of disable, prefer, require",
        )),
    }
}

/// The warning a connection with a password deserves under `tls` when channel binding is
/// `binding`: `None` when the server's certificate is verified. One line; it never shows the
/// password.
fn transport_warning(tls: TlsPolicy, binding: ChannelBinding) -> Option<&'static str> {
    if tls.verifies_server() {
        return None;
    }
    if binding == ChannelBinding::Require {
        return Some(match tls {
            TlsPolicy::Require => {
                "a password is configured and sslmode=require does not verify the server's certificate: lakecdc sends it only through SCRAM with channel binding (servers that ask for it otherwise are refused); set sslrootcert and sslmode=verify-full to verify the server"
            }
            _ => {
                "a password is configured and the sslmode does not verify the server's certificate: with channel_binding=require it goes only through SCRAM with channel binding over TLS; set sslrootcert and sslmode=verify-full to verify the server"
            }
        });
    }
    Some(match tls {
        TlsPolicy::Disable => {
            "a password is configured and sslmode=disable: it is used over plain TCP with whatever answers at the server's address; lakecdc never sends it there in clear text, but answers MD5 and SCRAM requests, from which an impostor can try to guess it; set sslrootcert and sslmode=verify-full"
        }
        TlsPolicy::Allow => {
            "a password is configured and sslmode=allow neither requires TLS nor verifies the server: lakecdc never sends it in clear text, but whatever answers at its address gets MD5 and SCRAM answers it can try to guess it from; set sslrootcert and sslmode=verify-full"
        }
        TlsPolicy::Prefer => {
            "a password is configured and sslmode=prefer (the default) neither requires TLS nor verifies the server: lakecdc never sends it in clear text over plain TCP, but whatever answers at its address gets MD5 and SCRAM answers it can try to guess it from; set sslrootcert and sslmode=verify-full"
        }
        _ => {
            "a password is configured and sslmode=require does not verify the server's certificate, and channel binding is not required: whatever answers at its address can ask for the password in clear text; set sslrootcert and sslmode=verify-full"
        }
    })
}

/// The hint added to a connection error when the server did not use the channel binding
/// lakecdc required.
const BINDING_HINT: &str = "sslmode=require does not verify the server, so lakecdc sends the password only through SCRAM with channel binding, which this server did not offer; set sslrootcert and sslmode=verify-full, or channel_binding=prefer to accept the risk";

/// Whether `e` is the driver refusing to authenticate without channel binding.
fn is_binding_refusal(e: &tokio_postgres::Error) -> bool {
    e.to_string() == "authentication error"
        && std::error::Error::source(e).is_some_and(|s| s.to_string().contains("channel binding"))
}

/// Silence after which TCP keepalive probes start, unless the connection string sets
/// `keepalives_idle`.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);

/// Every session's settings. Standard strings: lakecdc quotes names from the catalog (a table
/// source's key columns) in string literals, which a role or database set to
/// `standard_conforming_strings = off` would read with backslash escapes (docs/hazards.md S16).
/// And the server (PostgreSQL 14 and later) checks every second, while a query runs, that
/// lakecdc is still connected: a killed or stopped run's queries (a read waiting on a lock, a
/// long COPY) then end within a second instead of running on for nobody. And no row-level
/// security policy filters what lakecdc reads: a role it applies to would export part of a
/// table, and publish the rows it cannot see as deleted; with `row_security` off the read
/// fails instead, naming the table (docs/hazards.md L85).
const SESSION_SQL: &str = "SET standard_conforming_strings = on; \
     SET row_security = off; \
     SELECT set_config('client_connection_check_interval', '1s', false) \
     WHERE current_setting('server_version_num')::int >= 140000";

/// A connection and the handle of its COPY tap (which taps nothing on an untapped connection).
#[derive(Debug)]
pub struct TappedClient {
    /// The connection.
    pub client: Client,
    /// Its tap.
    pub tap: CopyTap,
}

/// A validated way to open connections; opening none until asked.
#[derive(Clone)]
pub struct Connector {
    config: Config,
    tls: TlsPolicy,
    rustls: Option<BufferedTls>,
    statement_timeout: Duration,
    /// Whether [`Connector::connect_tapped`] taps its TLS connections.
    copy_tap: bool,
    /// Messages the taps of the connections opened by this connector and its clones diverted.
    diverted: Arc<AtomicU64>,
    /// Whether lakecdc (not the operator) required channel binding, for the error's hint.
    binding_required: bool,
    /// What to warn about the password's transport, once per connector and its clones.
    warning: Option<&'static str>,
    /// Set once the warning is given.
    warned: Arc<Once>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.describe())
            .field("tls", &self.tls)
            .field("copy_tap", &self.copy_tap)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Validates the settings and prepares TLS. Makes no connection.
    pub fn new(settings: &PgSettings) -> Result<Self> {
        let env = |k: &str| settings.env.get(k).filter(|v| !v.is_empty()).cloned();
        let env_port = match env("PGPORT") {
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| Error::config("PGPORT is not a port number"))?,
            ),
            None => None,
        };
        let info = match settings
            .conninfo
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            Some(s) => conninfo::parse(s, env_port)?,
            None => conninfo::Conninfo {
                driver: String::new(),
                sslmode: None,
                sslrootcert: None,
                keys: Default::default(),
            },
        };
        let mut config: Config = if info.driver.is_empty() {
            Config::new()
        } else {
            // `conninfo::parse` checked it: no error text of the driver is shown.
            info.driver
                .parse()
                .map_err(|_| Error::config("connection string: refused by the PostgreSQL driver"))?
        };
        // Long-idle connections (the schema lock's, held through an init that can take hours)
        // must outlive NAT and load-balancer idle timeouts (AWS NLB: 350 s): probe after a
        // minute of silence unless the connection string chose (the driver's default is 2 h).
        if !info.keys.contains("keepalives_idle") {
            config.keepalives_idle(KEEPALIVE_IDLE);
        }
        // As libpq: a string that gives `hostaddr` alone connects to the addresses, with
        // PGHOST (if set) as the names; `localhost` only when neither names a server.
        if config.get_hosts().is_empty() {
            let host = env("PGHOST").or_else(|| {
                config
                    .get_hostaddrs()
                    .is_empty()
                    .then(|| "localhost".to_string())
            });
            for h in host.iter().flat_map(|h| h.split(',')) {
                config.host(h);
            }
        }
        if config.get_ports().is_empty()
            && let Some(port) = env_port
        {
            config.port(port);
        }
        if config.get_user().is_none() {
            config.user(env("PGUSER").unwrap_or_else(|| "postgres".to_string()));
        }
        if config.get_password().is_none()
            && let Some(pw) = env("PGPASSWORD")
        {
            config.password(pw);
        }
        if config.get_dbname().is_none()
            && let Some(db) = env("PGDATABASE")
        {
            config.dbname(db);
        }
        if config.get_application_name().is_none() {
            config.application_name(
                env("PGAPPNAME").unwrap_or_else(|| settings.application_name.clone()),
            );
        }
        if config.get_connect_timeout().is_none() {
            let secs = env("PGCONNECT_TIMEOUT").and_then(|s| s.parse::<u64>().ok());
            config.connect_timeout(secs.map_or(settings.connect_timeout, Duration::from_secs));
        }
        let mode = info
            .sslmode
            .or_else(|| env("PGSSLMODE"))
            .unwrap_or_else(|| "prefer".to_string());
        let mut tls = TlsPolicy::parse(&mode)?;
        let rootcert = info.sslrootcert.or_else(|| env("PGSSLROOTCERT"));
        // As libpq: when a root certificate is given, `require` verifies the chain against it.
        if tls == TlsPolicy::Require && rootcert.is_some() {
            tls = TlsPolicy::VerifyCa;
        }
        // The transport of each attempt is chosen per target (`Connector::attempt`), which
        // sets the driver's `sslmode` for it.
        let rustls = match tls {
            TlsPolicy::Disable => None,
            other => Some(BufferedTls::new(MakeRustlsConnect::new(client_config(
                other,
                rootcert.map(PathBuf::from),
            )?))),
        };
        // docs/hazards.md S7: the operator's channel_binding wins; else, with a password over
        // TLS that does not verify the server, the password goes only through SCRAM with
        // channel binding.
        let has_password = config.get_password().is_some();
        let mut binding_required = false;
        if !info.keys.contains("channel_binding") {
            match env("PGCHANNELBINDING") {
                Some(v) => {
                    config.channel_binding(parse_channel_binding(&v)?);
                }
                None if has_password && tls == TlsPolicy::Require => {
                    config.channel_binding(ChannelBinding::Require);
                    binding_required = true;
                }
                None => {}
            }
        }
        let warning = has_password
            .then(|| transport_warning(tls, config.get_channel_binding()))
            .flatten();
        Ok(Self {
            config,
            tls,
            rustls,
            statement_timeout: settings.statement_timeout,
            copy_tap: true,
            diverted: Arc::default(),
            binding_required,
            warning,
            warned: Arc::new(Once::new()),
        })
    }

    /// Gives the transport warning, if there is one and it was not given yet by this
    /// connector or a clone. Called on the first connection, once logging is set up.
    fn warn_once(&self) {
        if let Some(warning) = self.warning {
            self.warned.call_once(|| tracing::warn!("{warning}"));
        }
    }

    /// The same connector with the COPY tap on (the default) or off. Off, every connection
    /// [`Connector::connect_tapped`] opens is read through tokio-postgres alone, exactly as a
    /// plain connection is: slower, but independent of the driver behaviour the tap relies on
    /// (see [`super::copy_tap`]), and so the way around a tap that fails after an upgrade.
    pub fn with_copy_tap(mut self, on: bool) -> Self {
        self.copy_tap = on;
        self
    }

    /// Whether [`Connector::connect_tapped`] taps the TLS connections it opens.
    pub fn copy_tap(&self) -> bool {
        self.copy_tap
    }

    /// Messages diverted so far by the COPY taps of the connections this connector and its
    /// clones opened: 0 while the tap is off or every connection was plain.
    pub fn copy_tap_diverted(&self) -> u64 {
        self.diverted.load(Ordering::Relaxed)
    }

    /// `user@host:port[,host:port…]/dbname` (each host with its own port, as libpq pairs
    /// them: one port serves every host), never the password.
    pub fn describe(&self) -> String {
        let mut hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(s) => s.clone(),
                Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        if hosts.is_empty() {
            hosts = self
                .config
                .get_hostaddrs()
                .iter()
                .map(|a| a.to_string())
                .collect();
        }
        let ports = self.config.get_ports();
        let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let targets: Vec<String> = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| format!("{h}:{}", port(i)))
            .collect();
        let targets = if targets.is_empty() {
            format!(":{}", port(0))
        } else {
            targets.join(",")
        };
        format!(
            "{}@{targets}/{}",
            self.config.get_user().unwrap_or(""),
            self.config.get_dbname().unwrap_or("")
        )
    }

    /// The TLS policy in force.
    pub fn tls_policy(&self) -> TlsPolicy {
        self.tls
    }

    /// The per-statement time limit.
    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    /// The password the connection will use, for tests of the parsing rules.
    #[cfg(test)]
    fn password_for_tests(&self) -> Option<&[u8]> {
        self.config.get_password()
    }

    /// Opens one connection; its driver task runs until the client is dropped.
    pub async fn connect(&self) -> Result<Client> {
        self.connect_session(None).await
    }

    /// Opens one connection whose binary COPY data and prepared queries' rows can bypass
    /// tokio-postgres's per-row messages (see [`super::copy_tap`]), over TLS or plain; the
    /// handle taps nothing when the tap is off ([`Connector::with_copy_tap`]).
    pub async fn connect_tapped(&self) -> Result<TappedClient> {
        if !self.copy_tap {
            let client = self.connect_session(None).await?;
            tracing::debug!(
                target = %self.describe(),
                "COPY tap off: COPY data is read through tokio-postgres, untapped"
            );
            return Ok(TappedClient {
                client,
                tap: CopyTap::default(),
            });
        }
        let slot = TapSlot::default();
        let client = self.connect_session(Some(&slot)).await?;
        // Every attempt that gets a stream leaves its tap here, so the last one is the
        // session's: an attempt that failed after (another host, a refused plain connection,
        // `target_session_attrs`) was followed by one that replaced it.
        let tap = lock(&slot).take().unwrap_or_default();
        tap.count_into(self.diverted.clone());
        Ok(TappedClient { client, tap })
    }

    async fn connect_session(&self, slot: Option<&TapSlot>) -> Result<Client> {
        let client = self.open_session(slot).await?;
        timed(
            self.statement_timeout,
            "set up the session",
            client.batch_execute(SESSION_SQL),
        )
        .await?;
        Ok(client)
    }

    async fn open_session(&self, slot: Option<&TapSlot>) -> Result<Client> {
        self.warn_once();
        let op = format!("connect to {}", self.describe());
        let rustls = self.rustls.as_ref().map(|r| match slot {
            Some(slot) => r.tapping(slot.clone()),
            None => r.clone(),
        });
        let targets = socket::targets(&self.config).map_err(|e| Error::PostgresConnect {
            op: op.clone(),
            source: e,
        })?;
        // As the driver and libpq: every target in turn, each within the connect timeout
        // (libpq's reading: the socket and the startup exchange together).
        let mut failed = Vec::new();
        for target in &targets {
            let attempt = async {
                let client = self.attempt(target, rustls.as_ref(), slot).await?;
                socket::session_attrs_hold(&self.config, target, &client).await?;
                Ok(client)
            };
            let attempt = match self.config.get_connect_timeout() {
                None => attempt.await,
                Some(limit) => tokio::time::timeout(*limit, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(ConnectAttempt::Timeout {
                            target: target.to_string(),
                            seconds: limit.as_secs().max(1),
                        })
                    }),
            };
            match attempt {
                Ok(client) => return Ok(client),
                Err(e) => {
                    tracing::debug!(error = %crate::error::causes(&e), "no session from this host");
                    failed.push(e);
                }
            }
        }
        let refused_binding = self.binding_required
            && failed
                .iter()
                .any(|e| e.driver().is_some_and(is_binding_refusal));
        Err(Error::PostgresConnect {
            op: match refused_binding {
                true => format!("{op} ({BINDING_HINT})"),
                false => op,
            },
            source: ConnectAttempt::every(failed),
        })
    }

    /// One target, over the transports the `sslmode` allows, in libpq's order. Every plain
    /// connection's startup is guarded (docs/hazards.md S7).
    async fn attempt(
        &self,
        target: &socket::Target,
        tls: Option<&BufferedTls>,
        slot: Option<&TapSlot>,
    ) -> std::result::Result<Client, ConnectAttempt> {
        // Whatever an earlier attempt left there belongs to a stream that is gone.
        if let Some(slot) = slot {
            *lock(slot) = None;
        }
        // verify-full checks the certificate against the host name, which only `host` gives.
        let name = self.tls == TlsPolicy::VerifyFull;
        match (self.tls, tls) {
            (TlsPolicy::Disable, _) | (_, None) => socket::plain(&self.config, target, slot).await,
            // As libpq: a plain connection the server refuses is tried again with TLS (not
            // one that could not be opened, and never over a Unix socket).
            (TlsPolicy::Allow, Some(tls)) => {
                match socket::plain(&self.config, target, slot).await {
                    Err(plain @ ConnectAttempt::Startup { .. }) if !target.is_unix() => {
                        let why = crate::error::causes(&plain);
                        tracing::debug!(error = %why, "plain connection refused; trying TLS (sslmode=allow)");
                        socket::tls(&self.config, target, tls, name)
                            .await
                            .map_err(|e| ConnectAttempt::AllowBoth {
                                plain: why,
                                tls: Box::new(e),
                            })
                    }
                    other => other,
                }
            }
            // As libpq: no SSL request on a Unix socket, where PostgreSQL never has TLS.
            (TlsPolicy::Prefer, Some(_)) if target.is_unix() => {
                socket::plain(&self.config, target, slot).await
            }
            // TLS when the server has it; else plain again on a new, guarded socket (libpq
            // goes on in plain over the refused one, which the driver cannot be handed).
            (TlsPolicy::Prefer, Some(tls)) => {
                match socket::tls(&self.config, target, tls, name).await {
                    Err(e) if e.driver().is_some_and(has_no_tls) => {
                        tracing::debug!(
                            "the server has no TLS; connecting in plain (sslmode=prefer)"
                        );
                        socket::plain(&self.config, target, slot).await
                    }
                    other => other,
                }
            }
            (_, Some(tls)) => socket::tls(&self.config, target, tls, name).await,
        }
    }
}

/// Whether the driver gave up because the server answered the SSL request with "no" (its
/// cause's exact words, tokio-postgres being pinned; `tests/it/transport.rs` covers it).
fn has_no_tls(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|c| c.to_string() == "server does not support TLS")
}

/// Runs a PostgreSQL future under the statement time limit.
pub async fn timed<T>(
    limit: Duration,
    op: &str,
    fut: impl std::future::Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> Result<T> {
    within(limit, op, async { fut.await.map_err(Error::postgres(op)) }).await
}

/// Runs a multi-step PostgreSQL exchange (a statement and the decoding of its rows) under the
/// statement time limit.
pub async fn within<T>(
    limit: Duration,
    op: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Error::PostgresTimeout {
            op: op.to_string(),
            seconds: limit.as_secs(),
        })?
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn client_config(policy: TlsPolicy, rootcert: Option<PathBuf>) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::config(format!("TLS setup failed: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match policy {
        TlsPolicy::Disable | TlsPolicy::Allow | TlsPolicy::Prefer | TlsPolicy::Require => {
            Arc::new(NoVerification(provider))
        }
        TlsPolicy::VerifyCa | TlsPolicy::VerifyFull => {
            let roots = Arc::new(root_store(rootcert)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| Error::config(format!("TLS setup failed: {e}")))?;
            if policy == TlsPolicy::VerifyCa {
                Arc::new(IgnoreHostName(webpki))
            } else {
                webpki
            }
        }
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// The CA roots: `sslrootcert` when given (`system` means the platform store), else the
/// platform store.
fn root_store(rootcert: Option<PathBuf>) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    match rootcert.filter(|p| p.as_os_str() != "system") {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(&path)
                .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| {
                    Error::config(format!(
                        "sslrootcert {}: cannot read PEM certificates ({e})",
                        path.display()
                    ))
                })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(Error::config(format!(
                    "sslrootcert {}: no usable CA certificate",
                    path.display()
                )));
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                return Err(Error::config(
                    "sslmode verify-ca/verify-full needs CA certificates: set sslrootcert",
                ));
            }
        }
    }
    Ok(roots)
}

/// `require`/`prefer`: encrypt, but (as libpq) do not verify the certificate.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must verify; the host name is not checked.
#[derive(Debug)]
struct IgnoreHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for IgnoreHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::conninfo::tests::{PW, assert_hides};
    use super::*;

    fn settings(conninfo: Option<&str>, env: &[(&str, &str)]) -> PgSettings {
        PgSettings {
            conninfo: conninfo.map(str::to_string),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            application_name: "lakecdc".into(),
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn dsn_with_spaces_and_quotes_reaches_the_driver_intact() {
        let c = Connector::new(&settings(
            Some(r"host=127.0.0.1 user='we ird' password='p a\'ss\\w' dbname=db sslmode=disable"),
            &[],
        ))
        .unwrap();
        assert_eq!(c.password_for_tests(), Some(&br"p a'ss\w"[..]));
        assert_eq!(c.describe(), "we ird@127.0.0.1:5432/db");
        assert_eq!(c.tls_policy(), TlsPolicy::Disable);
        assert!(!format!("{c:?}").contains("ss"));
    }

    #[test]
    fn the_copy_tap_is_on_unless_switched_off() {
        let c = Connector::new(&settings(Some("host=h"), &[])).unwrap();
        assert!(c.copy_tap());
        let off = c.clone().with_copy_tap(false);
        assert!(!off.copy_tap());
        assert!(format!("{off:?}").contains("copy_tap: false"), "{off:?}");
        assert_eq!(off.copy_tap_diverted(), 0);
    }

    #[test]
    fn idle_connections_send_keepalives_after_a_minute_unless_told() {
        let c = Connector::new(&settings(Some("host=h"), &[])).unwrap();
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(60));
        assert!(c.config.get_keepalives());
        let c = Connector::new(&settings(Some("host=h keepalives_idle=7"), &[])).unwrap();
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(7));
    }

    #[test]
    fn hostaddr_alone_names_no_made_up_host() {
        // As libpq: the addresses are the targets, PGHOST the names when set; never an
        // invented `localhost`, which verify-full would check the certificate against.
        let hosts = |s: &str, env: &[(&str, &str)]| {
            let c = Connector::new(&settings(Some(s), env)).unwrap();
            let hosts: Vec<_> = c.config.get_hosts().to_vec();
            (hosts, c.config.get_hostaddrs().len())
        };
        assert_eq!(hosts("hostaddr=10.0.0.1,10.0.0.2", &[]), (vec![], 2));
        let c = Connector::new(&settings(Some("hostaddr=10.0.0.1,10.0.0.2 user=u"), &[])).unwrap();
        assert_eq!(c.describe(), "u@10.0.0.1:5432,10.0.0.2:5432/");
        // Each host with its own port, not the first port after all of them.
        let c = Connector::new(&settings(
            Some("postgres://u@127.0.0.1:1,127.0.0.1:28813/db"),
            &[],
        ))
        .unwrap();
        assert_eq!(c.describe(), "u@127.0.0.1:1,127.0.0.1:28813/db");
        assert_eq!(
            hosts("hostaddr=10.0.0.1", &[("PGHOST", "db.example")]),
            (vec![Host::Tcp("db.example".into())], 1)
        );
        assert_eq!(
            hosts("user=u", &[]),
            (vec![Host::Tcp("localhost".into())], 0)
        );
    }

    #[test]
    fn env_fills_what_the_string_leaves_out() {
        let env = [
            ("PGHOST", "10.0.0.9"),
            ("PGPORT", "6543"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpw"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "require"),
        ];
        let c = Connector::new(&settings(None, &env)).unwrap();
        assert_eq!(c.describe(), "envuser@10.0.0.9:6543/envdb");
        assert_eq!(c.password_for_tests(), Some(&b"envpw"[..]));
        assert_eq!(c.tls_policy(), TlsPolicy::Require);
        let c = Connector::new(&settings(Some("postgres://u@h/db?sslmode=disable"), &env)).unwrap();
        assert_eq!(c.describe(), "u@h:6543/db");
        assert_eq!(
            c.password_for_tests(),
            Some(&b"envpw"[..]),
            "PGPASSWORD is the fallback"
        );
        assert_eq!(c.tls_policy(), TlsPolicy::Disable);
    }

    #[test]
    fn bad_settings_name_the_setting_not_the_secret() {
        for (s, env) in [
            ("host=h password='hunter2 x' sslmode=bogus", vec![]),
            ("host=h password='hunter2 x' nosuchoption=1", vec![]),
            ("host=h password='hunter2 x", vec![]),
            ("postgres://u:hunter2@h:notaport/db", vec![]),
            ("host=h", vec![("PGPORT", "hunter2")]),
        ] {
            let e = Connector::new(&settings(Some(s), &env))
                .unwrap_err()
                .to_string();
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn no_setting_error_shows_a_fragment_of_the_password() {
        // Values that are, or hold, the password: a misplaced one ends up in another setting.
        let cases: Vec<(String, Env)> = vec![
            (format!("host=h password={PW} sslmode={PW}"), vec![]),
            (format!("postgres://u:{PW}@h/db?sslmode={PW}"), vec![]),
            (format!("host=h password={PW}"), vec![("PGSSLMODE", PW)]),
            (format!("host=h password={PW}"), vec![("PGPORT", PW)]),
            (
                format!("host=h password={PW}"),
                vec![("PGCHANNELBINDING", PW)],
            ),
            (format!("host=h password={PW} port={PW}"), vec![]),
            (format!("host=h password={PW} hostaddr={PW}"), vec![]),
            (format!("host=h password={} {}", &PW[..5], &PW[5..]), vec![]),
            (format!("postgres://u:{PW}@h:{PW}/db"), vec![]),
            (format!("postgres://u:{PW}@h/db?{PW}=1"), vec![]),
            (format!("postgres://u:{PW}@h/db?password={PW}&{PW}"), vec![]),
        ];
        for (s, env) in &cases {
            let e = Connector::new(&settings(Some(s), env)).unwrap_err();
            for text in [e.chain(), format!("{e:?}")] {
                assert_hides(&text, PW, s);
            }
        }
    }

    #[test]
    fn a_password_is_never_taken_for_a_name_connection_errors_show() {
        // The driver's own URL parser splits at the first '@' anywhere, taking
        // `h/db?password=Qz7K` for the user name, which `describe` (and so every connection
        // error) shows.
        for (url, password) in [
            (
                format!("postgres://h/db?password={}@{}", &PW[..4], &PW[4..]),
                format!("{}@{}", &PW[..4], &PW[4..]),
            ),
            (
                format!("postgres://u:{}@{}@h/db", &PW[..4], &PW[4..]),
                format!("{}@{}", &PW[..4], &PW[4..]),
            ),
        ] {
            let c = Connector::new(&settings(Some(&url), &[])).unwrap();
            assert_eq!(c.password_for_tests(), Some(password.as_bytes()), "{url}");
            assert_hides(&c.describe(), PW, &url);
            assert_hides(&format!("{c:?}"), PW, &url);
        }
    }

    /// `PG*` variables of a case.
    type Env = Vec<(&'static str, &'static str)>;

    /// A CA certificate for the verify modes (nothing is verified against it here).
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBlTCCATugAwIBAgIURVsDUtf2MJanPYH0oMAI3tcT4SwwCgYIKoZIzj0EAwIw
HzEdMBsGA1UEAwwUbGFrZWNkYyB1bml0LXRlc3QgQ0EwIBcNMjYxMjAxMTc1ODI1
WhgPMjEyNjExMDcxNzU4MjVaMB8xHTAbBgNVBAMMFGxha2VjZGMgdW5pdC10ZXN0
IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEAWlCvuC3tXAwK+R6CK088N3/
/ghZ6Za9BN6lfaeSKRRVitCMUxgn/VLFWbgK8SLbfBHQqy/sQpuqgMDNaIiHuqNT
MFEwHQYDVR0OBBYEFBbFy7/bgnzySM/3fvWiDticPWA6MB8GA1UdIwQYMBaAFBbF
y7/bgnzySM/3fvWiDticPWA6MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwID
SAAwRQIgS2JRIH0kr8Iusu/IFkWxsZ25mtW6fWccIwtOkvaASDYCIQDFDhA8BWH0
ogCU1J2tGDyd/G8kR4C4AzM/et9xN/UgHA==
-----END CERTIFICATE-----
";

    /// What a subscriber writes, for tests of the warnings.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// The lines logged while `c` and two clones of it open their first connections (which
    /// fail: nothing listens on port 1).
    fn logged_by_first_connections(c: &Connector) -> Vec<String> {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tracing::subscriber::with_default(subscriber, || {
            for c in [c.clone(), c.clone(), c.clone()] {
                assert!(rt.block_on(c.connect()).is_err());
            }
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_password_to_an_unverified_server_is_warned_about_once() {
        let ca = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca.path(), TEST_CA).unwrap();
        let ca = ca.path().display().to_string();
        let base = "host=127.0.0.1 port=1 connect_timeout=1 user=u";
        // (connection string, environment, the warning names this, or None for no warning)
        let cases: Vec<(String, Env, Option<&str>)> = vec![
            (
                format!("{base} password={PW} sslmode=require"),
                vec![],
                Some("sslmode=require"),
            ),
            (
                format!("{base} password={PW} sslmode=disable"),
                vec![],
                Some("sslmode=disable"),
            ),
            (
                format!("{base} password={PW} sslmode=allow"),
                vec![],
                Some("sslmode=allow"),
            ),
            (
                format!("{base} password={PW}"),
                vec![],
                Some("sslmode=prefer"),
            ),
            (
                base.to_string(),
                vec![("PGPASSWORD", PW)],
                Some("sslmode=prefer"),
            ),
            (
                format!("{base} password={PW} sslmode=require channel_binding=prefer"),
                vec![],
                Some("channel binding is not required"),
            ),
            (
                format!("{base} password={PW} sslmode=verify-full sslrootcert={ca}"),
                vec![],
                None,
            ),
            (
                format!("{base} password={PW} sslmode=verify-ca sslrootcert={ca}"),
                vec![],
                None,
            ),
            // require with a root certificate verifies the chain (libpq).
            (
                format!("{base} password={PW} sslmode=require sslrootcert={ca}"),
                vec![],
                None,
            ),
            (format!("{base} sslmode=prefer"), vec![], None),
            (format!("{base} sslmode=require"), vec![], None),
            (format!("{base} sslmode=disable"), vec![], None),
        ];
        for (s, env, want) in &cases {
            let c = Connector::new(&settings(Some(s), env)).unwrap();
            let warnings = logged_by_first_connections(&c);
            match want {
                Some(needle) => {
                    assert_eq!(warnings.len(), 1, "{s}: {warnings:?}");
                    assert!(warnings[0].contains(needle), "{s}: {warnings:?}");
                    assert!(warnings[0].contains("password"), "{s}: {warnings:?}");
                    assert_hides(&warnings[0], PW, s);
                }
                None => assert!(warnings.is_empty(), "{s}: {warnings:?}"),
            }
        }
    }

    #[test]
    fn a_password_over_unverified_tls_needs_channel_binding() {
        let ca = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca.path(), TEST_CA).unwrap();
        let ca = ca.path().display().to_string();
        use ChannelBinding::{Disable, Prefer, Require};
        // (connection string, environment, channel binding, required by lakecdc)
        let cases: Vec<(String, Env, ChannelBinding, bool)> = vec![
            (
                "host=h password=p sslmode=require".into(),
                vec![],
                Require,
                true,
            ),
            (
                "postgres://u:p@h/db?sslmode=require".into(),
                vec![],
                Require,
                true,
            ),
            (
                "host=h sslmode=require".into(),
                vec![("PGPASSWORD", "p")],
                Require,
                true,
            ),
            (
                "host=h".into(),
                vec![("PGPASSWORD", "p"), ("PGSSLMODE", "require")],
                Require,
                true,
            ),
            // The operator's choice wins.
            (
                "host=h password=p sslmode=require channel_binding=prefer".into(),
                vec![],
                Prefer,
                false,
            ),
            (
                "host=h password=p sslmode=require channel_binding=disable".into(),
                vec![],
                Disable,
                false,
            ),
            (
                "host=h password=p sslmode=require".into(),
                vec![("PGCHANNELBINDING", "prefer")],
                Prefer,
                false,
            ),
            (
                "host=h password=p channel_binding=require".into(),
                vec![("PGCHANNELBINDING", "disable")],
                Require,
                false,
            ),
            // Without a password, or where TLS may not happen, or where the server is verified.
            ("host=h sslmode=require".into(), vec![], Prefer, false),
            (
                "host=h password=p sslmode=prefer".into(),
                vec![],
                Prefer,
                false,
            ),
            (
                "host=h password=p sslmode=allow".into(),
                vec![],
                Prefer,
                false,
            ),
            (
                "host=h password=p sslmode=disable".into(),
                vec![],
                Prefer,
                false,
            ),
            (
                format!("host=h password=p sslmode=verify-full sslrootcert={ca}"),
                vec![],
                Prefer,
                false,
            ),
            (
                format!("host=h password=p sslmode=require sslrootcert={ca}"),
                vec![],
                Prefer,
                false,
            ),
        ];
        for (s, env, want, required) in &cases {
            let c = Connector::new(&settings(Some(s), env)).unwrap();
            assert_eq!(c.config.get_channel_binding(), *want, "{s} {env:?}");
            assert_eq!(c.binding_required, *required, "{s} {env:?}");
        }
    }

    #[test]
    fn require_with_a_root_certificate_verifies_the_chain() {
        for (conninfo, env) in [
            (
                "host=h sslmode=require sslrootcert=/nonexistent/ca.pem",
                vec![],
            ),
            (
                "postgres://u@h/db?sslmode=require&sslrootcert=%2Fnonexistent%2Fca.pem",
                vec![],
            ),
            (
                "host=h",
                vec![
                    ("PGSSLMODE", "require"),
                    ("PGSSLROOTCERT", "/nonexistent/ca.pem"),
                ],
            ),
            (
                "host=h sslmode=require",
                vec![("PGSSLROOTCERT", "/nonexistent/ca.pem")],
            ),
        ] {
            // The roots are loaded, so the missing file is an error.
            let e = Connector::new(&settings(Some(conninfo), &env))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("sslrootcert /nonexistent/ca.pem"),
                "{conninfo}: {e}"
            );
        }
        let c = Connector::new(&settings(Some("host=h sslmode=require"), &[])).unwrap();
        assert_eq!(c.tls_policy(), TlsPolicy::Require);
        // prefer stays unverified, root certificate or not.
        let c = Connector::new(&settings(
            Some("host=h sslmode=prefer sslrootcert=/nonexistent/ca.pem"),
            &[],
        ))
        .unwrap();
        assert_eq!(c.tls_policy(), TlsPolicy::Prefer);
        // allow is its own policy (plain first), not prefer.
        let c = Connector::new(&settings(Some("host=h sslmode=allow"), &[])).unwrap();
        assert_eq!(c.tls_policy(), TlsPolicy::Allow);
    }

    #[test]
    fn verify_modes_need_readable_roots() {
        let e = Connector::new(&settings(
            Some("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem"),
            &[],
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("sslrootcert /nonexistent/ca.pem"), "{e}");
    }
}

//! The sockets of PostgreSQL connections, opened by lakecdc itself for every connection, plain
//! or TLS, to one host or to several, and handed to the driver with `Config::connect_raw`.
//!
//! Two things need the socket in lakecdc's hands from its first byte:
//! - the COPY tap (docs/design.md §4.2): rows read under the driver's per-row messages. Over
//!   TLS the tap sits above rustls ([`super::tls_connector`]); over a plain socket, directly on
//!   it. Left to `Config::connect`, a plain socket is out of the tap's reach.
//! - the password guard (docs/hazards.md S7): a plain connection's startup is watched, and a
//!   request for the password in clear text fails it before the driver sees it
//!   ([`super::password_guard`]). A socket the driver opened itself would be unguarded.
//!
//! So lakecdc walks the connection string's hosts as the driver (and libpq) would
//! ([`targets`]): in order, or shuffled under `load_balance_hosts=random`; each host's port
//! (one port for all, or one each) and `hostaddr`; every address a name resolves to. The
//! caller tries each target in turn with the transports its `sslmode` allows and checks
//! `target_session_attrs` on the session it gets ([`session_attrs_hold`]). A socket is set up
//! as the driver sets its own: the connect timeout, `TCP_NODELAY`, keepalives, the TCP user
//! timeout.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpStream, UnixStream, lookup_host};
use tokio_postgres::config::{Host, LoadBalanceHosts, SslMode, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage};

use super::copy_tap::{Tapped, lock};
use super::password_guard::AuthGuard;
use super::tls_connector::{BufferedTls, CAPACITY, TapSlot};
use crate::error::ConnectAttempt as Attempt;

/// PostgreSQL's default port.
const DEFAULT_PORT: u16 = 5432;

/// One server a connection may go to: a host name or address and its port, or a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// A TCP server. `host` is the name TLS verifies (absent with `hostaddr` alone); `addr`,
    /// when given, is connected to instead of resolving `host`.
    Tcp {
        host: Option<String>,
        addr: Option<IpAddr>,
        port: u16,
    },
    /// A Unix-domain socket.
    Unix { path: PathBuf },
}

impl Target {
    /// Whether this is a Unix-domain socket, over which PostgreSQL never offers TLS.
    pub(super) fn is_unix(&self) -> bool {
        matches!(self, Target::Unix { .. })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp {
                host: Some(host),
                addr: Some(addr),
                port,
            } => write!(f, "{host} ({addr}) port {port}"),
            Target::Tcp {
                host: Some(host),
                port,
                ..
            } => write!(f, "{host} port {port}"),
            Target::Tcp {
                addr: Some(addr),
                port,
                ..
            } => write!(f, "{addr} port {port}"),
            Target::Tcp { port, .. } => write!(f, "port {port}"),
            Target::Unix { path } => write!(f, "{}", path.display()),
        }
    }
}

/// The targets of `config`, in the order they are tried (the driver's and libpq's rules).
pub(super) fn targets(config: &Config) -> Result<Vec<Target>, Attempt> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    if hosts.is_empty() && addrs.is_empty() {
        return Err(Attempt::Config(
            "the connection string names no host: set host= (or PGHOST)".into(),
        ));
    }
    if !hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len() {
        return Err(Attempt::Config(format!(
            "the connection string names {} hosts and {} hostaddrs: give one hostaddr per host",
            hosts.len(),
            addrs.len()
        )));
    }
    let count = hosts.len().max(addrs.len());
    let ports = config.get_ports();
    if ports.len() > 1 && ports.len() != count {
        return Err(Attempt::Config(format!(
            "the connection string names {count} hosts and {} ports: give one port, or one per host",
            ports.len()
        )));
    }
    let mut out: Vec<Target> = (0..count)
        .map(|i| {
            let port = ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(DEFAULT_PORT);
            match hosts.get(i) {
                // A Unix socket directory with a hostaddr: the address wins, as in the driver.
                Some(Host::Unix(dir)) if addrs.get(i).is_none() => Target::Unix {
                    path: dir.join(format!(".s.PGSQL.{port}")),
                },
                host => Target::Tcp {
                    host: match host {
                        Some(Host::Tcp(h)) => Some(h.clone()),
                        _ => None,
                    },
                    addr: addrs.get(i).copied(),
                    port,
                },
            }
        })
        .collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        fastrand::shuffle(&mut out);
    }
    Ok(out)
}

/// Opens a plain connection to `target`, its startup guarded ([`AuthGuard`]) and, with
/// `slot`, tapped (the tap's handle left in `slot`).
pub(super) async fn plain(
    config: &Config,
    target: &Target,
    slot: Option<&TapSlot>,
) -> Result<Client, Attempt> {
    let mut config = config.clone();
    config.ssl_mode(SslMode::Disable);
    match open(&config, target).await? {
        Socket::Tcp(s) => start(&config, target, guarded(s, slot), NoTls).await,
        Socket::Unix(s) => start(&config, target, guarded(s, slot), NoTls).await,
    }
}

/// Opens a TLS connection to `target` (`sslmode=require` semantics; `tls` verifies as the
/// policy says and taps when it was made with a slot).
///
/// The name sent and verified is the target's host; with `hostaddr` alone, the address, unless
/// `verify_host_name` (verify-full) needs a name only `host` gives (libpq's rule).
pub(super) async fn tls(
    config: &Config,
    target: &Target,
    tls: &BufferedTls,
    verify_host_name: bool,
) -> Result<Client, Attempt> {
    let mut config = config.clone();
    config.ssl_mode(SslMode::Require);
    // The name sent and verified, and the TCP server; PostgreSQL has no TLS on a Unix socket.
    let (host, addr, port) = match target {
        Target::Tcp { host, addr, port } => (host.as_deref(), *addr, *port),
        Target::Unix { .. } => {
            return Err(Attempt::UnixTls {
                target: target.to_string(),
            });
        }
    };
    let name = match (host, addr) {
        (Some(h), _) => h.to_string(),
        (None, Some(addr)) if !verify_host_name => addr.to_string(),
        _ => {
            return Err(Attempt::NoHostName {
                target: target.to_string(),
            });
        }
    };
    let connect =
        MakeTlsConnect::<TcpStream>::make_tls_connect(&mut tls.clone(), &name).map_err(|e| {
            Attempt::Config(format!(
                "{target}: TLS cannot be set up for this host name: {e}"
            ))
        })?;
    let stream = open_tcp(&config, host, addr, port)
        .await
        .map_err(socket_failed(target))?;
    start(&config, target, stream, connect).await
}

/// Whether the session on `client` has the properties `config`'s `target_session_attrs` asks
/// for (always, for `any`).
pub(super) async fn session_attrs_hold(
    config: &Config,
    target: &Target,
    client: &Client,
) -> Result<(), Attempt> {
    let wanted = match config.get_target_session_attrs() {
        TargetSessionAttrs::ReadWrite => "read-write",
        TargetSessionAttrs::ReadOnly => "read-only",
        _ => return Ok(()),
    };
    let rows = startup(target, client.simple_query("SHOW transaction_read_only")).await?;
    let read_only = rows.iter().any(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0) == Some("on"),
        _ => false,
    });
    let found = if read_only { "read-only" } else { "read-write" };
    if found == wanted {
        Ok(())
    } else {
        Err(Attempt::SessionAttrs {
            target: target.to_string(),
            found,
            wanted,
        })
    }
}

/// An open socket of either kind.
enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// Opens `target`'s socket, within the connect timeout.
async fn open(config: &Config, target: &Target) -> Result<Socket, Attempt> {
    let opened = match target {
        Target::Tcp { host, addr, port } => open_tcp(config, host.as_deref(), *addr, *port)
            .await
            .map(Socket::Tcp),
        Target::Unix { path } => within(config, UnixStream::connect(path))
            .await
            .map(Socket::Unix),
    };
    opened.map_err(socket_failed(target))
}

/// What a socket to `target` that could not be opened becomes.
fn socket_failed(target: &Target) -> impl FnOnce(io::Error) -> Attempt + '_ {
    move |source| Attempt::Socket {
        target: target.to_string(),
        source,
    }
}

/// Opens a TCP connection to `addr:port` or, without `addr`, to each address `host` resolves
/// to in turn (shuffled under `load_balance_hosts=random`), each within the connect timeout,
/// and sets the socket up as the driver does.
async fn open_tcp(
    config: &Config,
    host: Option<&str>,
    addr: Option<IpAddr>,
    port: u16,
) -> io::Result<TcpStream> {
    let mut addrs: Vec<SocketAddr> = match (addr, host) {
        (Some(a), _) => vec![SocketAddr::new(a, port)],
        (None, Some(host)) => within(config, lookup_host((host, port))).await?.collect(),
        (None, None) => Vec::new(),
    };
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        fastrand::shuffle(&mut addrs);
    }
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
    for addr in addrs {
        match within(config, TcpStream::connect(addr)).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                let sock = SockRef::from(&stream);
                if config.get_keepalives() {
                    let mut keepalive = TcpKeepalive::new().with_time(config.get_keepalives_idle());
                    if let Some(interval) = config.get_keepalives_interval() {
                        keepalive = keepalive.with_interval(interval);
                    }
                    if let Some(retries) = config.get_keepalives_retries() {
                        keepalive = keepalive.with_retries(retries);
                    }
                    sock.set_tcp_keepalive(&keepalive)?;
                }
                if let Some(timeout) = config.get_tcp_user_timeout() {
                    sock.set_tcp_user_timeout(Some(*timeout))?;
                }
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// `fut` within the connect timeout, when one is set.
async fn within<T>(config: &Config, fut: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    match config.get_connect_timeout() {
        None => fut.await,
        Some(limit) => tokio::time::timeout(*limit, fut)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timeout"))?,
    }
}

/// A driver exchange on a new connection, its error named by the target (the caller bounds
/// the whole attempt by the connect timeout).
async fn startup<T>(
    target: &Target,
    fut: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, Attempt> {
    fut.await.map_err(|source| Attempt::Startup {
        target: target.to_string(),
        source,
    })
}

/// A plain stream, buffered, guarded and (with `slot`) tapped from its first byte: with
/// `sslmode=disable` the driver sends no SSL request, so the server's first byte starts its
/// first message, where the guard's and the tap's framing start.
fn guarded<S>(stream: S, slot: Option<&TapSlot>) -> Tapped<AuthGuard<BufReader<S>>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let stream = AuthGuard::new(BufReader::with_capacity(CAPACITY, stream));
    match slot {
        Some(slot) => {
            let (stream, tap) = Tapped::with_tap(stream);
            *lock(slot) = Some(tap);
            stream
        }
        None => Tapped::plain(stream),
    }
}

/// The startup exchange over `stream`; the connection is then
/// driven on the runtime until the client is dropped.
async fn start<S, T>(config: &Config, target: &Target, stream: S, tls: T) -> Result<Client, Attempt>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: tokio_postgres::tls::TlsConnect<S> + Send,
    T::Stream: Send + 'static,
    T::Future: Send,
{
    let (client, conn) = startup(target, config.connect_raw(stream, tls)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "postgres connection closed");
        }
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(conninfo: &str) -> Vec<Target> {
        targets(&conninfo.parse::<Config>().unwrap()).unwrap()
    }

    fn tcp(host: Option<&str>, addr: Option<&str>, port: u16) -> Target {
        Target::Tcp {
            host: host.map(str::to_string),
            addr: addr.map(|a| a.parse().unwrap()),
            port,
        }
    }

    #[test]
    fn every_host_becomes_a_target_in_order_with_its_port_and_address() {
        assert_eq!(
            all("host=db.local port=6000"),
            vec![tcp(Some("db.local"), None, 6000)]
        );
        assert_eq!(
            all("host=db.local hostaddr=10.0.0.7"),
            vec![tcp(Some("db.local"), Some("10.0.0.7"), DEFAULT_PORT)]
        );
        assert_eq!(
            all("host=/run/pg port=5433"),
            vec![Target::Unix {
                path: "/run/pg/.s.PGSQL.5433".into()
            }]
        );
        assert_eq!(
            all("host=a,b port=7"),
            vec![tcp(Some("a"), None, 7), tcp(Some("b"), None, 7)]
        );
        assert_eq!(
            all("host=a,/run/pg port=1,2"),
            vec![
                tcp(Some("a"), None, 1),
                Target::Unix {
                    path: "/run/pg/.s.PGSQL.2".into()
                }
            ]
        );
        assert_eq!(
            all("hostaddr=10.0.0.1,10.0.0.2"),
            vec![
                tcp(None, Some("10.0.0.1"), DEFAULT_PORT),
                tcp(None, Some("10.0.0.2"), DEFAULT_PORT)
            ]
        );
        // target_session_attrs does not change the targets; the session is checked after.
        assert_eq!(
            all("host=a target_session_attrs=read-write"),
            vec![tcp(Some("a"), None, DEFAULT_PORT)]
        );
    }

    #[test]
    fn random_load_balancing_tries_every_host_once() {
        let mut seen = all("host=a,b,c,d,e,f,g,h load_balance_hosts=random");
        seen.sort_by_key(|t| t.to_string());
        assert_eq!(
            seen,
            ["a", "b", "c", "d", "e", "f", "g", "h"]
                .map(|h| tcp(Some(h), None, DEFAULT_PORT))
                .to_vec()
        );
    }

    #[test]
    fn lists_that_disagree_are_refused_with_the_fix() {
        let refused = |s: &str| {
            targets(&s.parse::<Config>().unwrap())
                .unwrap_err()
                .to_string()
        };
        assert!(refused("host=a,b port=1,2,3").contains("give one port, or one per host"));
        assert!(refused("host=a,b hostaddr=10.0.0.1").contains("one hostaddr per host"));
        assert!(refused("user=u").contains("names no host"));
    }

    #[test]
    fn a_target_shows_its_host_address_and_port_never_more() {
        assert_eq!(tcp(Some("db"), None, 5).to_string(), "db port 5");
        assert_eq!(
            tcp(Some("db"), Some("10.0.0.1"), 5).to_string(),
            "db (10.0.0.1) port 5"
        );
        assert_eq!(
            tcp(None, Some("10.0.0.1"), 5).to_string(),
            "10.0.0.1 port 5"
        );
    }
}

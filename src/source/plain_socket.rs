//! Plain (unencrypted) PostgreSQL sockets opened by lakecdc itself, so that a plain connection
//! carries the COPY tap as a TLS one does (docs/design.md §4.2), and its startup is watched
//! for a request of the password in clear text (`super::password_guard`, docs/hazards.md S7).
//!
//! tokio-postgres opens a plain connection's socket inside `Config::connect`, out of the tap's
//! reach, so plain connections used to read every row through the driver's per-row messages:
//! a sixth more CPU than over TLS. Here the socket is opened as the driver would open it
//! (the connect timeout, `TCP_NODELAY`, keepalives, the TCP user timeout), wrapped in a read
//! buffer and the tap, and handed to `Config::connect_raw`. With `sslmode` `disable` (or
//! `allow`'s first, plain attempt) the driver sends no SSL request, so the server's first byte
//! is the start of its first message, where the tap's framing starts.
//!
//! Every plain connection to a single host is opened here, tapped or not (`sslmode` disable,
//! `allow`'s plain attempt, `prefer` meeting a server without TLS). Several hosts, `hostaddr`
//! lists and `target_session_attrs` are the driver's to walk and check, and such connections
//! stay untapped and unguarded. When this socket cannot be opened, the driver opens its own
//! and reports the failure in its words.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpStream, UnixStream, lookup_host};
use tokio_postgres::config::{Host, TargetSessionAttrs};
use tokio_postgres::{Config, NoTls};

use super::copy_tap::{Tapped, lock};
use super::password_guard::AuthGuard;
use super::tls_connector::{CAPACITY, TapSlot};

/// PostgreSQL's default port.
const DEFAULT_PORT: u16 = 5432;

/// The one server a plain connection goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Tcp {
        host: String,
        addr: Option<IpAddr>,
        port: u16,
    },
    Unix {
        path: PathBuf,
    },
}

/// The single target of `config`, or `None` when the driver must choose one.
fn single_target(config: &Config) -> Option<Target> {
    let [host] = config.get_hosts() else {
        return None;
    };
    let port = match config.get_ports() {
        [] => DEFAULT_PORT,
        [port] => *port,
        _ => return None,
    };
    if config.get_target_session_attrs() != TargetSessionAttrs::Any {
        return None;
    }
    let addr = match config.get_hostaddrs() {
        [] => None,
        [addr] => Some(*addr),
        _ => return None,
    };
    Some(match host {
        Host::Tcp(host) => Target::Tcp {
            host: host.clone(),
            addr,
            port,
        },
        Host::Unix(dir) => Target::Unix {
            path: dir.join(format!(".s.PGSQL.{port}")),
        },
    })
}

/// Opens a TCP connection to `host:port` (or `addr:port`), trying each resolved address in
/// turn, each within the connect timeout, and sets the socket up as the driver does.
async fn open_tcp(
    config: &Config,
    host: &str,
    addr: Option<IpAddr>,
    port: u16,
) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = match addr {
        Some(a) => vec![SocketAddr::new(a, port)],
        None => within(config, lookup_host((host, port))).await?.collect(),
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
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

/// Opens a plain connection to `config`'s single target, its startup guarded
/// ([`AuthGuard`]) and, with `slot`, tapped (the tap's handle left in `slot`). `None` when the
/// target is not a single host or its socket could not be opened: the caller then lets the
/// driver connect (untapped, unguarded).
pub(super) async fn connect(
    config: &Config,
    slot: Option<&TapSlot>,
) -> Option<Result<tokio_postgres::Client, tokio_postgres::Error>> {
    let target = single_target(config)?;
    let connected = match &target {
        Target::Tcp { host, addr, port } => match open_tcp(config, host, *addr, *port).await {
            Ok(stream) => handshake(config, stream, slot).await,
            Err(e) => return not_opened(&e),
        },
        Target::Unix { path } => match within(config, UnixStream::connect(path)).await {
            Ok(stream) => handshake(config, stream, slot).await,
            Err(e) => return not_opened(&e),
        },
    };
    Some(connected)
}

/// Whether `config` names the single target [`connect`] opens itself.
pub(super) fn is_single_target(config: &Config) -> bool {
    single_target(config).is_some()
}

fn not_opened<T>(e: &io::Error) -> Option<T> {
    tracing::debug!(error = %e, "plain socket not opened here; the driver connects");
    None
}

/// The startup exchange over `stream`: buffered, guarded and (with `slot`) tapped from its
/// first byte.
async fn handshake<S>(
    config: &Config,
    stream: S,
    slot: Option<&TapSlot>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let stream = AuthGuard::new(tokio::io::BufReader::with_capacity(CAPACITY, stream));
    let stream = match slot {
        Some(slot) => {
            let (stream, tap) = Tapped::with_tap(stream);
            *lock(slot) = Some(tap);
            stream
        }
        None => Tapped::plain(stream),
    };
    let (client, conn) = config.connect_raw(stream, NoTls).await?;
    tokio::spawn(super::connect::drive(conn));
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(conninfo: &str) -> Option<Target> {
        single_target(&conninfo.parse::<Config>().unwrap())
    }

    #[test]
    fn only_a_single_host_is_opened_here() {
        assert_eq!(
            target("host=db.local port=6000"),
            Some(Target::Tcp {
                host: "db.local".into(),
                addr: None,
                port: 6000
            })
        );
        assert_eq!(
            target("host=db.local hostaddr=10.0.0.7"),
            Some(Target::Tcp {
                host: "db.local".into(),
                addr: Some("10.0.0.7".parse().unwrap()),
                port: DEFAULT_PORT
            })
        );
        assert_eq!(
            target("host=/run/pg port=5433"),
            Some(Target::Unix {
                path: "/run/pg/.s.PGSQL.5433".into()
            })
        );
        assert_eq!(target("host=a,b"), None);
        assert_eq!(target("host=a port=1,2"), None);
        assert_eq!(target("host=a target_session_attrs=read-write"), None);
    }
}

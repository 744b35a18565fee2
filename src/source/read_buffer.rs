//! A read buffer under the TLS layer of PostgreSQL connections. rustls reads the socket 4 KiB
//! at a time, so a binary COPY of a few hundred MiB took one `recvfrom` per 4 KiB (77,000 of
//! them for the 1M-row init benchmark); through this buffer one read takes whatever the socket
//! holds, up to [`CAPACITY`], and rustls's small reads are served from memory.

use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The most one socket read takes.
pub const CAPACITY: usize = 256 * 1024;

/// rustls over a buffered socket.
#[derive(Clone)]
pub struct BufferedTls(pub MakeRustlsConnect);

/// One connection's TLS handshake, over a buffered socket.
pub struct BufferedConnect<T>(T);

impl<S> MakeTlsConnect<S> for BufferedTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<BufReader<S>>>::Stream;
    type TlsConnect =
        BufferedConnect<<MakeRustlsConnect as MakeTlsConnect<BufReader<S>>>::TlsConnect>;
    type Error = <MakeRustlsConnect as MakeTlsConnect<BufReader<S>>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        MakeTlsConnect::<BufReader<S>>::make_tls_connect(&mut self.0, domain).map(BufferedConnect)
    }
}

impl<S, T> TlsConnect<S> for BufferedConnect<T>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: TlsConnect<BufReader<S>>,
{
    type Stream = T::Stream;
    type Error = T::Error;
    type Future = T::Future;

    fn connect(self, stream: S) -> Self::Future {
        self.0.connect(BufReader::with_capacity(CAPACITY, stream))
    }
}

//! The TLS connector of PostgreSQL connections: rustls over a read buffer, with a COPY tap
//! above it when the caller asks for one (see [`super::copy_tap`]).
//!
//! rustls reads the socket 4 KiB at a time, so a binary COPY of a few hundred MiB took one
//! `recvfrom` per 4 KiB (77,000 of them for the 1M-row init benchmark); through this buffer one
//! read takes whatever the socket holds, up to [`CAPACITY`], and rustls's small reads are served
//! from memory.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::copy_tap::{CopyTap, Tapped, lock};

/// The most one socket read takes.
pub(super) const CAPACITY: usize = 256 * 1024;

/// Where a tapped connection leaves the handle of its tap.
pub(super) type TapSlot = Arc<Mutex<Option<CopyTap>>>;

/// rustls over a buffered socket; tapped when it has a slot for the tap's handle.
#[derive(Clone)]
pub(super) struct BufferedTls {
    rustls: MakeRustlsConnect,
    slot: Option<TapSlot>,
}

impl BufferedTls {
    /// Untapped connections.
    pub(super) fn new(rustls: MakeRustlsConnect) -> Self {
        Self { rustls, slot: None }
    }

    /// The same connector, tapping its connections and leaving each tap's handle in `slot`.
    pub(super) fn tapping(&self, slot: TapSlot) -> Self {
        Self {
            rustls: self.rustls.clone(),
            slot: Some(slot),
        }
    }
}

/// One connection's TLS handshake, over a buffered socket.
pub(super) struct BufferedConnect<T> {
    inner: T,
    slot: Option<TapSlot>,
}

impl<S> MakeTlsConnect<S> for BufferedTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Tapped<<MakeRustlsConnect as MakeTlsConnect<BufReader<S>>>::Stream>;
    type TlsConnect =
        BufferedConnect<<MakeRustlsConnect as MakeTlsConnect<BufReader<S>>>::TlsConnect>;
    type Error = <MakeRustlsConnect as MakeTlsConnect<BufReader<S>>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        let inner = MakeTlsConnect::<BufReader<S>>::make_tls_connect(&mut self.rustls, domain)?;
        Ok(BufferedConnect {
            inner,
            slot: self.slot.clone(),
        })
    }
}

impl<S, T> TlsConnect<S> for BufferedConnect<T>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: TlsConnect<BufReader<S>>,
{
    type Stream = Tapped<T::Stream>;
    type Error = T::Error;
    type Future = Handshake<T::Future>;

    fn connect(self, stream: S) -> Self::Future {
        Handshake {
            inner: Box::pin(
                self.inner
                    .connect(BufReader::with_capacity(CAPACITY, stream)),
            ),
            slot: self.slot,
        }
    }
}

/// A TLS handshake whose stream is tapped once it is done (its plaintext then starts at the
/// server's first message).
pub(super) struct Handshake<F> {
    inner: Pin<Box<F>>,
    slot: Option<TapSlot>,
}

impl<F, St, E> Future for Handshake<F>
where
    F: Future<Output = Result<St, E>>,
{
    type Output = Result<Tapped<St>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let stream = ready!(this.inner.as_mut().poll(cx))?;
        Poll::Ready(Ok(match this.slot.take() {
            Some(slot) => {
                let (stream, tap) = Tapped::with_tap(stream);
                *lock(&slot) = Some(tap);
                stream
            }
            None => Tapped::plain(stream),
        }))
    }
}

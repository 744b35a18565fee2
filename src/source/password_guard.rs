//! A plain connection's startup exchange, watched for a request of the password in clear text
//! (docs/hazards.md S7).
//!
//! Over a plain socket nobody vouches for the server: whatever answers at its address (another
//! user of the host who bound the port while PostgreSQL was down, or anything on the path) can
//! ask for the password in clear text, and tokio-postgres would send it. An [`AuthGuard`] sits
//! under the driver on every plain connection (lakecdc opens every socket itself, `super::socket`),
//! follows the server's messages until the authentication exchange is over, and fails the read
//! that carries an `AuthenticationCleartextPassword`: the driver never sees the request, so the
//! password never leaves. MD5 and SCRAM requests pass (neither sends the password itself).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the refused read reports (the connect error's cause names it).
pub(super) const CLEARTEXT_REFUSED: &str = "the server asked for the password in clear text over an unencrypted connection, which lakecdc refuses (anything that answers at the server's address could ask): use scram-sha-256 (or md5) in the server's pg_hba.conf, or TLS with sslmode=verify-full";

/// An authentication request's type byte; the code that asks for the password in clear text.
const AUTHENTICATION: u8 = b'R';
const CLEARTEXT_PASSWORD: [u8; 4] = 3u32.to_be_bytes();
const AUTHENTICATION_OK: [u8; 4] = 0u32.to_be_bytes();

/// Where the watch is in the server's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Reading a message's first 9 bytes (type, length, and an authentication request's code):
    /// `have` of them so far.
    Head { have: usize, bytes: [u8; 9] },
    /// Skipping the rest of a message: `left` bytes.
    Skip { left: usize },
    /// Authentication is over (or the stream is not one the watch understands): everything
    /// passes untouched.
    Done,
}

const NEXT: Watch = Watch::Head {
    have: 0,
    bytes: [0; 9],
};

/// A plain connection's stream whose startup exchange is watched (see the module docs).
pub(super) struct AuthGuard<S> {
    inner: S,
    watch: Watch,
}

impl<S> AuthGuard<S> {
    /// `inner`, at the start of the server's first message.
    pub(super) fn new(inner: S) -> Self {
        Self { inner, watch: NEXT }
    }
}

/// Follows `data` (the next bytes from the server); `Err` when they hold a request for the
/// password in clear text.
fn follow(watch: &mut Watch, data: &[u8]) -> io::Result<()> {
    let mut i = 0;
    while i < data.len() {
        match watch {
            Watch::Done => return Ok(()),
            Watch::Skip { left } => {
                let take = (*left).min(data.len() - i);
                *left -= take;
                i += take;
                if *left == 0 {
                    *watch = NEXT;
                }
            }
            Watch::Head { have, bytes } => {
                // The length (bytes 1..5) counts itself; a message shorter than 9 bytes is
                // read in full as its head.
                let want = match *have {
                    h if h < 5 => 5,
                    _ => message_len(bytes).map_or(5, |l| (1 + l).min(9)),
                };
                let take = (want - *have).min(data.len() - i);
                bytes[*have..*have + take].copy_from_slice(&data[i..i + take]);
                *have += take;
                i += take;
                if *have < want {
                    continue;
                }
                let Some(len) = message_len(bytes) else {
                    // No length: leave the broken stream to the driver to report.
                    *watch = Watch::Done;
                    continue;
                };
                if *have < (1 + len).min(9) {
                    continue;
                }
                let code: [u8; 4] = [bytes[5], bytes[6], bytes[7], bytes[8]];
                *watch = match bytes[0] {
                    AUTHENTICATION if len >= 8 && code == CLEARTEXT_PASSWORD => {
                        return Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            CLEARTEXT_REFUSED,
                        ));
                    }
                    // Authenticated: nothing asks for the password again on this connection.
                    AUTHENTICATION if len >= 8 && code == AUTHENTICATION_OK => Watch::Done,
                    // Any other request (MD5, SASL), an error or a protocol version notice is
                    // not a clear-text request; the exchange goes on or ends.
                    _ => match (1 + len).saturating_sub(*have) {
                        0 => NEXT,
                        left => Watch::Skip { left },
                    },
                };
            }
        }
    }
    Ok(())
}

/// A message head's length field (which counts itself), when it is one.
fn message_len(bytes: &[u8; 9]) -> Option<usize> {
    let len = i32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    usize::try_from(len).ok().filter(|l| *l >= 4)
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.watch == Watch::Done {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        // The bytes are in `buf` already, but a failed read hands none of them on.
        follow(&mut this.watch, &buf.filled()[before..])?;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follows `stream` cut into pieces of `size` bytes; the error's text, if any.
    fn run(stream: &[u8], size: usize) -> (Option<String>, Watch) {
        let mut watch = NEXT;
        for piece in stream.chunks(size) {
            if let Err(e) = follow(&mut watch, piece) {
                return (Some(e.to_string()), watch);
            }
        }
        (None, watch)
    }

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_cleartext_request_is_refused_however_the_stream_is_cut() {
        let stream = [
            message(b'N', b"SNOTICE\0\0"),
            message(b'R', &3u32.to_be_bytes()),
        ]
        .concat();
        for size in 1..=stream.len() {
            let (err, _) = run(&stream, size);
            assert_eq!(err.as_deref(), Some(CLEARTEXT_REFUSED), "pieces of {size}");
        }
    }

    #[test]
    fn scram_and_md5_pass_and_the_watch_ends_at_authentication_ok() {
        let sasl = [&10u32.to_be_bytes()[..], b"SCRAM-SHA-256\0\0"].concat();
        let md5 = [&5u32.to_be_bytes()[..], b"salt"].concat();
        let after = message(b'R', &3u32.to_be_bytes()); // not a request once authenticated
        for first in [sasl, md5] {
            let stream = [
                message(b'R', &first),
                message(b'R', &0u32.to_be_bytes()),
                after.clone(),
            ]
            .concat();
            for size in 1..=stream.len() {
                let (err, watch) = run(&stream, size);
                assert_eq!(err, None, "pieces of {size}");
                assert_eq!(watch, Watch::Done, "pieces of {size}");
            }
        }
    }

    #[test]
    fn an_error_before_authentication_passes_and_the_watch_goes_on() {
        let stream = [
            message(b'E', b"SFATAL\0Mno\0\0"),
            message(b'R', &3u32.to_be_bytes()),
        ]
        .concat();
        let (err, _) = run(&stream, 3);
        assert_eq!(err.as_deref(), Some(CLEARTEXT_REFUSED));
        // A message without a length leaves the stream to the driver.
        let (err, watch) = run(b"R\xff\xff\xff\xff\0\0\0\x03", 4);
        assert_eq!((err, watch), (None, Watch::Done));
    }
}

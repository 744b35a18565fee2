//! Query results taken out of a TLS connection's byte stream before tokio-postgres parses them.
//!
//! tokio-postgres hands over a `COPY … TO STDOUT` one protocol message per row, and a query's
//! rows as one `Row` each: every row is split off the read buffer as its own `Bytes`, parsed,
//! queued, and dropped. For init's four million COPY messages per million entities (one per
//! entity, one per EAV row) that was a seventh of lakecdc's CPU, and for flush's by-id reads a
//! sixth. A [`Tapped`] stream sits between the TLS layer and tokio-postgres and follows the
//! protocol's framing (a type byte, then a 32-bit length). While its [`CopyTap`] is armed it
//! hands every CopyData (or DataRow) payload straight to a [`CopySink`] — the binary decoder
//! that builds Arrow columns — in large slices, and passes everything else on. tokio-postgres
//! then sees a COPY without data, or a query without rows, and ends it as usual.
//!
//! TLS connections are tapped above the TLS layer, and plain ones (`sslmode=disable`,
//! `allow`'s plain attempt, `prefer` meeting a server without TLS) directly on the socket,
//! which lakecdc opens itself for every connection (`super::socket`). A reader whose tap is
//! not armed (or is off, [`super::Connector::with_copy_tap`]) gets the data from tokio-postgres
//! and feeds the same decoder, so a read decodes the same either way. A message is either diverted
//! or passed, never both.
//!
//! # What the tap relies on
//!
//! The tap works underneath tokio-postgres, so it depends on how the driver behaves, not only on
//! what its API promises. `tokio-postgres`, `tokio-postgres-rustls` and `postgres-protocol` are
//! therefore pinned exactly in `Cargo.toml`, and each behaviour below has a canary test in
//! `tests/it/copy_tap.rs` that fails, naming the behaviour's number, when an upgrade changes it.
//! An upgrade must re-run them; until a failing one is dealt with,
//! [`Connector::with_copy_tap`](super::Connector::with_copy_tap)`(false)` reads everything
//! through tokio-postgres alone.
//!
//! 1. **Every server message is read through the TLS stream, from the first.** tokio-postgres
//!    hands the socket to the TLS connector after its SSL request and reads the whole session
//!    (the startup exchange included) from the stream the handshake returns, with `poll_read`
//!    only, so the tap's framing starts at a message boundary and stays in step.
//!    Canary: `canary_1_every_server_message_is_read_through_the_tls_stream`.
//! 2. **`copy_out` ends its stream at CopyDone, with or without CopyData.** It takes a COPY
//!    whose data the tap took (CopyOutResponse, then CopyDone) as an empty, successful one, and
//!    the stream ends no earlier than CopyDone, where the tap ends the statement, so the reader
//!    may disarm as soon as the stream ends.
//!    Canary: `canary_2_copy_out_ends_at_copy_done_without_data`.
//! 3. **`query_raw` asks for every column in binary.** Its Bind (written by postgres-protocol)
//!    carries the single result-format code 1, so the DataRow payloads the tap takes are binary
//!    COPY tuples for the decoder. Canary: `canary_3_query_raw_asks_for_binary_results`.
//! 4. **A row stream is not checked against CommandComplete's count.** A query whose rows the
//!    tap took ends successfully with none, and `rows_affected` reports the server's count
//!    (which the by-id read compares with the rows it decoded).
//!    Canary: `canary_4_a_row_stream_is_not_checked_against_its_count`.
//! 5. **Requests go out in the order their futures are first polled.** `query_raw` on a
//!    prepared statement sends its request before its first await, and `try_join!` polls its
//!    futures in the order listed, so the by-id read's statements are sent (and answered) in
//!    the order of the sinks it arms the tap with.
//!    Canary: `canary_5_pipelined_reads_are_sent_in_join_order`.
//! 6. **Each statement ends at exactly one CommandComplete, EmptyQueryResponse, ErrorResponse
//!    or CopyDone.** A read on a prepared statement is one request (Bind, Execute without a row
//!    limit, Sync: no Parse, Describe or type lookup in between), a `copy_out`'s preparation
//!    sends none of these messages, and an error ends only its own statement; the tap moves to
//!    the next sink exactly there (`Divert::ends_statement`).
//!    Canary: `canary_6_each_statement_ends_at_one_terminator`.
//! 7. **An abandoned statement's responses are read and dropped.** When a reader drops a
//!    stream before its end, tokio-postgres keeps reading that statement's responses and drops
//!    them, so once the tap is spent (see [`Armed`]) and passes them on, the connection stays
//!    correct. Canary: `canary_7_an_abandoned_statement_is_drained_by_the_driver`.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsStream};

/// Where an armed tap puts the payloads it diverts (CopyData or DataRow).
pub trait CopySink: Send {
    /// Takes the next bytes of the diverted payloads, in stream order. A payload may arrive in
    /// more than one piece, and one piece never spans two messages.
    fn copy_data(&mut self, bytes: &[u8]);
}

/// The sink a tap feeds, shared with the reader that armed it.
pub type SharedSink = Arc<Mutex<dyn CopySink>>;

/// Locks `m`, taking the data of a poisoned lock as it is (a panicking sink has already lost its
/// COPY; the reader reports it).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Which messages an armed tap takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Divert {
    /// CopyData: the data of a `COPY … TO STDOUT`.
    #[default]
    CopyData,
    /// DataRow: the rows of a query with binary results. Each payload is a field count and the
    /// fields, laid out as a binary COPY tuple.
    DataRows,
}

impl Divert {
    /// The type byte of the messages diverted.
    fn message_type(self) -> u8 {
        match self {
            Self::CopyData => b'd',
            Self::DataRows => b'D',
        }
    }

    /// Whether a message of type `message_type` ends what a statement's sink gets: a COPY's
    /// data ends at CopyDone (where tokio-postgres ends its stream, so the reader may disarm
    /// right after it) or an ErrorResponse; a query's rows end at CommandComplete,
    /// ErrorResponse or EmptyQueryResponse.
    fn ends_statement(self, message_type: u8) -> bool {
        match self {
            Self::CopyData => matches!(message_type, b'c' | b'E'),
            Self::DataRows => matches!(message_type, b'C' | b'E' | b'I'),
        }
    }
}

/// What a tap and its handle share.
#[derive(Default)]
struct Shared {
    /// The messages diverted.
    kind: Divert,
    /// One sink per statement in flight, in the order the statements were sent; the front one
    /// takes the messages until its statement ends.
    sinks: VecDeque<SharedSink>,
    /// Counts arms, so that a read that began under one arm updates only that arm's state.
    generation: u64,
    /// An arm was dropped before its statements ended: the server may still be sending their
    /// data, which a new arm would take for its own. The tap is never armed again.
    spent: bool,
    /// Messages diverted since the connection opened.
    diverted: u64,
    /// Where the messages diverted are also counted, across connections.
    total: Option<Arc<AtomicU64>>,
}

/// What one read of the stream diverts to: the arm it began under and that arm's current sink.
struct Target {
    kind: Divert,
    generation: u64,
    sink: Option<SharedSink>,
}

impl Target {
    fn load(shared: &Mutex<Shared>) -> Self {
        let s = lock(shared);
        Self {
            kind: s.kind,
            generation: s.generation,
            sink: s.sinks.front().cloned(),
        }
    }

    /// The current statement has ended: on to the next one's sink.
    fn advance(&mut self, shared: &Mutex<Shared>) {
        let mut s = lock(shared);
        self.sink = if s.generation == self.generation {
            s.sinks.pop_front();
            s.sinks.front().cloned()
        } else {
            None
        };
    }
}

/// A reader's handle on the tap of its connection. The default handle (untapped connections) taps
/// nothing.
#[derive(Clone, Default)]
pub struct CopyTap {
    shared: Weak<Mutex<Shared>>,
}

impl std::fmt::Debug for CopyTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyTap")
            .field("live", &self.is_live())
            .finish()
    }
}

impl CopyTap {
    /// Diverts the connection's CopyData to `sink` until the guard is dropped (see
    /// [`CopyTap::arm_for`]).
    pub fn arm(&self, sink: SharedSink) -> Option<Armed> {
        self.arm_for(Divert::CopyData, vec![sink])
    }

    /// Diverts the `kind` messages of the next statements sent, one sink per statement in the
    /// order they are sent, until the guard is dropped. Arm only between statements, before
    /// sending them, and drop the guard once their streams have ended. `None` — read them
    /// through tokio-postgres — when the connection is not tapped (plain, or gone), is armed
    /// already, or was disarmed before its statements ended.
    pub fn arm_for(&self, kind: Divert, sinks: Vec<SharedSink>) -> Option<Armed> {
        let shared = self.shared.upgrade()?;
        let generation = {
            let mut s = lock(&shared);
            if s.spent || !s.sinks.is_empty() || sinks.is_empty() {
                return None;
            }
            s.generation += 1;
            s.kind = kind;
            s.sinks = sinks.into();
            s.generation
        };
        Some(Armed { shared, generation })
    }

    /// Whether the handle taps a connection that is still open.
    pub fn is_live(&self) -> bool {
        self.shared.strong_count() > 0
    }

    /// Messages the tap has diverted so far (0 for an untapped connection).
    pub fn diverted(&self) -> u64 {
        self.shared.upgrade().map_or(0, |s| lock(&s).diverted)
    }

    /// Adds the messages the tap diverts from now on to `total` as well (nothing when the
    /// connection is not tapped).
    pub fn count_into(&self, total: Arc<AtomicU64>) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared).total = Some(total);
        }
    }
}

/// An armed tap; dropping it disarms the tap.
pub struct Armed {
    shared: Arc<Mutex<Shared>>,
    generation: u64,
}

impl Drop for Armed {
    fn drop(&mut self) {
        let mut s = lock(&self.shared);
        if s.generation == self.generation && !s.sinks.is_empty() {
            s.sinks.clear();
            s.spent = true;
        }
    }
}

/// Where the framing is in the byte stream.
#[derive(Clone, Copy)]
enum Frame {
    /// Reading a message's type byte and length (`have` of the 5 bytes so far).
    Header { have: usize, bytes: [u8; 5] },
    /// Inside a message body with `left` bytes to go; `divert` when it goes to the sink.
    Body { left: usize, divert: bool },
    /// A length that is no length: everything passes on untouched from here, and tokio-postgres
    /// reports the broken stream.
    Lost,
}

const NEW_MESSAGE: Frame = Frame::Header {
    have: 0,
    bytes: [0; 5],
};

/// How much one read from the TLS layer takes.
const READ_SIZE: usize = 128 * 1024;

/// The tapping state of a [`Tapped`] stream.
struct Tap {
    shared: Arc<Mutex<Shared>>,
    raw: Box<[u8]>,
    /// Bytes waiting to be passed on to tokio-postgres, from `pass_at`.
    pass: Vec<u8>,
    pass_at: usize,
    frame: Frame,
}

/// A connection's stream, tapped or passed through untouched.
pub struct Tapped<S> {
    inner: S,
    tap: Option<Tap>,
}

impl<S> Tapped<S> {
    /// `inner` untouched.
    pub fn plain(inner: S) -> Self {
        Self { inner, tap: None }
    }

    /// `inner` tapped, and the handle that arms the tap. `inner` must be at the start of the
    /// server's messages (a TLS stream right after its handshake is).
    pub fn with_tap(inner: S) -> (Self, CopyTap) {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let tap = CopyTap {
            shared: Arc::downgrade(&shared),
        };
        let stream = Self {
            inner,
            tap: Some(Tap {
                shared,
                raw: vec![0; READ_SIZE].into_boxed_slice(),
                pass: Vec::new(),
                pass_at: 0,
                frame: NEW_MESSAGE,
            }),
        };
        (stream, tap)
    }
}

/// Splits `data` (the next bytes from the server) into what passes on (appended to `pass`) and
/// the diverted payloads, which go to the armed sinks. `frame` carries the framing between
/// calls.
fn split(data: &[u8], frame: &mut Frame, pass: &mut Vec<u8>, shared: &Mutex<Shared>) {
    let mut target = Target::load(shared);
    let mut sink = target.sink.as_deref().map(lock);
    let mut diverted = 0;
    let mut i = 0;
    while i < data.len() {
        match frame {
            Frame::Header { have, bytes } => {
                let take = (5 - *have).min(data.len() - i);
                bytes[*have..*have + take].copy_from_slice(&data[i..i + take]);
                *have += take;
                i += take;
                if *have < 5 {
                    continue;
                }
                let header = *bytes;
                let len = i32::from_be_bytes([header[1], header[2], header[3], header[4]]);
                let Some(left) = usize::try_from(len).ok().and_then(|l| l.checked_sub(4)) else {
                    pass.extend_from_slice(&header);
                    *frame = Frame::Lost;
                    continue;
                };
                let divert = header[0] == target.kind.message_type() && sink.is_some();
                if divert {
                    diverted += 1;
                } else {
                    pass.extend_from_slice(&header);
                }
                if sink.is_some() && target.kind.ends_statement(header[0]) {
                    drop(sink);
                    target.advance(shared);
                    sink = target.sink.as_deref().map(lock);
                }
                *frame = if left == 0 {
                    NEW_MESSAGE
                } else {
                    Frame::Body { left, divert }
                };
            }
            Frame::Body { left, divert } => {
                let take = (*left).min(data.len() - i);
                let part = &data[i..i + take];
                match (sink.as_deref_mut(), *divert) {
                    (Some(s), true) => s.copy_data(part),
                    // Disarmed inside a diverted message: its header was not passed on, so
                    // neither is the rest of it.
                    (None, true) => {}
                    (_, false) => pass.extend_from_slice(part),
                }
                *left -= take;
                i += take;
                if *left == 0 {
                    *frame = NEW_MESSAGE;
                }
            }
            Frame::Lost => {
                pass.extend_from_slice(&data[i..]);
                i = data.len();
            }
        }
    }
    drop(sink);
    if diverted > 0 {
        let mut s = lock(shared);
        s.diverted += diverted;
        if let Some(total) = &s.total {
            total.fetch_add(diverted, Ordering::Relaxed);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tapped<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(tap) = &mut this.tap else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        loop {
            if tap.pass_at < tap.pass.len() {
                let n = buf.remaining().min(tap.pass.len() - tap.pass_at);
                buf.put_slice(&tap.pass[tap.pass_at..tap.pass_at + n]);
                tap.pass_at += n;
                if tap.pass_at == tap.pass.len() {
                    tap.pass.clear();
                    tap.pass_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut raw = ReadBuf::new(&mut tap.raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw))?;
            let n = raw.filled().len();
            if n == 0 {
                // The end of the stream. A header cut short passes on as it is, so that
                // tokio-postgres reports the incomplete message.
                if let Frame::Header { have, bytes } = tap.frame
                    && have > 0
                {
                    tap.pass.extend_from_slice(&bytes[..have]);
                    tap.frame = Frame::Lost;
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            split(&tap.raw[..n], &mut tap.frame, &mut tap.pass, &tap.shared);
            // A read that was all CopyData passes nothing on: read again rather than report
            // an empty read, which would mean the end of the stream.
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tapped<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
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

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: TlsStream + Unpin> TlsStream for Tapped<S> {
    fn channel_binding(&self) -> ChannelBinding {
        self.inner.channel_binding()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A server's byte stream, read back in pieces of the given sizes (cycled); a size of 0
    /// is a read that is not ready yet (it wakes the task at once).
    struct Pieces {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        turn: usize,
    }

    impl Pieces {
        fn new(data: Vec<u8>, sizes: Vec<usize>) -> Self {
            Self {
                data,
                at: 0,
                sizes,
                turn: 0,
            }
        }
    }

    /// A sink that collects what it is given.
    fn collect() -> SharedSink {
        Arc::new(Mutex::new(Collect::default()))
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let size = this.sizes[this.turn % this.sizes.len()];
            this.turn += 1;
            if size == 0 && this.at < this.data.len() {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = size.min(buf.remaining()).min(this.data.len() - this.at);
            buf.put_slice(&this.data[this.at..this.at + n]);
            this.at += n;
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct Collect(Vec<u8>, usize);

    impl CopySink for Collect {
        fn copy_data(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
            self.1 += 1;
        }
    }

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A COPY's response: CopyOutResponse, data rows, CopyDone, CommandComplete, ReadyForQuery.
    fn copy_response(rows: &[&[u8]]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let head = [message(b'Z', b"I"), message(b'H', &[1, 0, 0])].concat();
        let data: Vec<u8> = rows.iter().flat_map(|r| message(b'd', r)).collect();
        let tail = [
            message(b'c', b""),
            message(b'C', b"COPY 3\0"),
            message(b'Z', b"I"),
        ]
        .concat();
        (head, data, tail)
    }

    async fn read_all<S: AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn armed_the_tap_takes_copy_data_out_and_passes_the_rest_whatever_the_pieces() {
        let rows: [&[u8]; 3] = [b"first row", b"", &[7u8; 300]];
        let (head, data, tail) = copy_response(&rows);
        let stream = [head.clone(), data, tail.clone()].concat();
        for sizes in [
            vec![1],
            vec![2, 3],
            vec![5],
            vec![7, 0, 1, 64],
            vec![1 << 20],
            vec![0, 3, 0, 0, 11],
        ] {
            let (mut tapped, tap) = Tapped::with_tap(Pieces::new(stream.clone(), sizes.clone()));
            let sink = Arc::new(Mutex::new(Collect::default()));
            let armed = tap.arm(sink.clone()).unwrap();
            let passed = read_all(&mut tapped).await;
            drop(armed);
            assert_eq!(
                passed,
                [head.clone(), tail.clone()].concat(),
                "pieces {sizes:?}"
            );
            assert_eq!(lock(&sink).0, rows.concat(), "pieces {sizes:?}");
            assert_eq!(tap.diverted(), 3);
        }
    }

    #[tokio::test]
    async fn diverted_messages_are_also_counted_where_the_handle_says() {
        let total = Arc::new(AtomicU64::new(0));
        for rows in [vec![&b"a"[..], b"b"], vec![b"c"]] {
            let (head, data, tail) = copy_response(&rows);
            let stream = Pieces::new([head, data, tail].concat(), vec![4]);
            let (mut tapped, tap) = Tapped::with_tap(stream);
            tap.count_into(total.clone());
            let armed = tap.arm(collect()).unwrap();
            read_all(&mut tapped).await;
            drop(armed);
            assert_eq!(tap.diverted(), rows.len() as u64);
        }
        assert_eq!(total.load(Ordering::Relaxed), 3);
        // An untapped handle counts nothing.
        CopyTap::default().count_into(total.clone());
        assert_eq!(total.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn unarmed_or_plain_every_byte_passes() {
        let (head, data, tail) = copy_response(&[b"a row"]);
        let stream = [head, data, tail].concat();
        let pieces = || Pieces::new(stream.clone(), vec![3]);
        let (mut tapped, tap) = Tapped::with_tap(pieces());
        assert_eq!(read_all(&mut tapped).await, stream);
        assert_eq!(tap.diverted(), 0);
        assert_eq!(read_all(&mut Tapped::plain(pieces())).await, stream);
        assert!(CopyTap::default().arm(collect()).is_none());
    }

    #[tokio::test]
    async fn disarmed_inside_a_message_the_rest_of_it_is_dropped_not_passed() {
        let (head, data, tail) = copy_response(&[&[9u8; 100]]);
        let stream = [head.clone(), data, tail.clone()].concat();
        let (mut tapped, tap) = Tapped::with_tap(Pieces::new(stream, vec![head.len() + 50]));
        let sink = Arc::new(Mutex::new(Collect::default()));
        let armed = tap.arm(sink.clone()).unwrap();
        let mut first = vec![0; head.len() + 50];
        let n = tapped.read(&mut first).await.unwrap();
        assert_eq!(&first[..n], &head[..]);
        drop(armed);
        let rest = read_all(&mut tapped).await;
        assert_eq!(
            rest, tail,
            "the message's second half must not reach tokio-postgres"
        );
        assert_eq!(lock(&sink).0, vec![9u8; 45]);
    }

    #[tokio::test]
    async fn a_tap_disarmed_before_its_copy_ended_is_never_armed_again() {
        let (head, data, tail) = copy_response(&[b"one", b"two"]);
        let stream = [head.clone(), data.clone(), tail.clone(), head, data, tail].concat();
        let (mut tapped, tap) = Tapped::with_tap(Pieces::new(stream, vec![1 << 20]));
        // A COPY whose CopyDone was read: the tap can be armed again, but only once at a time.
        let armed = tap.arm(collect()).unwrap();
        assert!(tap.arm(collect()).is_none(), "armed already");
        let mut first = vec![0; 1 << 20];
        let _ = tapped.read(&mut first).await.unwrap();
        drop(armed);
        let again = tap.arm(collect()).unwrap();
        // Disarmed with no CopyDone or error seen since: spent.
        drop(again);
        assert!(
            tap.arm(collect()).is_none(),
            "the server may still be sending"
        );
    }

    #[tokio::test]
    async fn pipelined_statements_rows_go_to_their_own_sinks_in_order() {
        // Two queries sent at once: the first fails after a row, the second returns two rows;
        // a third statement's rows (not armed for) pass on.
        let bind = message(b'2', b"");
        let first = [
            bind.clone(),
            message(b'D', b"a1"),
            message(b'E', b"SERROR\0"),
            message(b'Z', b"E"),
        ]
        .concat();
        let second = [
            bind.clone(),
            message(b'D', b"b1"),
            message(b'D', b"b2"),
            message(b'C', b"SELECT 2\0"),
            message(b'Z', b"I"),
        ]
        .concat();
        let third = [bind, message(b'D', b"c1"), message(b'C', b"SELECT 1\0")].concat();
        let stream = [first.clone(), second.clone(), third.clone()].concat();
        for sizes in [vec![1], vec![3, 0, 8], vec![1 << 20]] {
            let (mut tapped, tap) = Tapped::with_tap(Pieces::new(stream.clone(), sizes));
            let (a, b) = (
                Arc::new(Mutex::new(Collect::default())),
                Arc::new(Mutex::new(Collect::default())),
            );
            let armed = tap.arm_for(Divert::DataRows, vec![a.clone(), b.clone()]);
            let passed = read_all(&mut tapped).await;
            drop(armed);
            assert_eq!(lock(&a).0, b"a1");
            assert_eq!(lock(&b).0, b"b1b2");
            assert_eq!(tap.diverted(), 3);
            let without_rows = |m: &[u8], rows: usize| -> Vec<u8> {
                // Each row message is 7 bytes, right after the 5-byte BindComplete.
                [&m[..5], &m[5 + 7 * rows..]].concat()
            };
            assert_eq!(
                passed,
                [
                    without_rows(&first, 1),
                    without_rows(&second, 2),
                    third.clone()
                ]
                .concat()
            );
            // Both statements ended: the tap can be armed again.
            assert!(tap.arm(collect()).is_some());
        }
    }

    #[tokio::test]
    async fn a_copy_is_over_at_its_copy_done_even_when_the_rest_comes_later() {
        // tokio-postgres ends a COPY's stream at CopyDone; the reader disarms then, perhaps
        // before the tap has read CommandComplete. That must not spend the tap.
        let (head, data, tail) = copy_response(&[b"row"]);
        let upto_done = head.len() + data.len() + 5;
        let (mut tapped, tap) = Tapped::with_tap(Pieces::new(
            [head, data, tail].concat(),
            vec![upto_done, 1 << 20],
        ));
        let armed = tap.arm(collect()).unwrap();
        let mut first = vec![0; 1 << 20];
        let n = tapped.read(&mut first).await.unwrap();
        assert_eq!(first[n - 5], b'c', "the read ends with CopyDone");
        drop(armed);
        assert!(tap.arm(collect()).is_some());
    }

    #[tokio::test]
    async fn a_header_cut_short_by_the_end_of_the_stream_is_passed_on() {
        let mut stream = message(b'Z', b"I");
        stream.extend_from_slice(&[b'C', 0, 0]);
        let (mut tapped, tap) = Tapped::with_tap(Pieces::new(stream.clone(), vec![2]));
        let _armed = tap.arm(collect()).unwrap();
        assert_eq!(read_all(&mut tapped).await, stream);
    }

    #[tokio::test]
    async fn a_broken_length_passes_everything_on_from_there() {
        let mut stream = message(b'Z', b"I");
        stream.extend_from_slice(&[b'd', 0, 0, 0, 2, 1, 2, 3]);
        let (mut tapped, tap) = Tapped::with_tap(Pieces::new(stream.clone(), vec![4]));
        let _armed = tap.arm(collect()).unwrap();
        assert_eq!(read_all(&mut tapped).await, stream);
    }
}

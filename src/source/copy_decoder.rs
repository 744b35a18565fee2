//! The framing of PostgreSQL's binary COPY format (and of binary DataRow payloads, which lay
//! out one tuple each the same way), in one place for every reader: a [`CopyDecoder`] takes a
//! stream's messages as they arrive, checks its header, hands the complete tuples to what it
//! feeds (a [`Tuples`]: an Arrow batch, the heap reader's spill buckets, a pass's slots, a
//! table source's rows) where they lie in the wire bytes, keeps only an incomplete tuple for
//! the next message, and once the stream is over checks that it ended exactly at its end
//! marker.

use std::ops::Range;

use super::copy_tap::CopySink;
use super::rows::BatchBuilder;
use crate::error::{Error, Result};

/// The signature opening a binary COPY stream, followed by a 32-bit flags field and a 32-bit
/// header-extension length.
pub(super) const COPY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// What a binary COPY stream's tuples are handed to.
pub(super) trait Tuples {
    /// Takes the complete tuples at the front of `data` (which starts at a tuple or at the end
    /// marker) and says what it took; `op` names the read in errors.
    fn take(&mut self, op: &'static str, data: &[u8]) -> Result<Taken>;
}

/// What [`Tuples::take`] took from the front of its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Taken {
    /// Bytes taken (the end marker's two included).
    pub(super) used: usize,
    /// Tuples taken.
    pub(super) tuples: usize,
    /// Whether the end-of-data marker was reached.
    pub(super) end: bool,
}

/// Values appended straight to the batch's columns.
impl Tuples for BatchBuilder {
    fn take(&mut self, op: &'static str, data: &[u8]) -> Result<Taken> {
        decode_tuples(op, data, self)
    }
}

/// A binary COPY stream (or a statement's DataRow payloads) being framed into `T`, message by
/// message. Once a stream has ended and been checked ([`CopyDecoder::end_stream`]) the decoder
/// takes the next one (a reader runs one `COPY` per range into the same spill).
pub(super) struct CopyDecoder<T> {
    op: &'static str,
    /// Bytes of an incomplete header or tuple, waiting for the next message.
    buf: Vec<u8>,
    header: bool,
    ended: bool,
    /// DataRow payloads: tuples with no header and no end marker.
    rows_only: bool,
    tuples: usize,
    /// The first error met while fed as a [`CopySink`]; later data is dropped.
    error: Option<Error>,
    /// Where the tuples go.
    pub(super) into: T,
}

impl<T: Tuples> CopyDecoder<T> {
    /// A decoder of a binary `COPY … TO STDOUT` stream into `into`; `op` names the read in
    /// its errors.
    pub(super) fn new(op: &'static str, into: T) -> Self {
        Self {
            op,
            buf: Vec::new(),
            header: false,
            ended: false,
            rows_only: false,
            tuples: 0,
            error: None,
            into,
        }
    }

    /// A decoder of DataRow payloads (a binary-format query's rows, laid out as COPY tuples).
    pub(super) fn data_rows(op: &'static str, into: T) -> Self {
        Self {
            header: true,
            rows_only: true,
            ..Self::new(op, into)
        }
    }

    /// The read this decoder's errors name.
    pub(super) fn op(&self) -> &'static str {
        self.op
    }

    /// Tuples of the current stream taken so far.
    pub(super) fn tuples(&self) -> usize {
        self.tuples
    }

    /// Hands on the complete tuples `chunk` ends (and whatever was kept before it).
    pub(super) fn feed(&mut self, chunk: &[u8]) -> Result<()> {
        if self.ended && !chunk.is_empty() {
            return Err(Error::decode(
                self.op,
                "data after the end of a COPY stream",
            ));
        }
        if self.header && self.buf.is_empty() {
            // The usual case (PostgreSQL sends each tuple in a message of its own): the tuples
            // are taken where they lie, and only an incomplete one is kept.
            let taken = self.into.take(self.op, chunk)?;
            self.record(taken, chunk.len())?;
            self.buf.extend_from_slice(&chunk[taken.used..]);
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        let mut at = 0;
        if !self.header {
            match copy_header_len(self.op, &self.buf)? {
                Some(len) => (at, self.header) = (len, true),
                None => return Ok(()),
            }
        }
        let taken = self.into.take(self.op, &self.buf[at..])?;
        self.record(taken, self.buf.len() - at)?;
        self.buf.drain(..at + taken.used);
        Ok(())
    }

    /// Counts what `take` took from `len` bytes; the end marker must end the stream (and
    /// DataRow payloads have none).
    fn record(&mut self, taken: Taken, len: usize) -> Result<()> {
        self.tuples += taken.tuples;
        if taken.end {
            if self.rows_only {
                return Err(Error::decode(self.op, "a data row has a field count of -1"));
            }
            if taken.used < len {
                return Err(Error::decode(
                    self.op,
                    "data after the end of a COPY stream",
                ));
            }
            self.ended = true;
        }
        Ok(())
    }

    /// The first error met while fed as a [`CopySink`], if any (taken).
    pub(super) fn take_error(&mut self) -> Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }

    /// Checks that the stream ended exactly at its end-of-data marker (DataRow payloads: at
    /// the end of a row), or returns the first error met; on success readies the decoder for
    /// the next stream and returns the stream's tuples.
    pub(super) fn end_stream(&mut self) -> Result<usize> {
        self.take_error()?;
        if !(self.ended || self.rows_only) || !self.buf.is_empty() {
            let what = if self.rows_only {
                "binary data rows ended inside a row"
            } else {
                "binary COPY stream ended early"
            };
            return Err(Error::decode(
                self.op,
                format!("{what} ({} bytes left)", self.buf.len()),
            ));
        }
        self.header = self.rows_only;
        self.ended = false;
        Ok(std::mem::take(&mut self.tuples))
    }
}

/// A tap's sink: the first error is kept for [`CopyDecoder::end_stream`] and later data is
/// dropped.
impl<T: Tuples + Send> CopySink for CopyDecoder<T> {
    fn copy_data(&mut self, bytes: &[u8]) {
        if self.error.is_none()
            && let Err(e) = self.feed(bytes)
        {
            self.error = Some(e);
        }
    }
}

/// Tuples handed one at a time to a function, with where each field lies in them.
pub(super) struct EachTuple<F> {
    fields: usize,
    ranges: Vec<Option<Range<usize>>>,
    each: F,
}

impl<F: FnMut(&[u8], &[Option<Range<usize>>]) -> Result<()>> EachTuple<F> {
    /// Hands each tuple of `fields` fields to `each`: its bytes and where each field lies in
    /// them (`None`: NULL).
    pub(super) fn new(fields: usize, each: F) -> Self {
        Self {
            fields,
            ranges: Vec::with_capacity(fields),
            each,
        }
    }
}

impl<F: FnMut(&[u8], &[Option<Range<usize>>]) -> Result<()>> Tuples for EachTuple<F> {
    fn take(&mut self, op: &'static str, data: &[u8]) -> Result<Taken> {
        take_each(op, data, self.fields, &mut self.ranges, &mut self.each)
    }
}

/// Takes the complete tuples of `fields` fields at the front of `data`, handing each to
/// `each` with where its fields lie in it (`ranges`, reused: `None` is NULL).
pub(super) fn take_each(
    op: &'static str,
    data: &[u8],
    fields: usize,
    ranges: &mut Vec<Option<Range<usize>>>,
    mut each: impl FnMut(&[u8], &[Option<Range<usize>>]) -> Result<()>,
) -> Result<Taken> {
    let mut taken = Taken::default();
    loop {
        let rest = &data[taken.used..];
        match copy_tuple(op, rest, fields, ranges)? {
            None => return Ok(taken),
            Some(CopyItem::End) => {
                taken.used += 2;
                taken.end = true;
                return Ok(taken);
            }
            Some(CopyItem::Tuple(len)) => {
                each(&rest[..len], ranges)?;
                taken.used += len;
                taken.tuples += 1;
            }
        }
    }
}

/// Decodes the complete tuples at the front of `data` into `into`; `op` names the read in
/// errors.
pub(super) fn decode_tuples(
    op: &'static str,
    data: &[u8],
    into: &mut BatchBuilder,
) -> Result<Taken> {
    fn field_len(data: &[u8], at: usize) -> Option<i32> {
        let b = data.get(at..at + 4)?;
        Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    let mut taken = Taken::default();
    loop {
        let data = &data[taken.used..];
        let Some(count) = data.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
            return Ok(taken);
        };
        if count == -1 {
            taken.used += 2;
            taken.end = true;
            return Ok(taken);
        }
        if usize::try_from(count).ok() != Some(into.builders.len()) {
            return Err(Error::decode(
                op,
                format!(
                    "a binary tuple has {count} fields, expected {}",
                    into.builders.len()
                ),
            ));
        }
        // Only a complete tuple is decoded, so no column is ever left one value short.
        let mut end = 2;
        for _ in 0..into.builders.len() {
            let Some(len) = field_len(data, end) else {
                return Ok(taken);
            };
            end += 4 + usize::try_from(len).unwrap_or(0);
        }
        if data.len() < end {
            return Ok(taken);
        }
        let mut at = 2;
        for b in into.builders.iter_mut() {
            let len = field_len(data, at).unwrap_or(-1);
            at += 4;
            match usize::try_from(len) {
                Ok(n) => {
                    b.push_binary(data.get(at..at + n))?;
                    at += n;
                }
                Err(_) => b.push_binary(None)?,
            }
        }
        taken.used += end;
        taken.tuples += 1;
    }
}

/// The length of a binary COPY stream's header, once `b` holds all of it.
fn copy_header_len(op: &'static str, b: &[u8]) -> Result<Option<usize>> {
    if b.len() < COPY_SIGNATURE.len() + 8 {
        return Ok(None);
    }
    if !b.starts_with(COPY_SIGNATURE) {
        return Err(Error::decode(op, "not a binary COPY stream"));
    }
    let ext = u32::from_be_bytes([b[15], b[16], b[17], b[18]]) as usize;
    Ok((b.len() >= 19 + ext).then_some(19 + ext))
}

/// What starts a binary COPY stream's bytes, after its header.
pub(super) enum CopyItem {
    /// A tuple of this many bytes.
    Tuple(usize),
    /// The end marker.
    End,
}

/// The tuple of `n` fields at the start of `b` (or the end marker), with where each field lies
/// in it in `fields` (`None`: NULL); `None` when `b` does not hold all of it yet.
pub(super) fn copy_tuple(
    op: &'static str,
    b: &[u8],
    n: usize,
    fields: &mut Vec<Option<Range<usize>>>,
) -> Result<Option<CopyItem>> {
    if b.len() < 2 {
        return Ok(None);
    }
    let count = i16::from_be_bytes([b[0], b[1]]);
    if count == -1 {
        return Ok(Some(CopyItem::End));
    }
    if usize::try_from(count).ok() != Some(n) {
        return Err(Error::decode(op, "a malformed tuple: field count"));
    }
    fields.clear();
    let mut at = 2;
    for _ in 0..n {
        let Some(len) = b.get(at..at + 4) else {
            return Ok(None);
        };
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        at += 4;
        match usize::try_from(len) {
            Ok(len) if b.len() >= at + len => {
                fields.push(Some(at..at + len));
                at += len;
            }
            Ok(_) => return Ok(None),
            Err(_) => fields.push(None),
        }
    }
    Ok(Some(CopyItem::Tuple(at)))
}

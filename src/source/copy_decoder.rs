//! The decoder of PostgreSQL's binary COPY format (and of binary DataRow payloads, which lay
//! out one tuple each the same way): tuples are decoded where they lie in the wire bytes and
//! appended to a [`BatchBuilder`]; only an incomplete tuple is kept for the next message.

use std::ops::Range;

use bytes::Buf;

use super::rows::BatchBuilder;
use crate::error::{Error, Result};

/// The signature opening a binary COPY stream, followed by a 32-bit flags field and a 32-bit
/// header-extension length.
pub(super) const COPY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// A binary COPY stream being decoded into a [`BatchBuilder`], message by message.
#[derive(Default)]
pub(super) struct CopyDecoder {
    /// Bytes of an incomplete header or tuple, waiting for the next message.
    buf: bytes::BytesMut,
    header: bool,
    ended: bool,
    /// DataRow payloads: tuples with no header and no end marker.
    rows_only: bool,
    pub(super) rows: usize,
}

impl CopyDecoder {
    /// A decoder of DataRow payloads (a binary-format query's rows, laid out as COPY tuples).
    pub(super) fn data_rows() -> Self {
        Self {
            header: true,
            rows_only: true,
            ..Self::default()
        }
    }

    /// Decodes the complete tuples `chunk` ends (and whatever `buf` held before it).
    pub(super) fn feed(&mut self, op: &str, chunk: &[u8], into: &mut BatchBuilder) -> Result<()> {
        if self.header && self.buf.is_empty() {
            // The usual case (PostgreSQL sends each tuple in a message of its own): the tuples
            // are decoded where they lie, and only an incomplete one is kept.
            let (used, n, end) = decode_tuples(chunk, into)?;
            self.rows += n;
            self.ended |= end;
            self.buf.extend_from_slice(&chunk[used..]);
            return self.check_end(op);
        }
        self.buf.extend_from_slice(chunk);
        if !self.header {
            let Some(ext) = self.buf.get(15..19) else {
                return Ok(());
            };
            let ext = u32::from_be_bytes([ext[0], ext[1], ext[2], ext[3]]) as usize;
            if self.buf.get(..11) != Some(COPY_SIGNATURE) {
                return Err(Error::decode(op, "not a binary COPY stream"));
            }
            if self.buf.len() < 19 + ext {
                return Ok(());
            }
            self.buf.advance(19 + ext);
            self.header = true;
        }
        let (used, n, end) = decode_tuples(&self.buf, into)?;
        self.buf.advance(used);
        self.rows += n;
        self.ended |= end;
        self.check_end(op)
    }

    /// Rows carry no end marker: a field count of -1 in one is a broken stream.
    fn check_end(&self, op: &str) -> Result<()> {
        if self.rows_only && self.ended {
            return Err(Error::decode(op, "a data row has a field count of -1"));
        }
        Ok(())
    }

    /// The tuples decoded, once the stream has ended exactly at its end-of-data marker (rows:
    /// at the end of a row).
    pub(super) fn finish(self, op: &str) -> Result<usize> {
        if !(self.ended || self.rows_only) || !self.buf.is_empty() {
            let what = if self.rows_only {
                "binary data rows ended inside a row"
            } else {
                "binary COPY stream ended early"
            };
            return Err(Error::decode(
                op,
                format!("{what} ({} bytes left)", self.buf.len()),
            ));
        }
        Ok(self.rows)
    }
}

/// Decodes the complete tuples at the front of `data` into `into`. Returns the bytes they
/// took, the tuples decoded and whether the end-of-data marker was reached.
pub(super) fn decode_tuples(data: &[u8], into: &mut BatchBuilder) -> Result<(usize, usize, bool)> {
    fn field_len(data: &[u8], at: usize) -> Option<i32> {
        let b = data.get(at..at + 4)?;
        Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    let mut rows = 0;
    let mut used = 0;
    loop {
        let data = &data[used..];
        let Some(count) = data.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
            return Ok((used, rows, false));
        };
        if count == -1 {
            return Ok((used + 2, rows, true));
        }
        if usize::try_from(count).ok() != Some(into.builders.len()) {
            return Err(Error::decode(
                "binary COPY tuple",
                format!("has {count} fields, expected {}", into.builders.len()),
            ));
        }
        // Only a complete tuple is decoded, so no column is ever left one value short.
        let mut end = 2;
        let mut complete = true;
        for _ in 0..into.builders.len() {
            match field_len(data, end) {
                None => {
                    complete = false;
                    break;
                }
                Some(len) => end += 4 + usize::try_from(len).unwrap_or(0),
            }
        }
        if !complete || data.len() < end {
            return Ok((used, rows, false));
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
        used += end;
        rows += 1;
    }
}

/// The length of a binary COPY stream's header, once `b` holds all of it.
pub(super) fn copy_header_len(op: &'static str, b: &[u8]) -> Result<Option<usize>> {
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

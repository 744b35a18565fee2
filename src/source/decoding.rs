//! The glue between a read and the COPY tap: a statement's rows are decoded into an Arrow batch
//! as they stream in, taken from the connection's tap when it is armed for them, or from
//! tokio-postgres's rows or COPY messages when it is not, so a read decodes the same either way.

use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, IsolationLevel, Row, Statement, Transaction};

use super::READ_TIMEOUT as TIMEOUT;
use super::connect::{timed, within};
use super::copy_decoder::CopyDecoder;
use super::copy_tap::{self, CopySink, CopyTap};
use super::rows::BatchBuilder;
use crate::error::{Error, Result};

/// Begins the read-only repeatable-read transaction a read runs in, so that every statement of
/// it sees one snapshot (a batch's selection and payload, a page's entities and EAV rows).
pub(super) async fn begin_snapshot<'a>(
    client: &'a mut Client,
    op: &'static str,
) -> Result<Transaction<'a>> {
    let start = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start();
    timed(TIMEOUT, op, start).await
}

/// Runs `statement` and decodes its rows into `decoding` as they stream in (no intermediate
/// row list), under the statement time limit. On a tapped connection armed for them, the rows
/// never reach tokio-postgres (the tap decodes them) and the stream only ends.
///
/// `statement` is prepared: a statement prepared here would send (and answer) more than one
/// request while the tap is armed for this one.
pub(super) async fn stream_into(
    tx: &Transaction<'_>,
    op: &'static str,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
    decoding: &Mutex<Decoding>,
) -> Result<()> {
    let read = async {
        let stream = tx
            .query_raw(statement, params.iter().map(|p| *p as &dyn ToSql))
            .await
            .map_err(Error::postgres(op))?;
        futures::pin_mut!(stream);
        while let Some(row) = stream.try_next().await.map_err(Error::postgres(op))? {
            copy_tap::lock(decoding).push_row(&row)?;
        }
        // The tap has passed CommandComplete on only after the rows before it: the rows
        // decoded either way must be the rows the server says it sent.
        let sent = stream.rows_affected();
        let decoded = {
            let mut decoding = copy_tap::lock(decoding);
            // A tuple the tap could not decode is the error, not the count it left short.
            decoding.take_error()?;
            decoding.rows()
        };
        if sent != Some(decoded as u64) {
            return Err(Error::decode(
                op,
                format!("the server sent {sent:?} rows, {decoded} were decoded"),
            ));
        }
        Ok(())
    };
    within(TIMEOUT, op, read).await
}

/// Runs `COPY (query) TO STDOUT (FORMAT binary)` and decodes its tuples into `into` as they
/// stream in — no row objects: each value is appended straight from the wire bytes, taken from
/// the connection's `tap` when it has one (or from tokio-postgres's messages when it has not).
/// COPY takes no parameters, so `query` may only embed values lakecdc formats itself (ids and
/// row ids). Returns the batch and the rows read.
pub(super) async fn copy_into(
    tx: &Transaction<'_>,
    tap: &CopyTap,
    op: &'static str,
    query: &str,
    into: BatchBuilder,
) -> Result<(BatchBuilder, usize)> {
    let decoding = Decoding::shared(CopyDecoder::new(op, into));
    copy_to_sink(tx, tap, op, query, &decoding).await?;
    copy_tap::lock(&decoding).finish()
}

/// Runs `COPY (query) TO STDOUT (FORMAT binary)` and hands its data to `sink`: through the
/// connection's `tap` when it has one, else from tokio-postgres's messages (under the
/// statement time limit). The sink checks what it was given once this returns.
pub(super) async fn copy_to_sink<S: CopySink + 'static>(
    tx: &Transaction<'_>,
    tap: &CopyTap,
    op: &'static str,
    query: &str,
    sink: &Arc<Mutex<S>>,
) -> Result<()> {
    let sql = format!("COPY ({query}) TO STDOUT (FORMAT binary)");
    let read = async {
        let armed = tap.arm(sink.clone());
        let stream = tx
            .copy_out(sql.as_str())
            .await
            .map_err(Error::postgres(op))?;
        futures::pin_mut!(stream);
        while let Some(chunk) = stream.try_next().await.map_err(Error::postgres(op))? {
            copy_tap::lock(sink).copy_data(&chunk);
        }
        // The stream has ended: the tap passed CopyDone on only after the data before it.
        drop(armed);
        Ok(())
    };
    within(TIMEOUT, op, read).await
}

/// A statement's rows being decoded into a batch: binary COPY data or binary DataRow payloads
/// from a connection's tap, or rows from tokio-postgres. Shared between the reader and the tap.
pub(super) struct Decoding {
    decoder: CopyDecoder<BatchBuilder>,
    /// Rows that came as tokio-postgres rows.
    pushed: usize,
}

impl Decoding {
    pub(super) fn shared(decoder: CopyDecoder<BatchBuilder>) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self { decoder, pushed: 0 }))
    }

    /// The first error the tap's data met, if any (taken).
    pub(super) fn take_error(&mut self) -> Result<()> {
        self.decoder.take_error()
    }

    /// Rows decoded so far, either way.
    pub(super) fn rows(&self) -> usize {
        self.decoder.tuples() + self.pushed
    }

    /// Appends a row tokio-postgres parsed (an untapped connection).
    pub(super) fn push_row(&mut self, row: &Row) -> Result<()> {
        self.decoder.into.push(row)?;
        self.pushed += 1;
        Ok(())
    }

    /// The batch and the rows decoded, or the first error. Leaves an empty batch behind.
    pub(super) fn finish(&mut self) -> Result<(BatchBuilder, usize)> {
        let rows = self.decoder.end_stream()? + self.pushed;
        Ok((
            std::mem::replace(&mut self.decoder.into, BatchBuilder::new(&[], 0)),
            rows,
        ))
    }
}

impl CopySink for Decoding {
    fn copy_data(&mut self, bytes: &[u8]) {
        self.decoder.copy_data(bytes);
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;

    use super::*;
    use crate::schema::SlotType;
    use crate::source::copy_decoder::{COPY_SIGNATURE, decode_tuples};
    use crate::source::rows::row_id_at;
    use uuid::Uuid;

    /// One binary COPY tuple of (uuid, bigint, text).
    fn tuple(id: u128, n: Option<i64>, s: Option<&str>) -> Vec<u8> {
        let mut t = 3i16.to_be_bytes().to_vec();
        t.extend(16i32.to_be_bytes());
        t.extend(id.to_be_bytes());
        match n {
            Some(n) => {
                t.extend(8i32.to_be_bytes());
                t.extend(n.to_be_bytes());
            }
            None => t.extend((-1i32).to_be_bytes()),
        }
        match s {
            Some(s) => {
                t.extend(i32::try_from(s.len()).unwrap().to_be_bytes());
                t.extend(s.as_bytes());
            }
            None => t.extend((-1i32).to_be_bytes()),
        }
        t
    }

    fn builder() -> BatchBuilder {
        BatchBuilder::new(
            &[
                ("id", SlotType::Uuid, false),
                ("n", SlotType::Bigint, true),
                ("s", SlotType::Text, true),
            ],
            4,
        )
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_even_when_the_column_s_bytes_are() {
        let text = |values: &[&[u8]]| {
            let mut into = builder();
            for (i, v) in values.iter().enumerate() {
                let mut t = tuple(i as u128, None, Some("")).to_vec();
                t.truncate(t.len() - 4);
                t.extend(i32::try_from(v.len()).unwrap().to_be_bytes());
                t.extend(*v);
                assert_eq!(decode_tuples("test", &t, &mut into).unwrap().tuples, 1);
            }
            into.finish()
        };
        let ok = text(&["é".as_bytes(), b"", "∑x".as_bytes()]).unwrap();
        let s = ok.column(2).as_string::<i32>();
        assert_eq!((s.value(0), s.value(1), s.value(2)), ("é", "", "∑x"));
        let err = text(&[b"a", &[0xff]]).unwrap_err().to_string();
        assert!(err.contains("column s: text is not UTF-8"), "{err}");
        // Each value alone is invalid, though together they spell "é": still refused.
        assert!(text(&[&[0xc3], &[0xa9]]).is_err());
    }

    #[test]
    fn data_rows_decode_whatever_the_chunking_and_refuse_an_end_marker_or_a_cut_row() {
        let rows = [tuple(1, Some(7), Some("x")), tuple(2, None, None)].concat();
        for n in [1, 5, rows.len()] {
            let mut decoder = CopyDecoder::data_rows("rows", builder());
            for piece in rows.chunks(n) {
                decoder.feed(piece).unwrap();
            }
            assert_eq!(decoder.end_stream().unwrap(), 2, "pieces of {n}");
            assert_eq!(
                row_id_at(&decoder.into.finish().unwrap(), 1).unwrap(),
                Uuid::from_u128(2)
            );
        }
        let mut decoder = CopyDecoder::data_rows("rows", builder());
        let err = decoder.feed(&(-1i16).to_be_bytes());
        assert!(err.unwrap_err().to_string().contains("field count of -1"));
        let mut decoder = CopyDecoder::data_rows("rows", builder());
        decoder.feed(&rows[..rows.len() - 1]).unwrap();
        let err = decoder.end_stream().unwrap_err().to_string();
        assert!(err.contains("ended inside a row"), "{err}");
    }

    #[test]
    fn binary_copy_tuples_decode_whatever_the_chunking() {
        // Header (signature, flags, a 3-byte extension), three tuples, the end marker.
        let mut header = COPY_SIGNATURE.to_vec();
        header.extend(0u32.to_be_bytes());
        header.extend(3u32.to_be_bytes());
        header.extend([9, 9, 9]);
        let mut end = tuple(3, Some(i64::MAX), None);
        end.extend((-1i16).to_be_bytes());
        // One message per tuple, as PostgreSQL sends them.
        let tuples = vec![
            header,
            tuple(1, Some(-5), Some("ä,\"x\"\n")),
            tuple(2, None, Some("")),
            end,
        ];
        let stream = tuples.concat();
        // Also messages of 1, 3 and 7 bytes, and everything at once.
        let chunkings: Vec<Vec<Vec<u8>>> = [1, 3, 7, stream.len()]
            .iter()
            .map(|n| stream.chunks(*n).map(<[u8]>::to_vec).collect())
            .chain([tuples])
            .collect();
        for (i, messages) in chunkings.iter().enumerate() {
            let mut decoder = CopyDecoder::new("test", builder());
            for m in messages {
                decoder.feed(m).unwrap();
            }
            assert_eq!(decoder.end_stream().unwrap(), 3, "chunking {i}");
            let b = decoder.into.finish().unwrap();
            assert_eq!(row_id_at(&b, 2).unwrap(), Uuid::from_u128(3));
            let n = b.column(1).as_primitive::<Int64Type>();
            assert_eq!((n.value(0), n.is_null(1), n.value(2)), (-5, true, i64::MAX));
            let s = b.column(2).as_string::<i32>();
            assert_eq!(
                (s.value(0), s.value(1), s.is_null(2)),
                ("ä,\"x\"\n", "", true)
            );
            assert!(s.is_valid(1), "an empty string is not NULL");
        }
        // A stream cut short, or with bytes after its end marker, is an error.
        let mut decoder = CopyDecoder::new("test", builder());
        decoder.feed(&stream[..stream.len() - 2]).unwrap();
        let err = decoder.end_stream().unwrap_err().to_string();
        assert!(err.contains("ended early (0 bytes left)"), "{err}");
        let mut longer = stream.clone();
        longer.push(0);
        let mut decoder = CopyDecoder::new("test", builder());
        let err = decoder.feed(&longer).unwrap_err().to_string();
        assert!(err.contains("data after the end"), "{err}");
        // Also when the extra bytes come in a message of their own; fed as a tap's sink, the
        // first error is kept for the stream's end.
        let mut decoder = CopyDecoder::new("test", builder());
        decoder.copy_data(&stream);
        decoder.copy_data(&[0]);
        let err = decoder.end_stream().unwrap_err().to_string();
        assert!(err.contains("data after the end"), "{err}");
    }

    #[test]
    fn a_row_the_tap_could_not_decode_is_the_error_not_a_short_count() {
        let decoding = Decoding::shared(CopyDecoder::data_rows("read the rows", builder()));
        let mut d = copy_tap::lock(&decoding);
        d.copy_data(&tuple(1, Some(1), None));
        // A row of two fields where three are expected; later data is dropped.
        d.copy_data(&2i16.to_be_bytes());
        d.copy_data(&tuple(2, None, None));
        assert_eq!(d.rows(), 1);
        let e = d.take_error().unwrap_err().to_string();
        assert!(e.contains("has 2 fields, expected 3"), "{e}");
        assert!(e.contains("read the rows"), "the error names the read: {e}");
        assert!(d.take_error().is_ok(), "the error is taken once");
    }

    #[test]
    fn a_tuple_of_the_wrong_shape_is_an_error_not_a_shifted_column() {
        assert!(decode_tuples("test", &2i16.to_be_bytes(), &mut builder()).is_err());
        let mut t = tuple(1, Some(1), None);
        t[2..6].copy_from_slice(&4i32.to_be_bytes()); // a 4-byte "uuid"
        t.drain(10..22);
        assert!(decode_tuples("test", &t, &mut builder()).is_err());
    }
}

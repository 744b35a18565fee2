//! Uploading an object while it is being written (docs/design.md §9, the consolidated delta):
//! the writer hands its bytes over in parts of at least [`PART_BYTES`] through a bounded
//! channel, and [`ObjectStore::put_parts`](super::ObjectStore::put_parts) stores them as one
//! object. Nothing of the object is kept on local disk, and at most a few parts are in memory
//! (the one being filled, one in the channel, those being sent).
//!
//! The writer ends the object with [`Part::End`]; a channel that closes without it (the writer
//! failed or was dropped) abandons the upload: nothing is stored, and the store answers
//! [`StoreError::Unfinished`].

use std::io::Write;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::StoreError;

/// The smallest part a [`PartWriter`] hands over (all but the last): above S3's 5 MiB
/// minimum for a multipart upload's parts.
pub const PART_BYTES: usize = 8 * 1024 * 1024;

/// What a streamed upload receives, in order.
#[derive(Debug)]
pub enum Part {
    /// The next bytes of the object.
    Bytes(Bytes),
    /// The object is complete.
    End,
}

/// The receiving end of a streamed upload.
pub type Parts = mpsc::Receiver<Part>;

/// A channel for one streamed upload: the writer's end and the store's.
pub fn channel() -> (PartWriter, Parts) {
    let (tx, rx) = mpsc::channel(1);
    (
        PartWriter {
            buf: Vec::with_capacity(PART_BYTES),
            tx,
            part_bytes: PART_BYTES,
        },
        rx,
    )
}

/// An [`std::io::Write`] that hands what is written to a streamed upload, in parts of at
/// least [`PART_BYTES`] bytes. Writes block while the upload is behind (a full channel), so
/// it must be used from a blocking thread, never from async code. A write after the upload
/// stopped fails.
#[derive(Debug)]
pub struct PartWriter {
    buf: Vec<u8>,
    tx: mpsc::Sender<Part>,
    part_bytes: usize,
}

impl PartWriter {
    /// Hands over the last bytes and ends the object.
    pub fn end(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.send_buffer()?;
        }
        self.send(Part::End)
    }

    fn send_buffer(&mut self) -> std::io::Result<()> {
        let part = std::mem::replace(&mut self.buf, Vec::with_capacity(self.part_bytes));
        self.send(Part::Bytes(Bytes::from(part)))
    }

    fn send(&self, part: Part) -> std::io::Result<()> {
        self.tx.blocking_send(part).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the upload stopped before the object was written",
            )
        })
    }
}

impl Write for PartWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= self.part_bytes {
            self.send_buffer()?;
        }
        Ok(bytes.len())
    }

    /// Does nothing: a part is handed over only once it is large enough (a store refuses
    /// small parts but the last).
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The next part of `parts`: its bytes, `None` at [`Part::End`], or
/// [`StoreError::Unfinished`] when the writer hung up without ending the object.
pub async fn next(parts: &mut Parts) -> Result<Option<Bytes>, StoreError> {
    match parts.recv().await {
        Some(Part::Bytes(b)) => Ok(Some(b)),
        Some(Part::End) => Ok(None),
        None => Err(StoreError::Unfinished),
    }
}

/// The whole object `parts` yields, for a backend that stores it in one write.
pub async fn collect(mut parts: Parts) -> Result<Bytes, StoreError> {
    let mut all = Vec::new();
    while let Some(b) = next(&mut parts).await? {
        all.extend_from_slice(&b);
    }
    Ok(Bytes::from(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(part_bytes: usize) -> (PartWriter, Parts) {
        let (mut w, rx) = channel();
        w.part_bytes = part_bytes;
        (w, rx)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parts_are_at_least_the_part_size_but_the_last_and_keep_every_byte() {
        let (mut w, mut rx) = small(10);
        let writer = tokio::task::spawn_blocking(move || {
            for i in 0..7u8 {
                w.write_all(&[i; 4]).unwrap();
            }
            w.flush().unwrap();
            w.end().unwrap();
        });
        let mut parts = Vec::new();
        while let Some(b) = next(&mut rx).await.unwrap() {
            parts.push(b);
        }
        writer.await.unwrap();
        let sizes: Vec<usize> = parts.iter().map(Bytes::len).collect();
        assert_eq!(sizes, vec![12, 12, 4]);
        let all: Vec<u8> = parts.concat();
        let want: Vec<u8> = (0..7u8).flat_map(|i| [i; 4]).collect();
        assert_eq!(all, want);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_dropped_without_ending_abandons_the_object() {
        let (mut w, rx) = small(4);
        let writer = tokio::task::spawn_blocking(move || {
            w.write_all(b"abcdef").unwrap();
            drop(w);
        });
        writer.await.unwrap();
        assert!(matches!(collect(rx).await, Err(StoreError::Unfinished)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_after_the_upload_stopped_fails() {
        let (mut w, rx) = small(4);
        drop(rx);
        let err = tokio::task::spawn_blocking(move || w.write_all(b"abcdef").unwrap_err())
            .await
            .unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn collect_gathers_every_part_in_order() {
        let (mut w, rx) = small(3);
        tokio::task::spawn_blocking(move || {
            w.write_all(b"hello world").unwrap();
            w.end().unwrap();
        });
        assert_eq!(&collect(rx).await.unwrap()[..], b"hello world");
    }
}

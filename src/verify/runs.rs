//! Sorting the source's live versions when they are read in heap order (docs/design.md §4.9):
//! each chunk is sorted into a run; runs are held in memory up to [`MEMORY_ROWS`] rows and
//! spilled to the run's private scratch directory beyond (24 bytes a row), then merged in
//! `row_id` order. Memory stays bounded whatever the table's size; scratch disk is 24 bytes a
//! row past the first few million.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Rows held in memory before the runs are spilled (96 MiB).
pub(super) const MEMORY_ROWS: usize = 4 << 20;

/// Rows per merged chunk handed on.
const CHUNK_ROWS: usize = 64 * 1024;

/// One row: id and version.
type Row = (u128, i64);

/// Sorted runs, in memory or spilled.
#[derive(Debug)]
pub(super) struct Runs {
    dir: PathBuf,
    memory: Vec<Vec<Row>>,
    held: usize,
    files: Vec<PathBuf>,
}

impl Runs {
    /// Runs spilled (when they are) into `dir`, the run's private scratch directory.
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            memory: Vec::new(),
            held: 0,
            files: Vec::new(),
        }
    }

    /// Adds a chunk of rows in any order.
    pub(super) fn push(&mut self, mut rows: Vec<Row>) -> Result<()> {
        rows.sort_unstable_by_key(|r| r.0);
        self.held += rows.len();
        self.memory.push(rows);
        if self.held > MEMORY_ROWS {
            for run in std::mem::take(&mut self.memory) {
                self.spill(&run)?;
            }
            self.held = 0;
        }
        Ok(())
    }

    fn spill(&mut self, run: &[Row]) -> Result<()> {
        let path = self
            .dir
            .join(format!("versions-{}.run", uuid::Uuid::new_v4()));
        let io = |source| Error::Io {
            op: "spill sorted versions to",
            path: path.clone(),
            source,
        };
        let free = crate::job::available_bytes(&self.dir).map_err(io)?;
        crate::job::check_work_dir_space(
            &self.dir,
            "verify --source (sorted runs of the source's versions)",
            run.len() as u64 * 24,
            free,
        )?;
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io)?;
        let mut w = BufWriter::with_capacity(crate::scratch::WRITE_PIECE, file);
        for (id, v) in run {
            w.write_all(&id.to_be_bytes()).map_err(io)?;
            w.write_all(&v.to_le_bytes()).map_err(io)?;
        }
        w.flush().map_err(io)?;
        self.files.push(path);
        Ok(())
    }

    /// Merges every run in `row_id` order into chunks handed to `each` (which returns `false`
    /// to stop). Spilled runs are removed as they are read to the end.
    pub(super) fn merge(self, mut each: impl FnMut(Vec<Row>) -> bool) -> Result<()> {
        let mut sources: Vec<Source> = self
            .memory
            .into_iter()
            .map(|run| Source::Memory(run.into_iter()))
            .collect();
        for path in &self.files {
            let file = File::open(path).map_err(|source| Error::Io {
                op: "read sorted versions from",
                path: path.clone(),
                source,
            })?;
            sources.push(Source::File(BufReader::with_capacity(256 * 1024, file)));
        }
        let mut heap = BinaryHeap::with_capacity(sources.len());
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some((id, v)) = s.next()? {
                heap.push(Reverse((id, v, i)));
            }
        }
        let mut chunk = Vec::with_capacity(CHUNK_ROWS);
        while let Some(Reverse((id, v, i))) = heap.pop() {
            chunk.push((id, v));
            if let Some((id, v)) = sources[i].next()? {
                heap.push(Reverse((id, v, i)));
            }
            if chunk.len() == CHUNK_ROWS && !each(std::mem::take(&mut chunk)) {
                break;
            }
        }
        if !chunk.is_empty() {
            each(chunk);
        }
        for path in &self.files {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }
}

enum Source {
    Memory(std::vec::IntoIter<Row>),
    File(BufReader<File>),
}

impl Source {
    fn next(&mut self) -> Result<Option<Row>> {
        match self {
            Source::Memory(it) => Ok(it.next()),
            Source::File(r) => {
                let mut buf = [0u8; 24];
                match r.read_exact(&mut buf) {
                    Ok(()) => {
                        let mut id = [0u8; 16];
                        let mut v = [0u8; 8];
                        id.copy_from_slice(&buf[..16]);
                        v.copy_from_slice(&buf[16..]);
                        Ok(Some((u128::from_be_bytes(id), i64::from_le_bytes(v))))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
                    Err(source) => Err(Error::Io {
                        op: "read sorted versions",
                        path: PathBuf::new(),
                        source,
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_in_memory_and_spilled_merge_in_row_id_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut runs = Runs::new(dir.path());
        // Three chunks in heap order; a tiny memory budget is simulated by spilling directly.
        let mut all = Vec::new();
        let mut x: u64 = 7;
        for chunk in 0..3 {
            let rows: Vec<Row> = (0..1000)
                .map(|i| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (u128::from(x) << 64 | (chunk * 1000 + i), i as i64)
                })
                .collect();
            all.extend(rows.clone());
            runs.push(rows).unwrap();
        }
        let spilled = runs.memory.pop().unwrap();
        runs.spill(&spilled).unwrap();
        assert_eq!(runs.files.len(), 1);
        all.sort_unstable();
        let mut merged = Vec::new();
        runs.merge(|c| {
            merged.extend(c);
            true
        })
        .unwrap();
        assert_eq!(merged, all);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "spills removed"
        );
    }
}

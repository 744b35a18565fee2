//! The content-addressed cache of an S3 lake's files (docs/design.md §4.8). A file is stored as
//! `<sha256 hex>.parquet` only after the bytes downloaded hashed to the manifest's checksum and
//! sized to its size, so a name is a proof: every byte a query reads was checked. A download
//! goes to a fresh `.tmp-<uuid>` file in the same directory and is renamed into place, so a
//! crash or a mismatch never leaves a file under a checksum's name.
//!
//! The directory is this user's alone (0700, refused when another user owns it or may write
//! it: docs/security.md). Queries hold a shared `flock` on `.lock` while they read; eviction
//! (least recently used first, by modification time, which a hit refreshes) runs only when the
//! lock can be taken exclusively, so no running query loses a file it is about to read.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::FlockOperation;

use crate::error::{Error, Result};
use crate::store::ObjectStore;

/// Temp files older than this are a crashed download's: removed by eviction.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// An open cache directory, shared-locked for the life of the value.
#[derive(Debug)]
pub(crate) struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    lock: File,
}

/// What one eviction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Evicted {
    /// Files removed.
    pub(crate) files: usize,
    /// Bytes left in the cache.
    pub(crate) bytes_left: u64,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

impl Cache {
    /// Opens (creating, mode 0700) the cache at `dir` and takes its shared lock. Refuses a
    /// directory another user owns or may write, one that is a symbolic link, and one under a
    /// directory another user could swap it in (docs/security.md, "The host").
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> Result<Self> {
        if let Ok(m) = fs::symlink_metadata(dir) {
            let why = if m.file_type().is_symlink() {
                Some("is a symbolic link: give the directory it leads to")
            } else if !m.is_dir() {
                Some("exists and is not a directory: choose another")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::setting(
                    "cache-dir",
                    format!("{} {why} as --cache-dir", dir.display()),
                ));
            }
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(crate::scratch::DIR_MODE)
            .create(dir)
            .map_err(io_err("create the cache directory", dir))?;
        let meta = fs::symlink_metadata(dir).map_err(io_err("read the cache directory", dir))?;
        let me = rustix::process::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & 0o022 != 0 {
            return Err(Error::setting(
                "cache-dir",
                format!(
                    "{} must be a directory of this user that no other user may write (chmod 700 it, or choose another --cache-dir)",
                    dir.display()
                ),
            ));
        }
        crate::job::refuse_untrusted("cache-dir", dir, false)?;
        let lock_path = dir.join(".lock");
        let lock = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err("open the cache lock", &lock_path))?;
        rustix::fs::flock(&lock, FlockOperation::LockShared)
            .map_err(|e| io_err("lock the cache", &lock_path)(e.into()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            max_bytes,
            lock,
        })
    }

    /// Where the file of checksum `hex` lives.
    pub(crate) fn path_of(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("{hex}.parquet"))
    }

    /// The cached file of `hex` when it is there with `size` bytes (refreshing its place in
    /// the LRU order); with `rehash`, only when its bytes still hash to `hex`.
    pub(crate) fn hit(&self, hex: &str, size: u64, rehash: bool) -> Result<Option<PathBuf>> {
        let path = self.path_of(hex);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("read a cached file", &path)(e)),
        };
        if !meta.is_file() || meta.len() != size {
            // Not what this name promises: drop it and download again.
            fs::remove_file(&path).map_err(io_err("remove a bad cached file", &path))?;
            return Ok(None);
        }
        let file = File::open(&path).map_err(io_err("open a cached file", &path))?;
        if rehash && hash_file(&file).map_err(io_err("hash a cached file", &path))? != hex {
            fs::remove_file(&path).map_err(io_err("remove a bad cached file", &path))?;
            return Ok(None);
        }
        file.set_modified(SystemTime::now())
            .map_err(io_err("touch a cached file", &path))?;
        Ok(Some(path))
    }

    /// Downloads `key` (at most `size` bytes), and files it under `hex` when its size and
    /// SHA-256 match; otherwise an error naming the object, with nothing cached.
    pub(crate) async fn fetch(
        &self,
        store: &dyn ObjectStore,
        key: &str,
        hex: &str,
        size: u64,
    ) -> Result<PathBuf> {
        let tmp = Partial(self.dir.join(format!(".tmp-{}", uuid::Uuid::new_v4())));
        let got = store.get_to_file_within(key, &tmp.0, size).await;
        let checked = match got {
            Ok(d) if d.size == size && hex::encode(d.sha256) == hex => Ok(()),
            Ok(d) => Err(Error::Unverified {
                key: key.to_string(),
                message: format!(
                    "read {} bytes with sha256 {}, but the manifest says {size} bytes with sha256 {hex}",
                    d.size,
                    hex::encode(d.sha256)
                ),
            }),
            Err(source) => Err(Error::Storage {
                op: "download",
                key: key.to_string(),
                source,
            }),
        };
        checked?;
        let path = self.path_of(hex);
        fs::rename(&tmp.0, &path).map_err(io_err("file a download in the cache", &path))?;
        Ok(path)
    }

    /// Removes the least recently used files (never one in `keep`) until the cache holds at
    /// most `budget` bytes, when no other query holds the cache; the shared lock is kept.
    pub(crate) fn evict(&self, budget: u64, keep: &BTreeSet<PathBuf>) -> Result<Evicted> {
        let lock_path = self.dir.join(".lock");
        let exclusive = FlockOperation::NonBlockingLockExclusive;
        if rustix::fs::flock(&self.lock, exclusive).is_err() {
            tracing::debug!(cache = %self.dir.display(), "another query holds the cache: no eviction");
            return Ok(Evicted::default());
        }
        let result = self.evict_locked(budget, keep);
        rustix::fs::flock(&self.lock, FlockOperation::LockShared)
            .map_err(|e| io_err("lock the cache", &lock_path)(e.into()))?;
        result
    }

    fn evict_locked(&self, budget: u64, keep: &BTreeSet<PathBuf>) -> Result<Evicted> {
        let read = fs::read_dir(&self.dir).map_err(io_err("list the cache", &self.dir))?;
        let mut files = Vec::new();
        let mut total = 0u64;
        let now = SystemTime::now();
        for entry in read {
            let entry = entry.map_err(io_err("list the cache", &self.dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(meta) = entry.metadata() else { continue };
            let modified = meta.modified().unwrap_or(now);
            if name.starts_with(".tmp-") {
                if now.duration_since(modified).unwrap_or_default() > STALE_TMP {
                    let _ = fs::remove_file(&path);
                }
                continue;
            }
            if !meta.is_file() || !is_cache_name(&name) {
                continue;
            }
            total = total.saturating_add(meta.len());
            files.push((modified, meta.len(), path));
        }
        files.sort();
        let mut evicted = Evicted::default();
        for (_, len, path) in files {
            if total <= budget {
                break;
            }
            if keep.contains(&path) {
                continue;
            }
            fs::remove_file(&path).map_err(io_err("evict a cached file", &path))?;
            total = total.saturating_sub(len);
            evicted.files += 1;
        }
        evicted.bytes_left = total;
        Ok(evicted)
    }

    /// The configured ceiling.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

/// A download in progress: removed unless renamed into place, also when the download is
/// abandoned (a sibling download failed and the query stopped waiting for this one).
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        // After a successful rename there is nothing left to remove.
        let _ = fs::remove_file(&self.0);
    }
}

/// `<64 hex>.parquet`: the only names eviction ever removes.
fn is_cache_name(name: &str) -> bool {
    name.strip_suffix(".parquet")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// SHA-256 of a file's bytes, as hex.
pub(crate) fn hash_file(mut file: &File) -> io::Result<String> {
    let (_, sha256) = crate::store::copy_hashing(&mut file, &mut io::sink())?;
    Ok(hex::encode(sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_or_foreign_directory_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = Cache::open(&open, 1).unwrap_err().to_string();
        assert!(e.contains("no other user may write"), "{e}");
        // A private directory under one others may write without the sticky bit: they
        // could rename it away and put theirs in its place.
        let e = Cache::open(&open.join("c"), 1).unwrap_err().to_string();
        assert!(
            e.contains("writable by others without the sticky bit") && e.starts_with("cache-dir"),
            "{e}"
        );
        // A file there, or a link, is a setting to fix (exit 2), named.
        let file = t.path().join("file");
        fs::write(&file, b"x").unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        for (p, why) in [(&file, "not a directory"), (&link, "symbolic link")] {
            let e = Cache::open(p, 1).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
            assert_eq!(e.exit_code(), 2);
        }
        let made = t.path().join("a/b");
        Cache::open(&made, 1).unwrap();
        assert_eq!(
            fs::metadata(&made).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn eviction_removes_the_least_recently_used_first_and_spares_kept_files() {
        let t = tempfile::tempdir().unwrap();
        let cache = Cache::open(t.path(), 25).unwrap();
        let names: Vec<PathBuf> = (0..4)
            .map(|i| cache.path_of(&format!("{i:064x}")))
            .collect();
        for (i, p) in names.iter().enumerate() {
            fs::write(p, [0u8; 10]).unwrap();
            let f = File::open(p).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + i as u64))
                .unwrap();
        }
        fs::write(t.path().join("other.txt"), [0u8; 100]).unwrap();
        let keep = BTreeSet::from([names[0].clone()]);
        let e = cache.evict(25, &keep).unwrap();
        assert_eq!(
            e,
            Evicted {
                files: 2,
                bytes_left: 20
            }
        );
        let left: Vec<bool> = names.iter().map(|p| p.exists()).collect();
        assert_eq!(left, [true, false, false, true]);
        assert!(t.path().join("other.txt").exists());
    }
}

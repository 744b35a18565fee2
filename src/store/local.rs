//! A lake in a local directory (the embedded default, `./lake`).
//!
//! Every write goes to a hidden temporary file in the destination directory, is fsynced, then
//! renamed over the key, and the directory is fsynced: a reader never sees a half-written
//! object. Conditional writes hold an exclusive `flock` on `<root>/.lakecdc-lock` across the
//! etag check and the rename, so they are atomic between processes. Names starting with
//! `.lakecdc-` are this backend's own and never listed.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::{Download, GetResult, ObjectMeta, ObjectStore, PutMode, PutResult, StoreError};

const OWN_PREFIX: &str = ".lakecdc-";
const LOCK_FILE: &str = ".lakecdc-lock";
const COPY_BUF: usize = 1 << 20;

/// A store rooted at a local directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// Opens (creating if needed) a lake directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    /// The lake directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        validate_key(key)?;
        Ok(self.root.join(key))
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(LocalStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(this))
            .await
            .map_err(|e| StoreError::Backend {
                message: "local store task failed".to_string(),
                source: Some(Box::new(e)),
            })?
    }

    /// Writes `fill`'s output to a temp file next to `dest`, fsyncs, renames over `dest`.
    fn write_atomic(
        dest: &Path,
        fill: impl FnOnce(&mut File) -> Result<(u64, [u8; 32]), StoreError>,
    ) -> Result<(u64, [u8; 32]), StoreError> {
        let dir = dest.parent().ok_or(StoreError::InvalidKey {
            reason: "key has no parent directory",
        })?;
        fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{OWN_PREFIX}tmp-{}", uuid::Uuid::new_v4()));
        let result = (|| {
            let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            let out = fill(&mut file)?;
            file.sync_all()?;
            fs::rename(&tmp, dest)?;
            File::open(dir)?.sync_all()?;
            Ok(out)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn lock(&self) -> Result<File, StoreError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join(LOCK_FILE))?;
        file.lock()?;
        Ok(file)
    }

    fn put_bytes_blocking(
        &self,
        key: &str,
        body: &[u8],
        mode: &PutMode,
    ) -> Result<PutResult, StoreError> {
        let dest = self.path(key)?;
        let _guard = match mode {
            PutMode::Overwrite => None,
            PutMode::Create | PutMode::Update(_) => Some(self.lock()?),
        };
        let current = match fs::metadata(&dest) {
            Ok(m) => Some(etag_of(&m)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        match (mode, &current) {
            (PutMode::Create, Some(_)) | (PutMode::Update(_), None) => {
                return Err(StoreError::Conflict);
            }
            (PutMode::Update(want), Some(have)) if want != have => {
                return Err(StoreError::Conflict);
            }
            _ => {}
        }
        let (size, sha256) = Self::write_atomic(&dest, |f| {
            f.write_all(body)?;
            Ok((body.len() as u64, super::sha256(body)))
        })?;
        let etag = etag_of(&fs::metadata(&dest)?);
        Ok(PutResult { size, sha256, etag })
    }
}

/// Refuses keys that would escape the root or collide with this backend's own files.
fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() || key.starts_with('/') || key.ends_with('/') {
        return Err(StoreError::InvalidKey {
            reason: "a local lake key must be relative and name a file",
        });
    }
    for seg in key.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." || seg.contains('\0') {
            return Err(StoreError::InvalidKey {
                reason: "a local lake key must not contain empty, '.' or '..' segments",
            });
        }
        if seg.starts_with(OWN_PREFIX) {
            return Err(StoreError::InvalidKey {
                reason: "names starting with .lakecdc- are reserved",
            });
        }
    }
    Ok(())
}

/// A version token that changes on every rename-replace (new inode, new mtime).
fn etag_of(m: &fs::Metadata) -> String {
    format!(
        "{:x}-{:x}.{:x}-{:x}",
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        m.size()
    )
}

fn meta_of(key: String, m: &fs::Metadata) -> ObjectMeta {
    let last_modified_ms = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    ObjectMeta {
        key,
        size: m.size(),
        etag: etag_of(m),
        last_modified_ms,
    }
}

fn not_found(e: io::Error) -> StoreError {
    if e.kind() == io::ErrorKind::NotFound {
        StoreError::NotFound
    } else {
        StoreError::Io(e)
    }
}

/// Copies `src` to `dst` while hashing.
fn copy_hashing(src: &mut impl Read, dst: &mut impl Write) -> io::Result<(u64, [u8; 32])> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_BUF];
    let mut total = 0u64;
    loop {
        let n = src.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        hasher.update(chunk);
        dst.write_all(chunk)?;
        total += n as u64;
    }
    Ok((total, hasher.finalize().into()))
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, fs::Metadata)>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(OWN_PREFIX) {
            continue;
        }
        let key = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let meta = entry.metadata()?;
        if meta.is_dir() {
            walk(&entry.path(), &key, out)?;
        } else if meta.is_file() {
            out.push((key, meta));
        }
    }
    Ok(())
}

#[async_trait]
impl ObjectStore for LocalStore {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        let key = key.to_string();
        let src = path.to_path_buf();
        self.blocking(move |s| {
            let dest = s.path(&key)?;
            let mut input = File::open(&src)?;
            let (size, sha256) = Self::write_atomic(&dest, |f| Ok(copy_hashing(&mut input, f)?))?;
            let etag = etag_of(&fs::metadata(&dest)?);
            Ok(PutResult { size, sha256, etag })
        })
        .await
    }

    async fn put_bytes(
        &self,
        key: &str,
        body: Bytes,
        mode: PutMode,
    ) -> Result<PutResult, StoreError> {
        let key = key.to_string();
        self.blocking(move |s| s.put_bytes_blocking(&key, &body, &mode))
            .await
    }

    async fn get_bytes(&self, key: &str) -> Result<GetResult, StoreError> {
        let key = key.to_string();
        self.blocking(move |s| {
            let path = s.path(&key)?;
            let mut file = File::open(&path).map_err(not_found)?;
            let etag = etag_of(&file.metadata()?);
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(GetResult {
                bytes: Bytes::from(bytes),
                etag,
            })
        })
        .await
    }

    async fn get_to_file(&self, key: &str, path: &Path) -> Result<Download, StoreError> {
        let key = key.to_string();
        let dest = path.to_path_buf();
        self.blocking(move |s| {
            let mut input = File::open(s.path(&key)?).map_err(not_found)?;
            let mut out = File::create(&dest)?;
            let (size, sha256) = copy_hashing(&mut input, &mut out)?;
            out.sync_all()?;
            Ok(Download { size, sha256 })
        })
        .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let key = key.to_string();
        self.blocking(move |s| {
            let m = fs::metadata(s.path(&key)?).map_err(not_found)?;
            if !m.is_file() {
                return Err(StoreError::NotFound);
            }
            Ok(meta_of(key, &m))
        })
        .await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let (from, to) = (from.to_string(), to.to_string());
        self.blocking(move |s| {
            let mut input = File::open(s.path(&from)?).map_err(not_found)?;
            let dest = s.path(&to)?;
            Self::write_atomic(&dest, |f| Ok(copy_hashing(&mut input, f)?))?;
            Ok(())
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let key = key.to_string();
        self.blocking(move |s| match fs::remove_file(s.path(&key)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        let prefix = prefix.to_string();
        self.blocking(move |s| {
            let dir_part = prefix.rfind('/').map(|i| &prefix[..i]).unwrap_or("");
            if !dir_part.is_empty() {
                validate_key(dir_part)?;
            }
            let mut found = Vec::new();
            walk(&s.root.join(dir_part), dir_part, &mut found)?;
            let mut out: Vec<ObjectMeta> = found
                .into_iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(k, m)| meta_of(k, &m))
                .collect();
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_escape_the_root_are_refused() {
        for bad in [
            "",
            "/abs",
            "a//b",
            "a/../b",
            "..",
            "a/",
            "./a",
            "a/.lakecdc-lock",
        ] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["manifest/7.json", "data/7/_tmp/x.parquet", "a"] {
            assert!(validate_key(good).is_ok(), "{good:?} refused");
        }
    }
}

//! A lake in a local directory (the embedded default, `./lake`).
//!
//! Every write goes to a hidden temporary file in the destination directory, is fsynced, then
//! renamed over the key, and the directory is fsynced: a reader never sees a half-written
//! object. Conditional writes hold an exclusive `flock` on `<root>/.lakecdc-lock` across the
//! etag check and the rename, so they are atomic between processes. Names starting with
//! `.lakecdc-` are this backend's own and never listed. Objects (and the lock file) are created
//! with mode 0640 minus the umask, directories with 0777 minus the umask.
//!
//! Whoever can write the lake directory must not be able to make lakecdc read, write or delete
//! anything outside it (docs/hazards.md L27). The root is the operator's choice and may itself
//! be a symbolic link (`/srv/lake -> /mnt/disk/lake`); everything beneath it is untrusted. So
//! every operation opens the root, reaches a key's directory one component at a time with
//! `openat(O_NOFOLLOW)` (creating missing ones for writes), and opens, stats, renames and
//! unlinks relative to that directory's descriptor. A key whose path crosses a symbolic link —
//! a directory on the way or the key itself — is refused with an error naming the key, for
//! reads, writes and deletes alike. `list` neither reports a symbolic link nor descends into
//! one: it logs a warning naming it and goes on (a listing prefix that itself crosses a link is
//! refused). A key naming a FIFO or another special file is an error, never a wait.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use bytes::Bytes;
use rustix::fs::{AtFlags, Dir, Mode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::{
    AbandonedWrite, Download, GetResult, ObjectMeta, ObjectStore, PutMode, PutResult, StoreError,
    copy_hashing, range_within, stream::Part,
};
use crate::scratch::Piecewise;

const OWN_PREFIX: &str = ".lakecdc-";
const LOCK_FILE: &str = ".lakecdc-lock";
/// Lake objects and the lock file: 0640 (minus the umask).
const OBJECT_MODE: Mode = Mode::RUSR.union(Mode::WUSR).union(Mode::RGRP);
/// Lake directories: 0777 (minus the umask).
const DIR_MODE: Mode = Mode::RWXU.union(Mode::RWXG).union(Mode::RWXO);
/// Opens a directory beneath the root: never through a symbolic link.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
/// A directory another writer removes between our `mkdirat` and `openat` is made again, this
/// many times at most.
const MKDIR_ATTEMPTS: usize = 3;

/// A store rooted at a local directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

/// A key's parent directory, opened beneath the root without following symbolic links, and
/// the key's last component.
struct Parent<'k> {
    dir: OwnedFd,
    name: &'k str,
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

    /// Opens the root directory. The root may be a symbolic link (the operator chose the
    /// path); nothing beneath it is followed.
    fn open_root(&self) -> Result<OwnedFd, StoreError> {
        let shown = || self.root.display().to_string();
        rustix::fs::open(
            &self.root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOENT => StoreError::NoSuchDirectory { path: shown() },
            Errno::NOTDIR => StoreError::NotADirectory { path: shown() },
            e => sys(e),
        })
    }

    /// Takes the exclusive lock conditional writes hold. The lock file is opened without
    /// following a symbolic link and without blocking on a FIFO.
    fn lock(root: BorrowedFd<'_>) -> Result<File, StoreError> {
        let flags =
            OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(root, LOCK_FILE, flags, OBJECT_MODE).map_err(|e| match e {
            Errno::LOOP => crosses_symlink(&format!("lake lock file {LOCK_FILE}"), LOCK_FILE),
            e => sys(e),
        })?;
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(StoreError::Io(io::Error::other(format!(
                "lake lock file {LOCK_FILE} is not a regular file: remove it"
            ))));
        }
        file.lock()?;
        Ok(file)
    }

    /// Opens a key's object for reading, with its metadata. A directory is no object (not
    /// found); a symbolic link anywhere on the key's path is refused; a FIFO or other special
    /// file is an error (it is opened without blocking and never read).
    fn open_object(&self, key: &str) -> Result<(File, fs::Metadata), StoreError> {
        let root = self.open_root()?;
        let Some(p) = find_parent(root.as_fd(), key)? else {
            return Err(StoreError::NotFound);
        };
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&p.dir, p.name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Err(StoreError::NotFound),
            // With O_NOFOLLOW, ELOOP means the last component is a symbolic link.
            Err(Errno::LOOP) => return Err(crosses_symlink(&key_label(key), key)),
            Err(e) => return Err(sys(e)),
        };
        let file = File::from(fd);
        let meta = file.metadata()?;
        if meta.is_dir() {
            return Err(StoreError::NotFound);
        }
        if !meta.is_file() {
            return Err(StoreError::Io(io::Error::other(format!(
                "lake key {key} is not a regular file: remove it"
            ))));
        }
        // Reads of the regular file block as usual.
        let flags = rustix::fs::fcntl_getfl(&file).map_err(sys)?;
        rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK).map_err(sys)?;
        Ok((file, meta))
    }

    /// What a walk of directory `dir_part` (of `prefix`) finds: nothing when it is missing.
    fn walk_prefix(
        &self,
        prefix: &str,
        dir_part: &str,
        found: Found,
    ) -> Result<Vec<(String, fs::Metadata)>, StoreError> {
        if !dir_part.is_empty() {
            validate_key(dir_part)?;
        }
        let root = self.open_root()?;
        let what = format!("lake prefix {prefix}");
        let mut out = Vec::new();
        if let Some(dir) = open_dirs(root.as_fd(), dir_part, &what, false)? {
            walk_within(dir, dir_part, MAX_LIST_DEPTH, found, &mut out)?;
        }
        Ok(out)
    }

    /// Writes `fill`'s output to a temp file (mode 0640) in `p`'s directory (in pieces,
    /// [`crate::scratch::WRITE_PIECE`]), fsyncs it,
    /// renames it over the key and fsyncs the directory. Returns `fill`'s result and the new
    /// object's etag.
    fn write_atomic(
        p: &Parent<'_>,
        fill: impl FnOnce(&mut Piecewise<&mut File>) -> Result<(u64, [u8; 32]), StoreError>,
    ) -> Result<(u64, [u8; 32], String), StoreError> {
        let tmp = format!("{OWN_PREFIX}tmp-{}", uuid::Uuid::new_v4());
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut file =
            File::from(rustix::fs::openat(&p.dir, &tmp, flags, OBJECT_MODE).map_err(sys)?);
        let result = (|| {
            let (size, sha256) = fill(&mut Piecewise(&mut file))?;
            file.sync_all()?;
            // The rename keeps the inode and its mtime: this is the stored object's etag.
            let etag = etag_of(&file.metadata()?);
            rustix::fs::renameat(&p.dir, &tmp, &p.dir, p.name).map_err(sys)?;
            rustix::fs::fsync(&p.dir).map_err(sys)?;
            Ok((size, sha256, etag))
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&p.dir, &tmp, AtFlags::empty());
        }
        result
    }

    /// Writes a new object at `key` (overwriting one there) from `fill`, which writes the
    /// bytes to a hidden temporary file and returns their size and SHA-256; the file is
    /// renamed into place once `fill` succeeded (on a blocking thread).
    async fn put_new(
        &self,
        key: &str,
        fill: impl FnOnce(&mut Piecewise<&mut File>) -> Result<(u64, [u8; 32]), StoreError>
        + Send
        + 'static,
    ) -> Result<PutResult, StoreError> {
        let key = key.to_string();
        self.blocking(move |s| {
            validate_key(&key)?;
            let root = s.open_root()?;
            let p = make_parent(root.as_fd(), &key)?;
            existing(&p, &key)?;
            let (size, sha256, etag) = Self::write_atomic(&p, fill)?;
            Ok(PutResult { size, sha256, etag })
        })
        .await
    }

    fn put_bytes_blocking(
        &self,
        key: &str,
        body: &[u8],
        mode: &PutMode,
    ) -> Result<PutResult, StoreError> {
        validate_key(key)?;
        let root = self.open_root()?;
        let _guard = match mode {
            PutMode::Overwrite => None,
            PutMode::Create | PutMode::Update(_) => Some(Self::lock(root.as_fd())?),
        };
        // Directories are made only once the write is decided.
        let found = find_parent(root.as_fd(), key)?;
        let current = match &found {
            Some(p) => existing(p, key)?.map(|m| etag_of(&m)),
            None => None,
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
        let p = match found {
            Some(p) => p,
            None => make_parent(root.as_fd(), key)?,
        };
        let (size, sha256, etag) = Self::write_atomic(&p, |f| {
            f.write_all(body)?;
            Ok((body.len() as u64, super::sha256(body)))
        })?;
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

fn sys(e: Errno) -> StoreError {
    StoreError::Io(e.into())
}

/// Refuses a read of `size` bytes past a caller's `limit`.
fn within(size: u64, limit: u64) -> Result<(), StoreError> {
    if size > limit {
        return Err(StoreError::TooLarge { size, limit });
    }
    Ok(())
}

fn key_label(key: &str) -> String {
    format!("lake key {key}")
}

/// The refusal of a path beneath the root (`what`: "lake key …") that crosses a symbolic link
/// at `at`.
fn crosses_symlink(what: &str, at: &str) -> StoreError {
    StoreError::Io(io::Error::other(format!(
        "{what} crosses a symbolic link at {at}: the local lake must not contain symbolic links; remove it"
    )))
}

/// The metadata of `name` in `dir` itself (a symbolic link is not followed), or `None` when
/// nothing has that name. Opened with `O_PATH`, so a FIFO or device is never opened.
fn lstat_at(dir: BorrowedFd<'_>, name: impl rustix::path::Arg) -> io::Result<Option<fs::Metadata>> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => File::from(fd).metadata().map(Some),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens the directory `name` in `parent` without following a symbolic link; with `create`,
/// makes it when missing (another writer making it at the same time is fine). `None` when it
/// is missing and `create` is false.
fn open_dir_at(parent: BorrowedFd<'_>, name: &str, create: bool) -> Result<Option<OwnedFd>, Errno> {
    for _ in 0..MKDIR_ATTEMPTS {
        match rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::NOENT) if create => match rustix::fs::mkdirat(parent, name, DIR_MODE) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e),
            },
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Err(Errno::NOENT)
}

/// Opens the directories `dirs` (validated, `/`-separated) beneath `root` one component at a
/// time, refusing symbolic links; with `create`, makes missing ones. `None` when one is
/// missing and `create` is false. `what` names the key or prefix in errors.
fn open_dirs(
    root: BorrowedFd<'_>,
    dirs: &str,
    what: &str,
    create: bool,
) -> Result<Option<OwnedFd>, StoreError> {
    let mut dir = root.try_clone_to_owned()?;
    if dirs.is_empty() {
        return Ok(Some(dir));
    }
    let mut end = 0;
    for comp in dirs.split('/') {
        end += comp.len();
        let at = dirs.get(..end).unwrap_or(dirs);
        end += 1;
        dir = match open_dir_at(dir.as_fd(), comp, create) {
            Ok(Some(next)) => next,
            Ok(None) => return Ok(None),
            Err(e @ (Errno::NOTDIR | Errno::LOOP)) => {
                // O_DIRECTORY | O_NOFOLLOW on a symbolic link fails with ENOTDIR (or ELOOP):
                // tell a link from a plain file.
                return Err(match lstat_at(dir.as_fd(), comp) {
                    Ok(Some(m)) if m.file_type().is_symlink() => crosses_symlink(what, at),
                    Ok(Some(m)) if !m.is_dir() => StoreError::Io(io::Error::new(
                        io::ErrorKind::NotADirectory,
                        format!("{what}: {at} is not a directory"),
                    )),
                    _ => sys(e),
                });
            }
            Err(e) => return Err(sys(e)),
        };
    }
    Ok(Some(dir))
}

/// Splits a validated key into its directories (`""` at the root) and its last component.
fn split_key(key: &str) -> (&str, &str) {
    key.rsplit_once('/').unwrap_or(("", key))
}

/// A key's parent directory, or `None` when a directory on the way is missing.
fn find_parent<'k>(root: BorrowedFd<'_>, key: &'k str) -> Result<Option<Parent<'k>>, StoreError> {
    validate_key(key)?;
    let (dirs, name) = split_key(key);
    Ok(open_dirs(root, dirs, &key_label(key), false)?.map(|dir| Parent { dir, name }))
}

/// A key's parent directory, made when missing.
fn make_parent<'k>(root: BorrowedFd<'_>, key: &'k str) -> Result<Parent<'k>, StoreError> {
    validate_key(key)?;
    let (dirs, name) = split_key(key);
    match open_dirs(root, dirs, &key_label(key), true)? {
        Some(dir) => Ok(Parent { dir, name }),
        None => Err(StoreError::Io(io::Error::new(
            io::ErrorKind::NotFound,
            format!("lake key {key}: its directory vanished while being made"),
        ))),
    }
}

/// What the key names now (a symbolic link is refused), or `None`.
fn existing(p: &Parent<'_>, key: &str) -> Result<Option<fs::Metadata>, StoreError> {
    match lstat_at(p.dir.as_fd(), p.name)? {
        Some(m) if m.file_type().is_symlink() => Err(crosses_symlink(&key_label(key), key)),
        m => Ok(m),
    }
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

/// How deep a listing descends below its prefix. lakecdc's keys are a few directories deep;
/// a deeper tree is planted, and descending it would cost a file descriptor and a stack frame
/// per level (docs/hazards.md L27).
const MAX_LIST_DEPTH: usize = 16;

/// What a walk collects: the lake's objects, or the temporary files of unfinished writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Found {
    Objects,
    Temporaries,
}

/// The name of every temporary file [`LocalStore`]'s writes make.
const TMP_PREFIX: &str = ".lakecdc-tmp-";

/// Collects the regular files (with [`Found::Temporaries`], only the store's temporary files)
/// beneath `dir`, whose keys start with `rel`. A symbolic link is
/// neither reported nor followed: it is logged, naming its key, and skipped. So is a directory
/// more than [`MAX_LIST_DEPTH`] levels down.
fn walk_within(
    dir: OwnedFd,
    rel: &str,
    depth: usize,
    found: Found,
    out: &mut Vec<(String, fs::Metadata)>,
) -> Result<(), StoreError> {
    let mut entries = Dir::new(dir).map_err(sys)?;
    while let Some(entry) = entries.read() {
        let entry = entry.map_err(sys)?;
        let raw = entry.file_name();
        let bytes = raw.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let name = String::from_utf8_lossy(bytes);
        let temporary = name.starts_with(TMP_PREFIX);
        if name.starts_with(OWN_PREFIX) && !(temporary && found == Found::Temporaries) {
            continue;
        }
        // A temporary's key must name it exactly, to remove it.
        if temporary && std::str::from_utf8(bytes).is_err() {
            continue;
        }
        let key = if rel.is_empty() {
            name.into_owned()
        } else {
            format!("{rel}/{name}")
        };
        let here = entries.fd().map_err(sys)?;
        // Gone since the directory was read: a concurrent delete.
        let Some(meta) = lstat_at(here, raw)? else {
            continue;
        };
        if meta.file_type().is_symlink() {
            tracing::warn!(
                key,
                "symbolic link in the local lake: neither listed nor followed; remove it"
            );
        } else if meta.is_dir() && !temporary {
            match rustix::fs::openat(here, raw, DIR_FLAGS, Mode::empty()) {
                Ok(_) if depth == 0 => tracing::warn!(
                    key,
                    "directory nested deeper than lakecdc writes: not listed; remove it"
                ),
                Ok(sub) => walk_within(sub, &key, depth - 1, found, out)?,
                Err(Errno::NOENT) => {}
                Err(Errno::NOTDIR | Errno::LOOP) => tracing::warn!(
                    key,
                    "directory replaced while listed (by a symbolic link?): not followed"
                ),
                Err(e) => return Err(sys(e)),
            }
        } else if meta.is_file() && (found == Found::Objects || temporary) {
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

    fn uri(&self, key: &str) -> String {
        let root = std::path::absolute(&self.root).unwrap_or_else(|_| self.root.clone());
        root.join(key).display().to_string()
    }

    fn is_local(&self) -> bool {
        true
    }

    async fn open_local(&self, key: &str) -> Option<Result<File, StoreError>> {
        let key = key.to_string();
        Some(
            self.blocking(move |s| s.open_object(&key).map(|(f, _)| f))
                .await,
        )
    }

    async fn put_file(&self, key: &str, path: &Path) -> Result<PutResult, StoreError> {
        let src = path.to_path_buf();
        self.put_new(key, move |f| {
            let mut input = File::open(&src)?;
            Ok(copy_hashing(&mut input, f)?)
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

    async fn put_parts(
        &self,
        key: &str,
        mut parts: super::stream::Parts,
    ) -> Result<PutResult, StoreError> {
        // The temporary file is renamed into place only once the writer ended the object: an
        // unfinished one is never seen under its key.
        self.put_new(key, move |f| {
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            loop {
                match parts.blocking_recv() {
                    Some(Part::Bytes(b)) => {
                        hasher.update(&b);
                        f.write_all(&b)?;
                        size += b.len() as u64;
                    }
                    Some(Part::End) => return Ok((size, hasher.finalize().into())),
                    None => return Err(StoreError::Unfinished),
                }
            }
        })
        .await
    }

    async fn get_bytes_within(&self, key: &str, limit: u64) -> Result<GetResult, StoreError> {
        let key = key.to_string();
        self.blocking(move |s| {
            let (file, meta) = s.open_object(&key)?;
            within(meta.size(), limit)?;
            let mut bytes = Vec::with_capacity(usize::try_from(meta.size()).unwrap_or(0));
            // The file may grow after the size check: read one byte past the limit at most.
            file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
            within(bytes.len() as u64, limit)?;
            Ok(GetResult {
                bytes: Bytes::from(bytes),
                etag: etag_of(&meta),
            })
        })
        .await
    }

    async fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        if len == 0 {
            // Nothing to read; the key is still checked, which needs no file system access.
            validate_key(key)?;
            return Ok(Bytes::new());
        }
        let key = key.to_string();
        self.blocking(move |s| {
            let (mut file, meta) = s.open_object(&key)?;
            let want = range_within(offset, len, meta.size())?;
            file.seek(SeekFrom::Start(offset))?;
            let mut bytes = Vec::with_capacity(want.len());
            // The file may shrink or grow after the size check: read the range and no further.
            file.take(len).read_to_end(&mut bytes)?;
            let got = bytes.len() as u64;
            if got != len {
                return Err(StoreError::RangePastEnd {
                    offset,
                    len,
                    size: Some(offset.saturating_add(got)),
                });
            }
            Ok(Bytes::from(bytes))
        })
        .await
    }

    async fn get_to_file_within(
        &self,
        key: &str,
        path: &Path,
        limit: u64,
    ) -> Result<Download, StoreError> {
        let key = key.to_string();
        let dest = path.to_path_buf();
        self.blocking(move |s| {
            let (input, meta) = s.open_object(&key)?;
            within(meta.size(), limit)?;
            // A scratch path lakecdc chose, fresh in a private directory: never an existing
            // file, and readable by this user only.
            let mut out = crate::scratch::create_writer(&dest)?;
            let (size, sha256) = copy_hashing(&mut input.take(limit.saturating_add(1)), &mut out)?;
            within(size, limit)?;
            out.0.sync_all()?;
            Ok(Download { size, sha256 })
        })
        .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let key = key.to_string();
        self.blocking(move |s| {
            let root = s.open_root()?;
            let Some(p) = find_parent(root.as_fd(), &key)? else {
                return Err(StoreError::NotFound);
            };
            match existing(&p, &key)? {
                Some(m) if m.is_file() => Ok(meta_of(key, &m)),
                _ => Err(StoreError::NotFound),
            }
        })
        .await
    }

    async fn copy(&self, from: &str, to: &str) -> Result<(), StoreError> {
        let (from, to) = (from.to_string(), to.to_string());
        self.blocking(move |s| {
            validate_key(&to)?;
            let (mut input, _) = s.open_object(&from)?;
            let root = s.open_root()?;
            let p = make_parent(root.as_fd(), &to)?;
            existing(&p, &to)?;
            Self::write_atomic(&p, |f| Ok(copy_hashing(&mut input, f)?))?;
            Ok(())
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let key = key.to_string();
        self.blocking(move |s| {
            let root = s.open_root()?;
            let Some(p) = find_parent(root.as_fd(), &key)? else {
                return Ok(());
            };
            // Unlinking a link would remove only the link, but a lake holding links is refused
            // whatever the operation.
            if existing(&p, &key)?.is_none() {
                return Ok(());
            }
            match rustix::fs::unlinkat(&p.dir, p.name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(sys(e)),
            }
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        let prefix = prefix.to_string();
        self.blocking(move |s| {
            let dir_part = prefix.rfind('/').map(|i| &prefix[..i]).unwrap_or("");
            let found = s.walk_prefix(&prefix, dir_part, Found::Objects)?;
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

    async fn abandoned_writes(&self, prefix: &str) -> Result<Vec<AbandonedWrite>, StoreError> {
        let prefix = prefix.to_string();
        self.blocking(move |s| {
            // The temporaries of the directory `prefix` names (and those below it).
            let dir_part = prefix.trim_end_matches('/');
            let found = s.walk_prefix(&prefix, dir_part, Found::Temporaries)?;
            Ok(found
                .into_iter()
                .map(|(key, m)| {
                    let meta = meta_of(key, &m);
                    AbandonedWrite {
                        started_ms: meta.last_modified_ms,
                        bytes: Some(meta.size),
                        handle: String::new(),
                        key: meta.key,
                    }
                })
                .collect())
        })
        .await
    }

    async fn remove_abandoned(&self, write: &AbandonedWrite) -> Result<(), StoreError> {
        let key = write.key.clone();
        self.blocking(move |s| {
            let (dirs, name) = split_key(&key);
            if !name.starts_with(TMP_PREFIX) || name.contains('/') {
                return Err(StoreError::InvalidKey {
                    reason: "only a write's temporary file is removed as abandoned",
                });
            }
            if !dirs.is_empty() {
                validate_key(dirs)?;
            }
            let root = s.open_root()?;
            let Some(dir) = open_dirs(root.as_fd(), dirs, &key_label(&key), false)? else {
                return Ok(());
            };
            match lstat_at(dir.as_fd(), name)? {
                Some(m) if m.is_file() => {
                    match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => Ok(()),
                        Err(e) => Err(sys(e)),
                    }
                }
                _ => Ok(()),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::time::Duration;

    use rustix::fs::{Mode, OFlags};

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

    /// What lies outside the lake: never read, written or deleted through it.
    const SECRET: &[u8] = b"outside the lake";
    /// The key every symbolic link below sits on the way to.
    const KEY: &str = "data/100/x.bin";
    /// A real object of the lake.
    const REAL: &str = "real/a.bin";

    /// Where the symbolic link on the way to [`KEY`] sits.
    #[derive(Debug, Clone, Copy)]
    enum Link {
        /// `data`, the first directory, links to a directory outside.
        TopDir,
        /// `data/100`, an intermediate directory, links to a directory outside.
        Dir,
        /// `data/100/x.bin`, the key itself, links to a file outside.
        Key,
    }

    const LINKS: [Link; 3] = [Link::TopDir, Link::Dir, Link::Key];

    struct Lake {
        _tmp: tempfile::TempDir,
        store: LocalStore,
        root: PathBuf,
        outside: PathBuf,
        /// A private directory for downloads and uploads.
        scratch: PathBuf,
        /// Everything outside the lake, as it was before the operation.
        before: BTreeMap<PathBuf, Option<Vec<u8>>>,
        /// The link, relative to the root.
        link: &'static str,
    }

    /// A lake in which [`KEY`] crosses `link`. Outside, following the link finds a file at
    /// `KEY` whatever the link's place, so the old behaviour (following) would succeed.
    fn lake(link: Link) -> Lake {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("lake");
        let outside = tmp.path().join("outside");
        let scratch = tmp.path().join("scratch");
        for d in [&root, &outside.join("100"), &scratch, &root.join("real")] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(outside.join("100/x.bin"), SECRET).unwrap();
        fs::write(outside.join("x.bin"), SECRET).unwrap();
        fs::write(outside.join("secret.bin"), SECRET).unwrap();
        fs::write(root.join(REAL), b"real").unwrap();
        let link = match link {
            Link::TopDir => {
                symlink(&outside, root.join("data")).unwrap();
                "data"
            }
            Link::Dir => {
                fs::create_dir(root.join("data")).unwrap();
                symlink(&outside, root.join("data/100")).unwrap();
                "data/100"
            }
            Link::Key => {
                fs::create_dir_all(root.join("data/100")).unwrap();
                symlink(outside.join("secret.bin"), root.join(KEY)).unwrap();
                KEY
            }
        };
        let store = LocalStore::open(&root).unwrap();
        let before = snapshot(&outside);
        Lake {
            _tmp: tmp,
            store,
            root,
            outside,
            scratch,
            before,
            link,
        }
    }

    /// Every path beneath `dir` (symbolic links not followed), with a file's bytes.
    fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        let mut out = BTreeMap::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for entry in fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                let rel = path.strip_prefix(dir).unwrap().to_path_buf();
                if meta.is_dir() {
                    todo.push(path);
                    out.insert(rel, None);
                } else {
                    out.insert(rel, Some(fs::read(&path).unwrap()));
                }
            }
        }
        out
    }

    impl Lake {
        /// Nothing outside the lake was deleted, changed or created, and the link is still
        /// the link.
        fn assert_outside_untouched(&self) {
            assert_eq!(snapshot(&self.outside), self.before);
            let link = fs::symlink_metadata(self.root.join(self.link)).unwrap();
            assert!(link.file_type().is_symlink(), "{} replaced", self.link);
        }

        /// The operation failed naming `key` and the link, not as "not found" nor as a
        /// conflict, and nothing outside changed.
        fn assert_refused<T: std::fmt::Debug>(&self, got: Result<T, StoreError>, key: &str) {
            let err = got.expect_err("a path crossing a symbolic link was accepted");
            let msg = err.to_string();
            assert!(
                msg.contains(key)
                    && msg.contains("symbolic link")
                    && msg.contains(&format!("at {}", self.link)),
                "{msg}"
            );
            assert!(!err.is_not_found() && !err.is_conflict(), "{err:?}");
            self.assert_outside_untouched();
        }
    }

    #[tokio::test]
    async fn reads_through_a_symbolic_link_are_refused() {
        for link in LINKS {
            let lake = lake(link);
            lake.assert_refused(lake.store.get_bytes(KEY).await, KEY);
            let dest = lake.scratch.join("download");
            lake.assert_refused(lake.store.get_to_file(KEY, &dest).await, KEY);
            assert!(!dest.exists(), "{link:?}: a download was started");
            lake.assert_refused(lake.store.head(KEY).await, KEY);
            lake.assert_refused(lake.store.get_range(KEY, 1, 3).await, KEY);
            // The lake's real objects still read.
            let got = lake.store.get_bytes(REAL).await.unwrap();
            assert_eq!(&got.bytes[..], b"real");
            assert_eq!(&lake.store.get_range(REAL, 1, 3).await.unwrap()[..], b"eal");
        }
    }

    #[tokio::test]
    async fn writes_through_a_symbolic_link_are_refused_in_every_mode() {
        for link in LINKS {
            let lake = lake(link);
            let etag = lake.store.head(REAL).await.unwrap().etag;
            for mode in [PutMode::Overwrite, PutMode::Create, PutMode::Update(etag)] {
                let body = Bytes::from_static(b"written through the link");
                lake.assert_refused(lake.store.put_bytes(KEY, body, mode).await, KEY);
            }
            let src = lake.scratch.join("upload");
            fs::write(&src, b"uploaded through the link").unwrap();
            lake.assert_refused(lake.store.put_file(KEY, &src).await, KEY);
            // Below the link too: a write would make directories outside.
            let deeper = "data/100/_tmp/new.bin";
            let body = Bytes::from_static(b"x");
            if !matches!(link, Link::Key) {
                lake.assert_refused(
                    lake.store.put_bytes(deeper, body, PutMode::Overwrite).await,
                    deeper,
                );
            }
        }
    }

    #[tokio::test]
    async fn copies_from_or_to_a_symbolic_link_are_refused() {
        for link in LINKS {
            let lake = lake(link);
            let to = "real/copy.bin";
            lake.assert_refused(lake.store.copy(KEY, to).await, KEY);
            assert!(lake.store.head(to).await.unwrap_err().is_not_found());
            lake.assert_refused(lake.store.copy(REAL, KEY).await, KEY);
        }
    }

    #[tokio::test]
    async fn deletes_through_a_symbolic_link_are_refused() {
        for link in LINKS {
            let lake = lake(link);
            lake.assert_refused(lake.store.delete(KEY).await, KEY);
            // A key missing below the link is refused too, not "already gone".
            if !matches!(link, Link::Key) {
                let missing = "data/100/none.bin";
                lake.assert_refused(lake.store.delete(missing).await, missing);
            }
            lake.store.head(REAL).await.unwrap();
        }
    }

    #[tokio::test]
    async fn listings_report_neither_links_nor_what_they_reach() {
        for link in LINKS {
            let lake = lake(link);
            for prefix in ["", "d", "data/", "data/100/x"] {
                let got = lake.store.list(prefix).await;
                // A prefix whose directory is (or lies below) a linked directory is refused.
                let dir = prefix.rsplit_once('/').map_or("", |(d, _)| d);
                let below_link = dir == lake.link || dir.starts_with(&format!("{}/", lake.link));
                if below_link {
                    lake.assert_refused(got, prefix);
                    continue;
                }
                let keys: Vec<String> = got.unwrap().into_iter().map(|m| m.key).collect();
                let want: &[&str] = if prefix.is_empty() { &[REAL] } else { &[] };
                assert_eq!(keys, want, "{link:?} {prefix:?}");
            }
            lake.assert_outside_untouched();
        }
    }

    #[tokio::test]
    async fn a_listing_stops_at_a_planted_deep_tree() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("data/100")).unwrap();
        std::fs::write(dir.path().join("data/100/a.parquet"), b"a").unwrap();
        let mut deep = dir.path().join("data/100");
        for _ in 0..(MAX_LIST_DEPTH + 8) {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("z.parquet"), b"z").unwrap();
        assert_eq!(listed_keys(&store, "data/").await, ["data/100/a.parquet"]);
    }

    /// The keys `store` lists under `prefix`.
    async fn listed_keys(store: &LocalStore, prefix: &str) -> Vec<String> {
        let listed = store.list(prefix).await.unwrap();
        listed.into_iter().map(|m| m.key).collect()
    }

    #[tokio::test]
    async fn a_killed_writes_temporary_is_found_and_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        store
            .put_bytes(
                "data/100/a.parquet",
                Bytes::from_static(b"a"),
                PutMode::Overwrite,
            )
            .await
            .unwrap();
        // What a write killed between its temporary file and its rename leaves, one level
        // down too; a link named like one, reaching outside; the store's own lock.
        let tmp = format!("{TMP_PREFIX}0190");
        std::fs::create_dir_all(dir.path().join("data/100/_tmp")).unwrap();
        std::fs::write(dir.path().join("data/100").join(&tmp), b"half").unwrap();
        std::fs::write(dir.path().join("data/100/_tmp").join(&tmp), b"halfway").unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        symlink(
            &victim,
            dir.path().join(format!("data/100/{TMP_PREFIX}link")),
        )
        .unwrap();
        let found = store.abandoned_writes("data/100/").await.unwrap();
        let mut keys: Vec<(String, Option<u64>)> =
            found.iter().map(|w| (w.key.clone(), w.bytes)).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                (format!("data/100/{tmp}"), Some(4)),
                (format!("data/100/_tmp/{tmp}"), Some(7)),
            ]
        );
        assert!(found.iter().all(|w| w.started_ms > 0));
        // Invisible to listings, as before.
        assert_eq!(listed_keys(&store, "data/").await, ["data/100/a.parquet"]);
        for w in &found {
            store.remove_abandoned(w).await.unwrap();
            store.remove_abandoned(w).await.unwrap();
        }
        assert!(store.abandoned_writes("data/").await.unwrap().is_empty());
        // Only a temporary's name is ever removed this way, and a link is not followed.
        let object = AbandonedWrite {
            key: "data/100/a.parquet".into(),
            started_ms: 0,
            bytes: None,
            handle: String::new(),
        };
        assert!(store.remove_abandoned(&object).await.is_err());
        let link = AbandonedWrite {
            key: format!("data/100/{TMP_PREFIX}link"),
            ..object
        };
        store.remove_abandoned(&link).await.unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(
            store.get_bytes("data/100/a.parquet").await.unwrap().bytes,
            &b"a"[..]
        );
    }

    #[tokio::test]
    async fn a_symbolic_link_as_the_lock_file_is_refused() {
        let lake = lake(Link::Key);
        let lock = lake.root.join(LOCK_FILE);
        symlink(lake.outside.join("secret.bin"), &lock).unwrap();
        let body = Bytes::from_static(b"{}");
        let err = lake
            .store
            .put_bytes("manifest/7.json", body, PutMode::Create)
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(LOCK_FILE) && msg.contains("symbolic link"),
            "{msg}"
        );
        assert!(
            lake.store
                .head("manifest/7.json")
                .await
                .unwrap_err()
                .is_not_found()
        );
        lake.assert_outside_untouched();
        assert!(
            fs::symlink_metadata(&lock)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[tokio::test]
    async fn a_root_that_is_a_symbolic_link_is_followed() {
        // The operator chose the root: only what lies beneath it is untrusted.
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("disk/lake");
        fs::create_dir_all(&real).unwrap();
        let root = tmp.path().join("lake");
        symlink(&real, &root).unwrap();
        let store = LocalStore::open(&root).unwrap();
        let put = store
            .put_bytes(
                "manifest/7.json",
                Bytes::from_static(b"v1"),
                PutMode::Create,
            )
            .await
            .unwrap();
        assert_eq!(fs::read(real.join("manifest/7.json")).unwrap(), b"v1");
        let got = store.get_bytes("manifest/7.json").await.unwrap();
        assert_eq!(
            (&got.bytes[..], got.etag.as_str()),
            (&b"v1"[..], put.etag.as_str())
        );
        let listed = store.list("").await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].key.as_str(), listed[0].etag.as_str()),
            ("manifest/7.json", put.etag.as_str())
        );
        store.delete("manifest/7.json").await.unwrap();
        assert!(!real.join("manifest/7.json").exists());
    }

    #[tokio::test]
    async fn a_fifo_in_the_lake_is_an_error_not_a_wait() {
        let lake = lake(Link::Key);
        let real_dir = rustix::fs::open(
            lake.root.join("real"),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        rustix::fs::mkfifoat(&real_dir, "fifo", Mode::RUSR | Mode::WUSR).unwrap();
        let within = Duration::from_secs(10);
        let Ok(got) = tokio::time::timeout(within, lake.store.get_bytes("real/fifo")).await else {
            // Release the reader stuck in open(2), so the test fails instead of hanging.
            let fifo = lake.root.join("real/fifo");
            drop(std::fs::OpenOptions::new().write(true).open(fifo));
            panic!("reading a FIFO waited for a writer");
        };
        let msg = got.unwrap_err().to_string();
        assert!(
            msg.contains("real/fifo") && msg.contains("not a regular file"),
            "{msg}"
        );
        let ranged = tokio::time::timeout(within, lake.store.get_range("real/fifo", 0, 1)).await;
        let msg = ranged.unwrap().unwrap_err().to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
        assert!(
            lake.store
                .head("real/fifo")
                .await
                .unwrap_err()
                .is_not_found()
        );
        let keys: Vec<String> = lake
            .store
            .list("real/")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.key)
            .collect();
        assert_eq!(keys, [REAL]);
    }

    #[tokio::test]
    async fn objects_are_created_0640_and_downloads_0600_and_fresh() {
        let lake = lake(Link::Key);
        lake.store
            .put_bytes(
                "manifest/7.json",
                Bytes::from_static(b"v1"),
                PutMode::Create,
            )
            .await
            .unwrap();
        let src = lake.scratch.join("upload");
        fs::write(&src, b"up").unwrap();
        lake.store.put_file("real/up.bin", &src).await.unwrap();
        lake.store
            .copy("real/up.bin", "real/copied.bin")
            .await
            .unwrap();
        for key in ["manifest/7.json", "real/up.bin", "real/copied.bin"] {
            let mode = fs::metadata(lake.root.join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777 & !0o640, 0, "{key}: {mode:o}");
        }
        let dest = lake.scratch.join("download");
        let dl = lake
            .store
            .get_to_file("manifest/7.json", &dest)
            .await
            .unwrap();
        assert_eq!((dl.size, fs::read(&dest).unwrap()), (2, b"v1".to_vec()));
        let mode = fs::metadata(&dest).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        // An existing file is never written over (the caller names a fresh path).
        fs::write(&dest, b"kept").unwrap();
        assert!(
            lake.store
                .get_to_file("manifest/7.json", &dest)
                .await
                .is_err()
        );
        assert_eq!(fs::read(&dest).unwrap(), b"kept");
    }
}

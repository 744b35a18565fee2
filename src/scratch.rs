//! Local scratch space: one private directory per run (docs/security.md, "Local files").
//!
//! Every temporary file a job writes (exports before upload, downloads before a merge or a
//! check) and DuckDB's spill directory live in one directory with a random name, created
//! mode 0700 under `--work-dir` and removed when the run ends. Other users of the host can
//! neither read what lakecdc stages nor plant a file or a link at a name it will open: the
//! name is unpredictable, the directory is created by lakecdc (never reused), and files inside
//! are created with `create_new` and mode 0600.
//!
//! A run killed before its cleanup (SIGKILL, the OOM killer, a host crash) leaves its
//! directory behind, and a heap-order init's spill alone can be the size of the schema. Each
//! run holds an exclusive lock on `<dir>/.lakecdc-scratch.lock` for its life; the kernel drops
//! it when the process dies, so the next run in the same `--work-dir` removes every directory
//! of the exact shape it makes itself (same owner, mode 0700, `lakecdc-` and six random
//! characters, the lock file) whose lock it can take ([`sweep_leftovers`]), and, once an hour
//! old, those a run was killed making (nothing in them but what precedes the lock).

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the scratch directory and of the spill directory inside it.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every scratch file.
pub const FILE_MODE: u32 = 0o600;
const SPILL: &str = "spill";
const PREFIX: &str = "lakecdc-";
/// The random characters after [`PREFIX`] in a scratch directory's name.
const RANDOM_CHARS: usize = 6;
/// The file each run holds an exclusive lock on while its directory is in use. It gets this
/// name only once locked, so a directory holding it unlocked is a dead run's.
const LOCK: &str = ".lakecdc-scratch.lock";
const LOCK_UNNAMED: &str = ".lakecdc-scratch.lock-new";

/// A private scratch directory for one run, removed (with everything in it) on drop.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    /// Locked for the run's life: a directory whose lock can be taken is left over.
    _lock: File,
}

impl Scratch {
    /// Creates `<parent>/lakecdc-<random>` (mode 0700), its `spill` subdirectory and its
    /// lock file, locked before it gets its name. Where the file system has no locks, the
    /// directory goes without one (and no later run ever takes it for a dead run's).
    pub fn create(parent: &Path) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .rand_bytes(RANDOM_CHARS)
            .permissions(Permissions::from_mode(DIR_MODE))
            .tempdir_in(parent)?;
        create_dir(&dir.path().join(SPILL))?;
        let unnamed = dir.path().join(LOCK_UNNAMED);
        let lock = create_file(&unnamed)?;
        match lock.try_lock() {
            Ok(()) => std::fs::rename(&unnamed, dir.path().join(LOCK))?,
            Err(e) => {
                tracing::warn!(dir = %dir.path().display(), error = %io::Error::from(e), "no lock on the scratch directory (the file system has none?): a run killed now leaves it behind");
                std::fs::remove_file(&unnamed)?;
            }
        }
        Ok(Self { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where DuckDB spills (a 0700 directory inside the scratch directory).
    pub fn spill_dir(&self) -> PathBuf {
        self.dir.path().join(SPILL)
    }
}

/// Creates a new scratch subdirectory, mode 0700, failing if anything is already at `path`.
pub fn create_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(DIR_MODE).create(path)
}

/// Creates a new scratch file, mode 0600, failing if anything (a file, a link) is already at
/// `path`.
pub fn create_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// [`create_file`] for a file lakecdc only writes: its writes reach the kernel in pieces of
/// at most [`WRITE_PIECE`] bytes, whatever size the caller hands over.
pub fn create_writer(path: &Path) -> io::Result<Piecewise<File>> {
    create_file(path).map(Piecewise)
}

/// The most one `write` call hands the kernel when lakecdc writes a local file.
///
/// A larger buffered write makes the page cache take one large folio for it, from the large
/// free blocks of memory; on a virtual machine whose balloon returns free memory to its host,
/// every first touch of such a block faults on the host. Writing an 850 MB spill 1 MiB at a
/// time then cost 1.8 s of system CPU instead of 0.2 s, and made a heap-order init up to a
/// third slower; at 512 KiB or less per call the cost does not appear (docs/benchmarks.md,
/// "large writes on a ballooned machine").
pub const WRITE_PIECE: usize = 256 * 1024;

/// A writer that hands its inner writer at most [`WRITE_PIECE`] bytes per call.
#[derive(Debug)]
pub struct Piecewise<W>(pub W);

impl<W: Write> Write for Piecewise<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf.get(..WRITE_PIECE).unwrap_or(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// What [`sweep_leftovers`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leftovers {
    /// Directories removed.
    pub dirs: u64,
    /// The bytes of the files in them.
    pub bytes: u64,
}

/// Removes the scratch directories under `parent` that runs killed before their cleanup left
/// behind: directories of exactly the shape [`Scratch::create`] makes — named `lakecdc-` and
/// six letters or digits, owned by this user, mode 0700, holding the lock file (never a link,
/// never another user's, never a directory without the lock) — whose lock no live run holds.
/// The lock is held while removing, and the lock file goes last, so two runs never sweep one
/// directory at once and a sweep killed halfway leaves a directory the next one takes. Nothing is swept in a parent that others may write to without the sticky bit (they
/// could rename a directory of ours into the shape). A directory that cannot be judged or
/// removed is left as it is.
pub fn sweep_leftovers(parent: &Path) -> io::Result<Leftovers> {
    let uid = rustix::process::geteuid().as_raw();
    let mut out = Leftovers::default();
    let parent_mode = std::fs::metadata(parent)?.mode();
    if parent_mode & 0o022 != 0 && parent_mode & 0o1000 == 0 {
        return Ok(out);
    }
    for entry in std::fs::read_dir(parent)? {
        let Ok(entry) = entry else { continue };
        if !is_scratch_name(&entry.file_name()) {
            continue;
        }
        // The entry's own metadata: a link is a link, never its target.
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o777 != DIR_MODE {
            continue;
        }
        let dir = entry.path();
        let Ok(lock) = File::open(dir.join(LOCK)) else {
            // A run killed while making its directory, before the lock had its name.
            if unfinished_and_stale(&meta) && remove_unfinished(&dir).is_ok() {
                out.dirs += 1;
            }
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        let bytes = tree_bytes(&dir);
        if remove_locked(&dir).is_ok() {
            out.dirs += 1;
            out.bytes += bytes;
        }
        drop(lock);
    }
    Ok(out)
}

/// A directory without a lock file is taken for a run killed while making it only after
/// this long: [`Scratch::create`] names its lock microseconds after making the directory.
const UNFINISHED_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Whether a scratch-shaped directory without a lock file was last changed more than
/// [`UNFINISHED_AGE`] ago.
fn unfinished_and_stale(meta: &std::fs::Metadata) -> bool {
    meta.modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age > UNFINISHED_AGE)
}

/// Removes a directory a run was killed making: only what [`Scratch::create`] puts in it
/// before the lock gets its name — an empty `spill` directory and an empty unnamed lock file
/// — may be in it. Anything else (a file with data, a link, another name) leaves it as it is:
/// no data is ever removed without a lock taken.
fn remove_unfinished(dir: &Path) -> io::Result<()> {
    let unexpected = || io::Error::other("not an unfinished scratch directory");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let (name, kind) = (entry.file_name(), entry.file_type()?);
        let empty_file = || entry.metadata().is_ok_and(|m| m.len() == 0);
        match name.to_str() {
            Some(SPILL) if kind.is_dir() => {}
            Some(LOCK_UNNAMED) if kind.is_file() && empty_file() => {}
            _ => return Err(unexpected()),
        }
        found.push((entry.path(), kind.is_dir()));
    }
    for (path, is_dir) in found {
        match is_dir {
            // Fails unless empty: a spill directory holding anything stays.
            true => std::fs::remove_dir(path)?,
            false => std::fs::remove_file(path)?,
        }
    }
    std::fs::remove_dir(dir)
}

/// Removes `dir`'s contents, then its lock file, then `dir`.
fn remove_locked(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == LOCK {
            continue;
        }
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    std::fs::remove_file(dir.join(LOCK))?;
    std::fs::remove_dir(dir)
}

/// Whether `name` is `lakecdc-` and [`RANDOM_CHARS`] ASCII letters or digits, as
/// [`Scratch::create`] names its directories.
fn is_scratch_name(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .and_then(|n| n.strip_prefix(PREFIX))
        .is_some_and(|r| r.len() == RANDOM_CHARS && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The bytes of the files under `dir`, links not followed.
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .map(|(path, m)| {
            if m.is_dir() {
                tree_bytes(&path)
            } else {
                m.len()
            }
        })
        .sum()
}

/// A directory on a path in which another user could rename or replace an entry, so swap a
/// private directory lakecdc made or checked there for one of theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    /// Owned by neither this user nor root: its owner may do anything in it.
    Foreign(PathBuf),
    /// Writable by group or others without the sticky bit (a Kubernetes `emptyDir` is 0777).
    Shared(PathBuf),
}

/// What, of `dir` and its ancestors, another user could change ([`Untrusted`]): the first
/// foreign directory, else the first shared one; `None` when no other user can change what
/// the path names. Judged on the path as given (made absolute, so a link in it is judged
/// where it lives) and on its canonical form (where the link leads).
pub fn untrusted_ancestor(dir: &Path) -> io::Result<Option<Untrusted>> {
    let me = rustix::process::geteuid().as_raw();
    let absolute = std::path::absolute(dir)?;
    let canonical = std::fs::canonicalize(dir)?;
    let mut shared = None;
    for path in [&absolute, &canonical] {
        for a in path.ancestors() {
            let meta = std::fs::metadata(a)?;
            if meta.uid() != me && meta.uid() != 0 {
                return Ok(Some(Untrusted::Foreign(a.to_path_buf())));
            }
            if shared.is_none() && meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
                shared = Some(Untrusted::Shared(a.to_path_buf()));
            }
        }
    }
    Ok(shared)
}

/// Sets a file another writer created (DuckDB's `COPY … TO` recreates its target with the
/// process umask) to mode 0600.
pub fn restrict(path: &Path) -> io::Result<()> {
    std::fs::set_permissions(path, Permissions::from_mode(FILE_MODE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Records the length of every `write` call it gets.
    struct Calls(Vec<usize>, Vec<u8>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.push(buf.len());
            self.1.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_directory_others_may_change_is_found_among_the_ancestors() {
        let t = tempfile::tempdir().unwrap();
        let mine = t.path().join("mine");
        std::fs::create_dir_all(mine.join("deep")).unwrap();
        assert_eq!(untrusted_ancestor(&mine.join("deep")).unwrap(), None);
        // Writable by all without the sticky bit: anyone may rename `deep` away.
        std::fs::set_permissions(&mine, Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            untrusted_ancestor(&mine.join("deep")).unwrap(),
            Some(Untrusted::Shared(mine.clone()))
        );
        // The sticky bit (a shared /tmp) lets only an entry's owner rename it.
        std::fs::set_permissions(&mine, Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(untrusted_ancestor(&mine.join("deep")).unwrap(), None);
        // A link in the path is judged where it lives, and where it leads.
        std::fs::set_permissions(&mine, Permissions::from_mode(0o777)).unwrap();
        let safe = t.path().join("safe");
        std::fs::create_dir(&safe).unwrap();
        std::os::unix::fs::symlink(mine.join("deep"), safe.join("link")).unwrap();
        assert_eq!(
            untrusted_ancestor(&safe.join("link")).unwrap(),
            Some(Untrusted::Shared(mine.clone()))
        );
        std::os::unix::fs::symlink(&safe, mine.join("back")).unwrap();
        assert_eq!(
            untrusted_ancestor(&mine.join("back")).unwrap(),
            Some(Untrusted::Shared(mine.clone()))
        );
        // Owned by another user (only root can make one): foreign, whatever comes first.
        if rustix::process::geteuid().is_root() {
            let theirs = safe.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
            std::fs::create_dir(theirs.join("x")).unwrap();
            std::os::unix::fs::symlink(theirs.join("x"), mine.join("to_theirs")).unwrap();
            assert_eq!(
                untrusted_ancestor(&mine.join("to_theirs")).unwrap(),
                Some(Untrusted::Foreign(theirs.clone()))
            );
        }
        std::fs::set_permissions(&mine, Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_large_write_reaches_the_kernel_in_pieces_and_whole() {
        let data: Vec<u8> = (0..(2 * WRITE_PIECE + 1000))
            .map(|i| (i % 251) as u8)
            .collect();
        let mut w = Piecewise(Calls(Vec::new(), Vec::new()));
        w.write_all(&data).unwrap();
        w.write_all(b"tail").unwrap();
        let Calls(calls, bytes) = w.0;
        assert_eq!(calls, vec![WRITE_PIECE, WRITE_PIECE, 1000, 4]);
        assert_eq!(bytes[..data.len()], data[..]);
        assert_eq!(&bytes[data.len()..], b"tail");
    }

    #[test]
    fn the_directory_is_private_random_and_removed() {
        let parent = tempfile::tempdir().unwrap();
        let a = Scratch::create(parent.path()).unwrap();
        let b = Scratch::create(parent.path()).unwrap();
        assert_ne!(a.path(), b.path());
        for dir in [a.path().to_path_buf(), a.spill_dir()] {
            let m = std::fs::symlink_metadata(&dir).unwrap();
            assert!(m.is_dir());
            assert_eq!(m.mode() & 0o777, DIR_MODE, "{}", dir.display());
        }
        let file = a.path().join("x.parquet");
        create_file(&file).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o777, FILE_MODE);
        assert!(create_file(&file).is_err(), "an existing file is reused");
        let gone = a.path().to_path_buf();
        drop(a);
        assert!(!gone.exists());
    }

    /// A directory as a killed run leaves it: `lakecdc-<name>`, 0700, `spill`, the lock file
    /// nobody holds (unless `lock` is false) and a file of `bytes` bytes.
    fn left_over(parent: &Path, name: &str, lock: bool, bytes: usize) -> PathBuf {
        let dir = parent.join(format!("{PREFIX}{name}"));
        create_dir(&dir).unwrap();
        create_dir(&dir.join(SPILL)).unwrap();
        if lock {
            create_file(&dir.join(LOCK)).unwrap();
        }
        std::fs::write(dir.join("x.parquet"), vec![7u8; bytes]).unwrap();
        dir
    }

    #[test]
    fn a_killed_runs_directory_is_swept_and_a_live_runs_is_kept() {
        let parent = tempfile::tempdir().unwrap();
        let p = parent.path();
        let live = Scratch::create(p).unwrap();
        assert!(is_scratch_name(live.path().file_name().unwrap()));
        assert!(live.path().join(LOCK).exists());
        create_file(&live.path().join("staged.parquet")).unwrap();
        let killed = left_over(p, "k1ll3d", true, 1000);
        let killed_too = left_over(p, "Ab12Cd", true, 20);
        // A sweep killed halfway: only the lock file is left.
        let half_swept = left_over(p, "h4lf00", true, 0);
        std::fs::remove_dir_all(half_swept.join(SPILL)).unwrap();
        std::fs::remove_file(half_swept.join("x.parquet")).unwrap();
        // Not a dead run's: no lock file (a run before its lock has its name, or a user's
        // directory), a name of another shape (a user's `lakecdc-lake`), an open mode, a
        // link to a directory that looks left over.
        let unlocked = left_over(p, "n0lock", false, 10);
        let named = left_over(p, "lake", true, 10);
        let open = left_over(p, "0pen00", true, 10);
        std::fs::set_permissions(&open, Permissions::from_mode(0o755)).unwrap();
        let target = tempfile::tempdir().unwrap();
        let victim = left_over(target.path(), "v1ct1m", true, 10);
        std::os::unix::fs::symlink(&victim, p.join(format!("{PREFIX}l1nk00"))).unwrap();

        let swept = sweep_leftovers(p).unwrap();
        assert_eq!(
            swept,
            Leftovers {
                dirs: 3,
                bytes: 1020
            }
        );
        assert!(!killed.exists() && !killed_too.exists() && !half_swept.exists());
        for kept in [
            live.path(),
            &unlocked,
            &named,
            &open,
            &victim.join("x.parquet"),
        ] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(live.path().join("staged.parquet").exists());
        // The live run's lock is held until it drops; then its directory goes with it.
        assert_eq!(sweep_leftovers(p).unwrap(), Leftovers::default());
    }

    #[test]
    fn a_directory_killed_before_its_lock_was_named_is_swept_once_an_hour_old() {
        let parent = tempfile::tempdir().unwrap();
        let p = parent.path();
        // As `Scratch::create` leaves it when killed before the rename: `spill`, and maybe the
        // unnamed lock file, both empty.
        let unfinished = |name: &str, unnamed_lock: bool| {
            let dir = p.join(format!("{PREFIX}{name}"));
            create_dir(&dir).unwrap();
            create_dir(&dir.join(SPILL)).unwrap();
            if unnamed_lock {
                create_file(&dir.join(LOCK_UNNAMED)).unwrap();
            }
            dir
        };
        let age = |dir: &Path, secs: u64| {
            let then = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
            File::open(dir).unwrap().set_modified(then).unwrap();
        };
        let old = unfinished("0ld000", true);
        let old_bare = unfinished("0ld001", false);
        let fresh = unfinished("fr3sh0", true);
        // Old, but holding what a run only writes once locked: never removed without a lock.
        let with_data = unfinished("d4t400", false);
        std::fs::write(with_data.join("x.parquet"), b"rows").unwrap();
        let with_spill = unfinished("sp1ll0", false);
        std::fs::write(with_spill.join(SPILL).join("s"), b"rows").unwrap();
        let written_lock = unfinished("l0ck00", false);
        std::fs::write(written_lock.join(LOCK_UNNAMED), b"x").unwrap();
        for dir in [&old, &old_bare, &with_data, &with_spill, &written_lock] {
            age(dir, 2 * 3600);
        }
        age(&fresh, 60);

        let swept = sweep_leftovers(p).unwrap();
        assert_eq!(swept, Leftovers { dirs: 2, bytes: 0 });
        assert!(!old.exists() && !old_bare.exists());
        for kept in [
            fresh.join(LOCK_UNNAMED),
            with_data.join("x.parquet"),
            with_spill.join(SPILL).join("s"),
            written_lock.join(LOCK_UNNAMED),
        ] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
    }

    #[test]
    fn nothing_is_swept_where_others_may_rename_directories() {
        let parent = tempfile::tempdir().unwrap();
        let p = parent.path();
        let killed = left_over(p, "k1ll3d", true, 10);
        std::fs::set_permissions(p, Permissions::from_mode(0o777)).unwrap();
        assert_eq!(sweep_leftovers(p).unwrap(), Leftovers::default());
        assert!(killed.exists());
        // With the sticky bit (a shared /tmp) others cannot rename what is ours.
        std::fs::set_permissions(p, Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(sweep_leftovers(p).unwrap().dirs, 1);
        assert!(!killed.exists());
    }

    #[test]
    fn a_planted_link_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(create_file(&link).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
}

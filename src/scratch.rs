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
//! run holds an exclusive lock on `<dir>/.lock` for its life; the kernel drops it when the
//! process dies, so the next run in the same `--work-dir` removes every directory of its own
//! (same owner, mode 0700, `lakecdc-` name) whose lock it can take ([`sweep_leftovers`]).

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Mode of the scratch directory and of the spill directory inside it.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every scratch file.
pub const FILE_MODE: u32 = 0o600;
const SPILL: &str = "spill";
const PREFIX: &str = "lakecdc-";
/// The file each run holds an exclusive lock on while its directory is in use.
const LOCK: &str = ".lock";
/// A directory without a lock file belongs to a run only in the instant between its creation
/// and its lock (or to a release from before the lock); one unchanged for this long is left
/// over.
const UNLOCKED_AGE: Duration = Duration::from_secs(24 * 3600);

/// A private scratch directory for one run, removed (with everything in it) on drop.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    /// Locked for the run's life: a directory whose lock can be taken is left over.
    _lock: File,
}

impl Scratch {
    /// Creates `<parent>/lakecdc-<random>` (mode 0700), locks its `.lock` and creates its
    /// `spill` subdirectory.
    pub fn create(parent: &Path) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .permissions(Permissions::from_mode(DIR_MODE))
            .tempdir_in(parent)?;
        let lock = create_file(&dir.path().join(LOCK))?;
        lock.try_lock().map_err(io::Error::from)?;
        create_dir(&dir.path().join(SPILL))?;
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

/// What [`sweep_leftovers`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leftovers {
    /// Directories removed.
    pub dirs: u64,
    /// The bytes of the files in them.
    pub bytes: u64,
}

/// Removes the scratch directories under `parent` that runs killed before their cleanup left
/// behind: directories named `lakecdc-…`, owned by this user, mode 0700 (as [`Scratch::create`]
/// makes them; never a link, never another user's), whose `.lock` no live run holds — or,
/// without a lock file, unchanged for [`UNLOCKED_AGE`]. The lock is held while removing, so
/// two runs never sweep one directory at once. A directory that cannot be judged or removed
/// is left as it is.
pub fn sweep_leftovers(parent: &Path) -> io::Result<Leftovers> {
    let uid = rustix::process::geteuid().as_raw();
    let mut out = Leftovers::default();
    for entry in std::fs::read_dir(parent)? {
        let Ok(entry) = entry else { continue };
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        // The entry's own metadata: a link is a link, never its target.
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o777 != DIR_MODE {
            continue;
        }
        let dir = entry.path();
        let _held = match File::open(dir.join(LOCK)) {
            Ok(lock) => match lock.try_lock() {
                Ok(()) => Some(lock),
                Err(_) => continue,
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let unchanged = meta
                    .modified()
                    .ok()
                    .and_then(|m| SystemTime::now().duration_since(m).ok());
                if unchanged.is_none_or(|age| age < UNLOCKED_AGE) {
                    continue;
                }
                None
            }
            Err(_) => continue,
        };
        let bytes = tree_bytes(&dir);
        if std::fs::remove_dir_all(&dir).is_ok() {
            out.dirs += 1;
            out.bytes += bytes;
        }
    }
    Ok(out)
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

/// Sets a file another writer created (DuckDB's `COPY … TO` recreates its target with the
/// process umask) to mode 0600.
pub fn restrict(path: &Path) -> io::Result<()> {
    std::fs::set_permissions(path, Permissions::from_mode(FILE_MODE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

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

    /// A directory as a killed run leaves it: `lakecdc-<name>`, 0700, a `.lock` nobody holds
    /// (unless `lock` is false) and a file of `bytes` bytes.
    fn left_over(parent: &Path, name: &str, lock: bool, bytes: usize) -> PathBuf {
        let dir = parent.join(format!("{PREFIX}{name}"));
        create_dir(&dir).unwrap();
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
        create_file(&live.path().join("staged.parquet")).unwrap();
        let killed = left_over(p, "killed", true, 1000);
        // Without a lock file: fresh (a run between its mkdir and its lock) or a day old.
        let fresh = left_over(p, "fresh", false, 10);
        let old = left_over(p, "old", false, 20);
        File::open(&old)
            .unwrap()
            .set_modified(SystemTime::now() - UNLOCKED_AGE - Duration::from_secs(60))
            .unwrap();
        // Not made by lakecdc: another name, an open mode, a link to a directory that looks
        // left over.
        let other = parent.path().join("other");
        create_dir(&other).unwrap();
        let open = left_over(p, "open", true, 10);
        std::fs::set_permissions(&open, Permissions::from_mode(0o755)).unwrap();
        let target = tempfile::tempdir().unwrap();
        let victim = left_over(target.path(), "victim", true, 10);
        std::os::unix::fs::symlink(&victim, p.join(format!("{PREFIX}link"))).unwrap();

        let swept = sweep_leftovers(p).unwrap();
        assert_eq!(
            swept,
            Leftovers {
                dirs: 2,
                bytes: 1020
            }
        );
        assert!(!killed.exists() && !old.exists());
        for kept in [
            live.path(),
            &fresh,
            &other,
            &open,
            &victim,
            &victim.join("x.parquet"),
        ] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(live.path().join("staged.parquet").exists());
        // The live run's lock is held until it drops; then its directory goes with it.
        assert_eq!(sweep_leftovers(p).unwrap(), Leftovers::default());
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

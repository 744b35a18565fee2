//! Local scratch space: one private directory per run (docs/security.md, "Local files").
//!
//! Every temporary file a job writes (exports before upload, downloads before a merge or a
//! check) and DuckDB's spill directory live in one directory with a random name, created
//! mode 0700 under `--work-dir` and removed when the run ends. Other users of the host can
//! neither read what lakecdc stages nor plant a file or a link at a name it will open: the
//! name is unpredictable, the directory is created by lakecdc (never reused), and files inside
//! are created with `create_new` and mode 0600.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the scratch directory and of the spill directory inside it.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every scratch file.
pub const FILE_MODE: u32 = 0o600;
const SPILL: &str = "spill";

/// A private scratch directory for one run, removed (with everything in it) on drop.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    /// Creates `<parent>/lakecdc-<random>` (mode 0700) and its `spill` subdirectory.
    pub fn create(parent: &Path) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("lakecdc-")
            .permissions(Permissions::from_mode(DIR_MODE))
            .tempdir_in(parent)?;
        create_dir(&dir.path().join(SPILL))?;
        Ok(Self { dir })
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

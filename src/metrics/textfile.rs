//! The metrics file for node-exporter's textfile collector: written whole to a temporary file
//! beside it and renamed over it, so a concurrent reader sees the previous file or the new one,
//! never a part (docs/operations.md, "Metrics").

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The most of a previous metrics file read back (for its last-success sample).
const PREVIOUS_LIMIT: u64 = 1024 * 1024;

/// `template` with every `{job}` replaced by `job` (bytes, so any path works).
pub fn path_for(template: &Path, job: &str) -> PathBuf {
    let bytes = template.as_os_str().as_bytes();
    let pattern = b"{job}";
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(pattern) {
            out.extend_from_slice(job.as_bytes());
            i += pattern.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// The directory a metrics file goes in (its parent, `.` for a bare name).
pub fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Why `path` cannot be the metrics file: a device, FIFO, socket or directory is there, which
/// renaming over would replace — `/dev/null` among them (docs/hazards.md S22). `None` when
/// the path is free, a regular file or a link (a link is replaced, not followed: S14).
pub fn occupied(path: &Path) -> Option<String> {
    let kind = std::fs::symlink_metadata(path).ok()?.file_type();
    use std::os::unix::fs::FileTypeExt;
    // A link is replaced, not followed (S14): the link itself is what the rename removes.
    let what = if kind.is_file() || kind.is_symlink() {
        return None;
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Some(format!(
        "{} is {what}, which writing the metrics (a rename over the path) would replace: name a file of lakecdc's own, such as lakecdc_{{job}}.prom in the textfile collector's directory, or leave --metrics-file out",
        path.display()
    ))
}

/// The previous file's text, when there is one (at most 1 MiB is read; a character cut by the
/// limit does not lose the rest). Only a regular file at the path itself counts: the directory
/// may be shared (docs/security.md S14), so a link is not followed and a FIFO or device is
/// opened without waiting for a writer and then left unread.
pub fn previous(path: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .ok()?;
    // A regular file's reads ignore O_NONBLOCK.
    if !file.metadata().ok()?.is_file() {
        tracing::warn!(path = %path.display(), "the metrics file is not a regular file: its last-success sample is not carried over");
        return None;
    }
    let mut bytes = Vec::new();
    file.take(PREVIOUS_LIMIT).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Writes `text` to `path` atomically: a new temporary file in the same directory (created
/// exclusively, so nothing another user placed there is followed or overwritten), made
/// readable by the collector (0644), synced, then renamed over `path`.
pub fn write(path: &Path, text: &str) -> Result<()> {
    let dir = directory_of(path);
    let failed = |op: &'static str| {
        move |e: std::io::Error| Error::Metrics {
            op,
            target: path.display().to_string(),
            reason: e.to_string(),
        }
    };
    // node-exporter reads only `*.prom`: the temporary file's name never ends so.
    let mut tmp = tempfile::Builder::new()
        .prefix(".lakecdc-metrics-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(failed("create a temporary file beside"))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(failed("set the permissions of the temporary file of"))?;
    tmp.write_all(text.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(failed("write the temporary file of"))?;
    // Checked again here: the path may have changed since the run started.
    if let Some(why) = occupied(path) {
        return Err(Error::Metrics {
            op: "write",
            target: path.display().to_string(),
            reason: why,
        });
    }
    tmp.persist(path)
        .map_err(|e| failed("rename the temporary file over")(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    fn make_fifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    }

    #[test]
    fn the_job_placeholder_is_replaced_everywhere() {
        assert_eq!(
            path_for(Path::new("/var/lib/tc/lakecdc_{job}.prom"), "flush"),
            PathBuf::from("/var/lib/tc/lakecdc_flush.prom")
        );
        assert_eq!(
            path_for(Path::new("/m/{job}/{job}.prom"), "gc"),
            PathBuf::from("/m/gc/gc.prom")
        );
        assert_eq!(path_for(Path::new("x.prom"), "gc"), PathBuf::from("x.prom"));
        assert_eq!(directory_of(Path::new("x.prom")), Path::new("."));
    }

    #[test]
    fn a_device_fifo_directory_or_link_at_the_path_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f.prom");
        make_fifo(&fifo);
        let sub = dir.path().join("d.prom");
        std::fs::create_dir(&sub).unwrap();
        for (path, kind) in [
            (Path::new("/dev/null"), "a device"),
            (fifo.as_path(), "a FIFO"),
            (sub.as_path(), "a directory"),
        ] {
            let why = occupied(path).unwrap();
            assert!(why.contains(kind), "{why}");
            let before = std::fs::symlink_metadata(path).unwrap().file_type();
            let err = write(path, "a 1\n").unwrap_err().to_string();
            assert!(err.contains(kind), "{err}");
            assert_eq!(std::fs::symlink_metadata(path).unwrap().file_type(), before);
        }
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        let file = dir.path().join("m.prom");
        assert_eq!(occupied(&file), None);
        write(&file, "a 1\n").unwrap();
        assert_eq!(occupied(&file), None);
        // No temporary file is left beside them.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["d.prom", "f.prom", "m.prom"]);
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        write(&path, "a 1\n").unwrap();
        write(&path, "b 2\n").unwrap();
        assert_eq!(previous(&path).as_deref(), Some("b 2\n"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("m.prom")]);
    }

    #[test]
    fn a_fifo_or_a_link_at_the_path_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.prom");
        make_fifo(&fifo);
        // Opened without waiting for a writer (a plain open would block forever).
        assert_eq!(previous(&fifo), None);
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "lakecdc_last_success_timestamp_seconds 7\n").unwrap();
        let link = dir.path().join("link.prom");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(previous(&link), None);
        // The run's own write replaces the link with a regular file and leaves the FIFO be
        // (see the test below).
        write(&link, "a 1\n").unwrap();
        assert_eq!(previous(&link).as_deref(), Some("a 1\n"));
    }

    #[test]
    fn a_concurrent_reader_sees_one_whole_file_or_the_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        let a = "a 1\n".repeat(50_000);
        let b = "b 2\n".repeat(70_000);
        write(&path, &a).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, a, b, stop) = (path.clone(), a.clone(), b.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let text = std::fs::read_to_string(&path).unwrap();
                    assert!(
                        text == a || text == b,
                        "a part of a file: {} bytes",
                        text.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..100 {
            write(&path, if i % 2 == 0 { &b } else { &a }).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn a_symlink_at_the_path_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, "keep").unwrap();
        let path = dir.path().join("m.prom");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write(&path, "a 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 1\n");
    }
}

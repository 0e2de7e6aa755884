//! Writing a file so that it appears whole or not at all: capture chunks, and the CLI's pages
//! and timelines.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Temporaries made by this process so far: with the process id, a name no other writer uses.
static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

/// Writes the file at `path` through `write`, so that a reader sees the old file (or none) until
/// the new one is complete, and a crash or an error never leaves a partial file under `path`.
///
/// The bytes go to a new temporary file in the same directory (`.NAME.PID.N.partial`, created
/// with the permissions any new file gets), which is flushed and synced to disk, then renamed
/// over `path` (replacing a file already there); on Unix the directory is synced as well, so the
/// rename itself survives a power cut. On any error, the one `write` returns included, the
/// temporary is removed and the error returned; `path` is then as it was.
///
/// ```
/// use std::io::Write as _;
///
/// # fn main() -> std::io::Result<()> {
/// let path = std::env::temp_dir().join(format!("atomic-doc-{}.txt", std::process::id()));
/// trace_runtime::write_atomically(&path, |out| out.write_all(b"whole or not at all"))?;
/// assert_eq!(std::fs::read_to_string(&path)?, "whole or not at all");
///
/// let failed = trace_runtime::write_atomically(&path, |out| {
///     out.write_all(b"half")?;
///     Err(std::io::Error::other("disk full"))
/// });
/// assert!(failed.is_err());
/// assert_eq!(std::fs::read_to_string(&path)?, "whole or not at all");
/// # std::fs::remove_file(&path)
/// # }
/// ```
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(
        ".{}.{}.partial",
        std::process::id(),
        TEMPORARIES.fetch_add(1, Ordering::Relaxed)
    ));
    let temporary = path.with_file_name(temporary_name);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)?;
    let written = fill(file, write).and_then(|()| fs::rename(&temporary, path));
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    sync_directory(path)
}

/// Writes, flushes and syncs the temporary file.
fn fill(file: File, write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> io::Result<()> {
    let mut out = BufWriter::new(file);
    write(&mut out)?;
    out.into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()
}

/// Syncs the directory holding `path`, so that the rename is on disk too (Unix; elsewhere the
/// file system orders it, or offers no way to ask).
fn sync_directory(path: &Path) -> io::Result<()> {
    if cfg!(unix) {
        let dir: PathBuf = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("atomic-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_file_appears_whole() {
        let dir = scratch("whole");
        let path = dir.join("out.json");
        write_atomically(&path, |out| {
            out.write_all(b"{\"a\":")?;
            assert!(
                !path.exists(),
                "nothing under the name until it is complete"
            );
            out.write_all(b"1}")
        })
        .unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "{\"a\":1}");
        assert_eq!(entries(&dir), ["out.json"], "no temporary left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_error_leaves_no_temporary_and_the_old_file() {
        let dir = scratch("error");
        let path = dir.join("out.json");
        let failed = write_atomically(&path, |out| {
            out.write_all(b"{\"traceEvents\":[")?;
            Err(io::Error::other("disk full"))
        });
        assert_eq!(failed.unwrap_err().to_string(), "disk full");
        assert!(entries(&dir).is_empty(), "no file, no temporary");

        fs::write(&path, "old").unwrap();
        let failed = write_atomically(&path, |out| {
            out.write_all(&[b'x'; 100_000])?;
            Err(io::Error::other("disk full"))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(entries(&dir), ["out.json"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_existing_file_is_replaced() {
        let dir = scratch("replace");
        let path = dir.join("page.html");
        fs::write(&path, "an older and longer page").unwrap();
        write_atomically(&path, |out| out.write_all(b"new")).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(entries(&dir), ["page.html"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn the_file_gets_the_permissions_of_a_new_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = scratch("mode");
        let plain = dir.join("plain");
        File::create(&plain).unwrap();
        let atomic = dir.join("atomic");
        write_atomically(&atomic, |out| out.write_all(b"x")).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&atomic), mode(&plain));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_without_a_file_name_is_an_error() {
        assert!(write_atomically(Path::new("/"), |_| Ok(())).is_err());
    }
}

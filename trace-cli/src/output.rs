//! Writing results on stdout: a closed pipe (`model-trace summary … | head`) ends the output
//! quietly instead of panicking; into files, whole or not at all; and file sizes, for messages.

use std::fs::File;
use std::io::{self, BufWriter, ErrorKind, Write as _};
use std::path::Path;

/// Writes `text` on stdout; a reader that went away is not an error.
pub(crate) fn emit(text: &str) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != ErrorKind::BrokenPipe => {
            Err(format!("writing the output: {error}"))
        }
        _ => Ok(()),
    }
}

/// `value` as pretty JSON and a newline, on stdout.
pub(crate) fn emit_json(value: &impl serde::Serialize) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    text.push('\n');
    emit(&text)
}

/// Writes the file at `path` through `write`, whole or not at all
/// ([`trace_runtime::write_atomically`]); the error names the file.
pub(crate) fn write_file(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> Result<(), String> {
    trace_runtime::write_atomically(path, write)
        .map_err(|error| format!("writing {}: {error}", path.display()))
}

/// The size of a file, for messages: two or three significant digits, in kB below 1 MB.
pub(crate) fn file_size(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let (kb, mb) = (bytes as f64 / 1e3, bytes as f64 / 1e6);
    match bytes {
        0..1_000 => format!("{bytes} bytes"),
        1_000..1_000_000 => format!("{kb:.0} kB"),
        1_000_000..10_000_000 => format!("{mb:.1} MB"),
        _ => format!("{mb:.0} MB"),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::{self, Write as _};

    use super::{file_size, write_file};

    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = std::env::temp_dir().join(format!("model-trace-output-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        let failed = write_file(&path, |out| {
            out.write_all(b"{\"traceEvents\":[")?;
            Err(io::Error::other("disk full"))
        });
        assert!(failed.unwrap_err().contains("out.json: disk full"));
        assert_eq!(
            fs::read_dir(&dir).unwrap().count(),
            0,
            "no file, no temporary"
        );
        write_file(&path, |out| out.write_all(b"{}")).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "{}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_sizes_keep_their_digits() {
        assert_eq!(file_size(512), "512 bytes");
        assert_eq!(file_size(47_093), "47 kB");
        assert_eq!(file_size(1_234_567), "1.2 MB");
        assert_eq!(file_size(277_000_000), "277 MB");
    }
}

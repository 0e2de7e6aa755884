//! Reading trace files, with a progress bar for the large ones and errors that say which file
//! and line.

use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use trace_runtime::{Event, ReadError, TraceHeader, TraceReader};

/// Files above this size show a progress bar (on a terminal).
const PROGRESS_BYTES: u64 = 32 << 20;

/// A problem with the input: the message names the file (and line).
pub(crate) type InputError = String;

/// What reading a whole file gave besides its events.
#[derive(Debug, Default)]
pub(crate) struct ReadNotes {
    /// The file ended in a cut line (a crash); every complete event was read.
    pub(crate) truncated: Option<String>,
    /// Bytes read.
    pub(crate) bytes: u64,
}

/// Opens `path`, reads its header, and hands each event (with the header) to `each`. A cut last
/// line is noted, any other bad line is an error naming it.
pub(crate) fn read(
    path: &Path,
    mut each: impl FnMut(&TraceHeader, Event),
) -> Result<(TraceHeader, ReadNotes), InputError> {
    let mut reader = TraceReader::open(path).map_err(|e| e.to_string())?;
    let header = reader.header().clone();
    let total = std::fs::metadata(path).map_or(0, |m| m.len());
    let progress = progress_bar(path, total);
    let mut notes = ReadNotes::default();
    let mut count = 0u64;
    while let Some(event) = reader.next() {
        match event {
            Ok(event) => each(&header, event),
            Err(error @ ReadError::Truncated { .. }) => notes.truncated = Some(error.to_string()),
            Err(error) => return Err(error.to_string()),
        }
        count += 1;
        if count.is_multiple_of(4096) {
            if let Some(bar) = &progress {
                bar.set_position(reader.bytes_read());
            }
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    notes.bytes = reader.bytes_read();
    Ok((header, notes))
}

fn progress_bar(path: &Path, total: u64) -> Option<ProgressBar> {
    use std::io::IsTerminal as _;
    if total < PROGRESS_BYTES || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{msg} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(path.display().to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
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
    use super::file_size;

    #[test]
    fn file_sizes_keep_their_digits() {
        assert_eq!(file_size(512), "512 bytes");
        assert_eq!(file_size(47_093), "47 kB");
        assert_eq!(file_size(1_234_567), "1.2 MB");
        assert_eq!(file_size(277_000_000), "277 MB");
    }
}

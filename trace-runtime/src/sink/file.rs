//! The trace-file writer: the header and every event as one line of JSON each.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{SinkError, TraceSink};
use crate::record::{Event, TraceHeader};

/// Buffer between the events and the file: a write to the file every 256 KiB, and at the end
/// of every forward pass.
const BUFFER_BYTES: usize = 256 << 10;

/// Writes a trace file (format in `docs/trace-format.md`).
///
/// Events are encoded on the recording thread into a buffer; the buffer goes to the file when
/// it is full, at the end of every forward pass and when the session ends, so a run that
/// crashes leaves a file that reads up to its last complete line. A write that fails stops the
/// sink; the session reports it.
///
/// A session makes one for [`SessionBuilder::trace_file`](crate::SessionBuilder::trace_file)
/// and `MODEL_TRACE_OUT`; it is public for writing a trace to a path of one's own choosing
/// (no naming rule) through [`SessionBuilder::sink`](crate::SessionBuilder::sink).
#[derive(Debug)]
pub struct TraceFileSink {
    path: PathBuf,
    out: BufWriter<File>,
    line: Vec<u8>,
}

impl TraceFileSink {
    /// Creates (or replaces) the file at `path`.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path)?;
        Ok(Self {
            path,
            out: BufWriter::with_capacity(BUFFER_BYTES, file),
            line: Vec::with_capacity(4096),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_line(&mut self) -> io::Result<()> {
        self.line.push(b'\n');
        let result = self.out.write_all(&self.line);
        self.line.clear();
        result
    }

    fn fail(&self, error: impl std::fmt::Display) -> SinkError {
        format!("writing {}: {error}", self.path.display()).into()
    }
}

impl TraceSink for TraceFileSink {
    fn name(&self) -> Cow<'_, str> {
        Cow::Owned(format!("trace file {}", self.path.display()))
    }

    fn start(&mut self, header: &TraceHeader) -> Result<(), SinkError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, header).map_err(|e| self.fail(e))?;
        // `{"event":"header",...}`: every line of the file names its kind first.
        self.line
            .splice(..1, b"{\"event\":\"header\",".iter().copied());
        self.write_line().map_err(|e| self.fail(e))
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        // Straight into the buffer: a line split across two writes to the file is what a
        // crash can leave anyway, and the reader reports it.
        serde_json::to_writer(&mut self.out, event).map_err(|e| self.fail(e))?;
        self.out.write_all(b"\n").map_err(|e| self.fail(e))?;
        if matches!(event, Event::PassEnd(_)) {
            self.out.flush().map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.out.flush().map_err(|e| self.fail(e))
    }

    fn wants_digests(&self) -> bool {
        true
    }
}

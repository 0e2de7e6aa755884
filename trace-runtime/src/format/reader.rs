//! Reading a trace file back: its header, then a streaming iterator of typed events.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use std::collections::{BTreeMap, VecDeque};

use super::golden::{golden_header, GoldenDecoder};
use crate::record::{Event, EventKind, TraceHeader, FORMAT_NAME, SCHEMA_VERSION};

/// Why a trace (or a line of it) cannot be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadError {
    /// The file cannot be read.
    Io {
        /// Which file (or `<input>`).
        source_name: String,
        /// Why.
        source: io::Error,
    },
    /// The input is empty: there is no header line.
    Empty {
        /// Which file.
        source_name: String,
    },
    /// The first line is not a model-trace header.
    NotATrace {
        /// Which file.
        source_name: String,
        /// What was found instead.
        reason: String,
    },
    /// The file was written with a newer schema than this reader knows.
    UnsupportedSchema {
        /// Which file.
        source_name: String,
        /// Its schema version.
        found: u32,
    },
    /// The last line is incomplete, as when the writing program crashed or was killed: every
    /// event before it was read. Not fatal; the iterator ends after it.
    Truncated {
        /// Which file.
        source_name: String,
        /// The line number (1-based).
        line: usize,
    },
    /// A complete line that is not a valid event.
    Malformed {
        /// Which file.
        source_name: String,
        /// The line number (1-based).
        line: usize,
        /// What was expected and found.
        reason: String,
    },
}

impl ReadError {
    /// Whether reading can go on after this error (only a cut last line, which ends the file).
    pub fn is_truncation(&self) -> bool {
        matches!(self, Self::Truncated { .. })
    }

    /// The line it is about, when there is one.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Truncated { line, .. } | Self::Malformed { line, .. } => Some(*line),
            Self::NotATrace { .. } | Self::UnsupportedSchema { .. } => Some(1),
            Self::Io { .. } | Self::Empty { .. } => None,
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { source_name, source } => write!(f, "{source_name}: {source}"),
            Self::Empty { source_name } => write!(f, "{source_name}: empty, not a trace file (no header line)"),
            Self::NotATrace { source_name, reason } => {
                write!(f, "{source_name}:1: not a model-trace file: {reason}")
            }
            Self::UnsupportedSchema { source_name, found } => write!(
                f,
                "{source_name}:1: written with trace schema {found}, but this reader knows schema {SCHEMA_VERSION} and older; \
                 upgrade model-trace to read it"
            ),
            Self::Truncated { source_name, line } => write!(
                f,
                "{source_name}:{line}: the last line is cut short (the writer stopped mid-line); \
                 every event before it was read"
            ),
            Self::Malformed { source_name, line, reason } => write!(f, "{source_name}:{line}: {reason}"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A trace file read line by line: [`header`](Self::header), then the events as an iterator.
///
/// The iterator yields every complete event; a last line cut short (a crash) is yielded as
/// [`ReadError::Truncated`] and ends the iteration; any other bad line is
/// [`ReadError::Malformed`], naming the line and what was expected, and reading goes on with
/// the next line. Nothing in the input makes it panic.
///
/// ```no_run
/// # use trace_runtime as model_trace;
/// use model_trace::{Event, TraceReader};
///
/// let mut trace = TraceReader::open("smollm.ndjson")?;
/// println!("{} tracepoints", trace.header().tracepoints.len());
/// for event in &mut trace {
///     if let Event::PassEnd(end) = event? {
///         println!("pass {}: {} anomalies", end.pass, end.anomalies.len());
///     }
/// }
/// # Ok::<(), model_trace::ReadError>(())
/// ```
pub struct TraceReader<R> {
    input: R,
    source_name: String,
    header: TraceHeader,
    line: usize,
    buffer: String,
    done: bool,
    bytes_read: u64,
    /// For a golden file: its lines' decoder, and the events of a line not yet handed out.
    golden: Option<(GoldenDecoder, VecDeque<Event>)>,
    /// Events of kinds this reader does not know, passed over (schema 3 on), by kind.
    unknown_events: BTreeMap<String, usize>,
}

impl<R> fmt::Debug for TraceReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceReader")
            .field("source", &self.source_name)
            .field("line", &self.line)
            .field("bytes_read", &self.bytes_read)
            .finish_non_exhaustive()
    }
}

impl TraceReader<BufReader<File>> {
    /// Opens the trace file at `path` and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadError> {
        let path = path.as_ref();
        let source_name = path.display().to_string();
        let file = File::open(path).map_err(|source| ReadError::Io {
            source_name: source_name.clone(),
            source,
        })?;
        Self::with_name(BufReader::with_capacity(1 << 20, file), source_name)
    }
}

impl<R: BufRead> TraceReader<R> {
    /// Reads the header of a trace from `input`.
    pub fn new(input: R) -> Result<Self, ReadError> {
        Self::with_name(input, "<input>".to_owned())
    }

    /// Like [`new`](Self::new), naming the input `source_name` in errors.
    pub fn with_name(input: R, source_name: String) -> Result<Self, ReadError> {
        let mut reader = Self {
            input,
            source_name,
            header: TraceHeader::placeholder(),
            line: 0,
            buffer: String::new(),
            done: false,
            bytes_read: 0,
            golden: None,
            unknown_events: BTreeMap::new(),
        };
        let complete = match reader.next_line()? {
            Some(complete) => complete,
            None => {
                return Err(ReadError::Empty {
                    source_name: reader.source_name,
                })
            }
        };
        let (header, golden) = reader.parse_header(complete)?;
        reader.header = header;
        reader.golden = golden.then(Default::default);
        Ok(reader)
    }

    /// The header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Events of kinds this reader does not know, by kind, with how many were passed over so
    /// far. In a file of schema 3 or newer such an event is skipped, not an error (a kind that
    /// readers may skip needs no new schema; see `docs/trace-format.md`, *How the schema version
    /// moves*): a tool says what it did not read from here. In older files it is an error.
    pub fn unknown_events(&self) -> &BTreeMap<String, usize> {
        &self.unknown_events
    }

    /// Bytes read so far (for progress).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// The name errors use for the input.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Reads the next line into the buffer; `Some(complete)` (whether it ended in a newline),
    /// `None` at the end.
    fn next_line(&mut self) -> Result<Option<bool>, ReadError> {
        self.buffer.clear();
        let read = self.input.read_line(&mut self.buffer).map_err(|source| {
            let kind = source.kind();
            ReadError::Io {
                source_name: self.source_name.clone(),
                source: if kind == io::ErrorKind::InvalidData {
                    io::Error::new(kind, format!("line {} is not UTF-8", self.line + 1))
                } else {
                    source
                },
            }
        })?;
        if read == 0 {
            return Ok(None);
        }
        self.line += 1;
        self.bytes_read += read as u64;
        let complete = self.buffer.ends_with('\n');
        while self.buffer.ends_with('\n') || self.buffer.ends_with('\r') {
            self.buffer.pop();
        }
        Ok(Some(complete))
    }

    /// The header, and whether it is a golden file's.
    fn parse_header(&self, complete: bool) -> Result<(TraceHeader, bool), ReadError> {
        let not_a_trace = |reason: String| ReadError::NotATrace {
            source_name: self.source_name.clone(),
            reason,
        };
        let value: serde_json::Value = serde_json::from_str(&self.buffer).map_err(|e| {
            if complete {
                not_a_trace(format!("the first line is not JSON ({e})"))
            } else {
                not_a_trace(format!("the header line is cut short ({e})"))
            }
        })?;
        if let Some(golden) = golden_header(&value) {
            return golden
                .map(|header| (header.trace_header(), true))
                .map_err(not_a_trace);
        }
        match value.get("format").and_then(serde_json::Value::as_str) {
            Some(FORMAT_NAME) => {}
            Some(other) => return Err(not_a_trace(format!("its format is {other:?}"))),
            None => {
                return Err(not_a_trace(
                    "the first line has no \"format\" field".to_owned(),
                ))
            }
        }
        if let Some(found) = value.get("schema").and_then(serde_json::Value::as_u64) {
            if found > u64::from(SCHEMA_VERSION) {
                return Err(ReadError::UnsupportedSchema {
                    source_name: self.source_name.clone(),
                    found: u32::try_from(found).unwrap_or(u32::MAX),
                });
            }
        }
        serde_json::from_value(value)
            .map(|header| (header, false))
            .map_err(|e| not_a_trace(format!("bad header: {e}")))
    }

    /// The next event of a golden file.
    fn next_golden(&mut self) -> Option<Result<Event, ReadError>> {
        loop {
            if let Some(event) = self.golden.as_mut()?.1.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let complete = match self.next_line() {
                Ok(Some(complete)) => complete,
                Ok(None) => {
                    self.done = true;
                    return self.golden.as_mut()?.0.finish().map(Ok);
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            };
            if self.buffer.trim().is_empty() {
                continue;
            }
            let (decoder, pending) = self.golden.as_mut()?;
            match decoder.line(&self.buffer) {
                Ok(events) => pending.extend(events),
                Err(_) if !complete => {
                    self.done = true;
                    return Some(Err(ReadError::Truncated {
                        source_name: self.source_name.clone(),
                        line: self.line,
                    }));
                }
                Err(reason) => {
                    return Some(Err(ReadError::Malformed {
                        source_name: self.source_name.clone(),
                        line: self.line,
                        reason,
                    }))
                }
            }
        }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Event, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.golden.is_some() {
            return self.next_golden();
        }
        if self.done {
            return None;
        }
        loop {
            let complete = match self.next_line() {
                Ok(Some(complete)) => complete,
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            };
            if self.buffer.trim().is_empty() {
                continue;
            }
            return Some(match parse_event(&self.buffer) {
                Ok(event) => Ok(event),
                Err(LineError::UnknownKind(kind)) if complete && self.skips_unknown_kinds() => {
                    *self.unknown_events.entry(kind).or_default() += 1;
                    continue;
                }
                Err(_) if !complete => {
                    self.done = true;
                    Err(ReadError::Truncated {
                        source_name: self.source_name.clone(),
                        line: self.line,
                    })
                }
                Err(error) => Err(ReadError::Malformed {
                    source_name: self.source_name.clone(),
                    line: self.line,
                    reason: error.to_string(),
                }),
            });
        }
    }
}

impl<R> TraceReader<R> {
    /// Whether an event of an unknown kind is passed over: from schema 3, whose readers may
    /// skip one; before it, a writer that added a kind also raised the schema.
    fn skips_unknown_kinds(&self) -> bool {
        self.header.schema >= 3
    }
}

/// Why an event line does not read.
#[derive(Debug)]
pub(crate) enum LineError {
    /// A well-formed line of a kind this reader does not know.
    UnknownKind(String),
    /// Anything else: what was expected.
    Malformed(String),
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKind(kind) => {
                write!(f, "unknown event {kind:?} (expected {})", kind_list())
            }
            Self::Malformed(reason) => f.write_str(reason),
        }
    }
}

/// One event line. Writers put the `event` tag first, which lets the line be read straight
/// into its kind's type; a line with the tag elsewhere takes a slower path.
pub(crate) fn parse_event(line: &str) -> Result<Event, LineError> {
    let kind = leading_tag(line).map(str::to_owned).or_else(|| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        value.get("event")?.as_str().map(str::to_owned)
    });
    let Some(kind) = kind else {
        return Err(LineError::Malformed(
            match serde_json::from_str::<serde_json::Value>(line) {
                Err(e) => format!("not JSON: {e}"),
                Ok(serde_json::Value::Object(_)) => {
                    "an object without an \"event\" field".to_owned()
                }
                Ok(_) => "expected an object with an \"event\" field".to_owned(),
            },
        ));
    };
    let typed = |result: Result<Event, serde_json::Error>| {
        result.map_err(|e| LineError::Malformed(format!("bad {kind:?} event: {e}")))
    };
    match EventKind::from_name(&kind) {
        Some(kind) => typed(kind.parse(line)),
        None if kind == "header" => Err(LineError::Malformed("a second header line".to_owned())),
        // A known kind is checked as JSON by its parser; an unknown one only here, so that a
        // line cut short is not taken for an unknown event.
        None => match serde_json::from_str::<serde_json::Value>(line) {
            Ok(_) => Err(LineError::UnknownKind(kind)),
            Err(e) => Err(LineError::Malformed(format!("bad {kind:?} event: {e}"))),
        },
    }
}

/// `pass_begin, pass_end, ... or session_end`.
fn kind_list() -> String {
    let names: Vec<&str> = EventKind::ALL.iter().map(|kind| kind.as_str()).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The tag of a line that starts `{"event":"<tag>"`.
fn leading_tag(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("{\"event\":\"")?;
    let end = rest.find('"')?;
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{SessionEnd, FORMAT_NAME};

    /// A trace of `schema` whose events are `lines`.
    fn trace(schema: u32, lines: &[&str]) -> String {
        let header = TraceHeader {
            format: FORMAT_NAME.to_owned(),
            schema,
            ..TraceHeader::placeholder()
        };
        let mut text = serde_json::to_string(&header).unwrap();
        text.insert_str(1, "\"event\":\"header\",");
        for line in lines {
            text.push('\n');
            text.push_str(line);
        }
        text.push('\n');
        text
    }

    fn read(text: &str) -> (Vec<Result<Event, ReadError>>, BTreeMap<String, usize>) {
        let mut reader = TraceReader::new(text.as_bytes()).expect("a header");
        let events: Vec<_> = (&mut reader).collect();
        (events, reader.unknown_events().clone())
    }

    #[test]
    fn from_schema_3_an_unknown_event_kind_is_counted_and_passed_over() {
        let end = Event::SessionEnd(SessionEnd {
            seq: 5,
            end_ns: 0,
            passes: 0,
            errors: Vec::new(),
            errors_not_kept: 0,
        });
        let end = serde_json::to_string(&end).unwrap();
        let unknown = r#"{"event":"expert_cache","seq":4,"hits":2}"#;
        let (events, unknown_events) = read(&trace(3, &[unknown, unknown, &end]));
        assert!(
            matches!(events.as_slice(), [Ok(Event::SessionEnd(_))]),
            "{events:?}"
        );
        assert_eq!(
            unknown_events.into_iter().collect::<Vec<_>>(),
            [("expert_cache".to_owned(), 2)]
        );
        // before schema 3 a writer that adds a kind raises the schema: an error there
        let (events, unknown_events) = read(&trace(2, &[unknown, &end]));
        let Some(Err(ReadError::Malformed {
            line: 2, reason, ..
        })) = events.first()
        else {
            panic!("{events:?}");
        };
        assert!(
            reason.contains("unknown event \"expert_cache\""),
            "{reason}"
        );
        assert!(unknown_events.is_empty());
        // a line that is not JSON is malformed whatever its tag
        let (events, _) = read(&trace(3, &[r#"{"event":"expert_cache","seq":"#, &end]));
        assert!(
            matches!(events.first(), Some(Err(ReadError::Malformed { .. }))),
            "{events:?}"
        );
    }
}

//! Reading trace files, with a progress bar for the large ones and errors that say which file
//! and line; the ranks of a run read together, pass by pass.

use std::fs::File;
use std::io::BufReader;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use trace_runtime::{Event, PassBegin, PassEnd, ReadError, TraceReader};

use super::{InputError, TraceFile, TraceRun};

/// Files above this size show a progress bar (on a terminal).
const PROGRESS_BYTES: u64 = 32 << 20;

/// Events read between two updates of the progress bar.
const PROGRESS_EVENTS: u64 = 4096;

/// What reading a run gave besides its events.
#[derive(Debug, Default)]
pub(crate) struct ReadNotes {
    /// Per file that ended in a cut line (a crash), the note; every complete event was read.
    pub(crate) truncated: Vec<String>,
    /// Bytes read, all files together.
    pub(crate) bytes: u64,
    /// Files that end without a `session_end` event.
    pub(crate) unfinished: Vec<String>,
}

impl ReadNotes {
    /// The notes about cut lines, as one.
    pub(crate) fn truncation(&self) -> Option<String> {
        (!self.truncated.is_empty()).then(|| self.truncated.join("; "))
    }
}

/// Reads the events of `run`'s files and hands each to `each` with the file it came from.
///
/// One file is read in order. The ranks of a run are merged pass by pass: every rank's events
/// of pass `p` (rank by rank), then those of `p + 1`, holding one event per rank; a pass begins
/// once (the first rank's `pass_begin`) and ends once, after its last rank, with one
/// `pass_end` that sums the ranks' layer calls, lists their anomalies in report order and
/// their logit evolutions, and lasts from the earliest begin to the latest end on the wall
/// clock. Events outside any pass stay where their rank had them. A cut last line is noted;
/// any other bad line is an error naming it.
pub(crate) fn read(
    run: &TraceRun,
    mut each: impl FnMut(&TraceFile, Event),
) -> Result<ReadNotes, InputError> {
    let total = run
        .files
        .iter()
        .map(|f| std::fs::metadata(&f.path).map_or(0, |m| m.len()))
        .sum();
    let progress = progress_bar(&run.label, total);
    let mut sources = run
        .files
        .iter()
        .map(Source::open)
        .collect::<Result<Vec<_>, _>>()?;
    let merging = sources.len() > 1;
    let mut pass = MergedPass::default();
    let mut count = 0u64;
    while let Some(at) = (sources.iter().enumerate())
        .filter(|(_, s)| s.next.is_some())
        .min_by_key(|(i, s)| (s.key, *i))
        .map(|(i, _)| i)
    {
        let source = &mut sources[at];
        let Some(event) = source.next.take() else {
            break;
        };
        let file = source.file;
        source.advance()?;
        count += 1;
        if count.is_multiple_of(PROGRESS_EVENTS) {
            if let Some(bar) = &progress {
                bar.set_position(sources.iter().map(|s| s.reader.bytes_read()).sum());
            }
        }
        if !merging {
            each(file, event);
            continue;
        }
        if let Some(p) = event.pass() {
            if pass.end.as_ref().is_some_and(|(_, end)| end.pass < p) {
                if let Some((ended, end)) = pass.finish() {
                    each(ended, Event::PassEnd(end));
                }
            }
        }
        match event {
            Event::PassBegin(begin) => {
                if let Some(begin) = pass.begin(file, begin) {
                    each(file, Event::PassBegin(begin));
                }
            }
            Event::PassEnd(end) => pass.end(file, end),
            event => each(file, event),
        }
    }
    if let Some((ended, end)) = pass.finish() {
        each(ended, Event::PassEnd(end));
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let mut notes = ReadNotes::default();
    for source in sources {
        warn_unknown_events(&source);
        notes.bytes += source.reader.bytes_read();
        notes.truncated.extend(source.truncated);
        if !source.ended {
            notes
                .unfinished
                .push(source.file.path.display().to_string());
        }
    }
    Ok(notes)
}

/// Says on stderr which events of `source` were passed over: kinds this reader does not know,
/// in a file of a schema that lets a reader skip them (a newer writer's records).
fn warn_unknown_events(source: &Source<'_>) {
    for (kind, count) in source.reader.unknown_events() {
        eprintln!(
            "model-trace: warning: {}: {count} `{kind}` event{} not read (a kind this \
             model-trace does not know: written by a newer writer?)",
            source.file.path.display(),
            if *count == 1 { "" } else { "s" },
        );
    }
}

/// One file being read, one event ahead.
struct Source<'a> {
    file: &'a TraceFile,
    reader: TraceReader<BufReader<File>>,
    /// The next event, `None` at the end.
    next: Option<Event>,
    /// The pass of the next event: its own, or for an event outside any pass the one before.
    key: usize,
    truncated: Option<String>,
    ended: bool,
}

impl<'a> Source<'a> {
    fn open(file: &'a TraceFile) -> Result<Self, InputError> {
        let reader = TraceReader::open(&file.path).map_err(|e| e.to_string())?;
        let mut source = Self {
            file,
            reader,
            next: None,
            key: 0,
            truncated: None,
            ended: false,
        };
        source.advance()?;
        Ok(source)
    }

    fn advance(&mut self) -> Result<(), InputError> {
        self.next = None;
        for event in self.reader.by_ref() {
            match event {
                Ok(event) => {
                    if let Some(pass) = event.pass() {
                        self.key = pass;
                    }
                    self.ended |= matches!(event, Event::SessionEnd(_));
                    self.next = Some(event);
                    return Ok(());
                }
                Err(error @ ReadError::Truncated { .. }) => {
                    self.truncated = Some(error.to_string());
                }
                Err(error) => return Err(error.to_string()),
            }
        }
        Ok(())
    }
}

/// The pass the ranks are in, while they are merged: when each rank began it on the wall
/// clock, and its end so far (held until its last rank has ended it).
#[derive(Default)]
struct MergedPass<'a> {
    /// The pass begun.
    pass: Option<usize>,
    /// Each rank's begin of it, in ns since 1970.
    starts: Vec<(&'a TraceFile, u64)>,
    end: Option<(&'a TraceFile, PassEnd)>,
    /// The latest end of a rank, in ns since 1970.
    end_unix_ns: u64,
}

impl<'a> MergedPass<'a> {
    /// The begin to hand on: the first rank's; `None` for the same pass begun by another rank.
    fn begin(&mut self, file: &'a TraceFile, begin: PassBegin) -> Option<PassBegin> {
        let start = file.header.clock.epoch_unix_ns + begin.start_ns;
        if self.pass == Some(begin.pass) {
            self.starts.push((file, start));
            return None;
        }
        self.pass = Some(begin.pass);
        self.starts = vec![(file, start)];
        Some(begin)
    }

    /// Adds one rank's end of the pass.
    fn end(&mut self, file: &'a TraceFile, end: PassEnd) {
        let began = (self.pass == Some(end.pass))
            .then(|| self.starts.iter().find(|(f, _)| std::ptr::eq(*f, file)))
            .flatten();
        if let Some((_, start)) = began {
            self.end_unix_ns = self.end_unix_ns.max(start + end.duration_ns);
        }
        match &mut self.end {
            Some((_, merged)) if merged.pass == end.pass => {
                merged.layers += end.layers;
                merged.anomalies.extend(end.anomalies);
                merged.logit_evolution.extend(end.logit_evolution);
            }
            _ => self.end = Some((file, end)),
        }
    }

    /// The merged end of the pass, once its ranks are done.
    fn finish(&mut self) -> Option<(&'a TraceFile, PassEnd)> {
        let (file, mut end) = self.end.take()?;
        end.anomalies
            .sort_by_key(|a| (!a.kind.is_broken_value(), a.layer));
        let earliest = self.starts.iter().map(|(_, start)| *start).min();
        if let (Some(start), true) = (earliest, self.pass == Some(end.pass)) {
            end.duration_ns = self.end_unix_ns.saturating_sub(start).max(end.duration_ns);
        }
        self.end_unix_ns = 0;
        Some((file, end))
    }
}

fn progress_bar(label: &str, total: u64) -> Option<ProgressBar> {
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
    bar.set_message(label.to_owned());
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

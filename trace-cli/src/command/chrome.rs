//! `model-trace chrome FILE... -o trace.json`: trace files as one timeline in the Chrome trace
//! event format (its JSON object form: `traceEvents`, `displayTimeUnit`, `metadata`), for
//! Perfetto (ui.perfetto.dev) and chrome://tracing.
//!
//! What becomes what:
//!
//! * A forward pass is a complete event (`"ph": "X"`, category `pass`) named
//!   `pass 3 (position 7)`, and a layer call one (category `layer`) named `layer 12`, on the
//!   track of the thread that recorded it: `pid` is the header's `process_id`, `tid` its
//!   `thread.id`. `ts` and `dur` are microseconds with three decimals, so no nanosecond is
//!   lost. A pass's `args` hold its position, layer calls and anomaly; a layer's hold its
//!   tracepoint, function and recorded duration, the output's mean, std, max |x| and NaN/Inf
//!   counts, and every tensor of the layer with NaN or Inf values.
//! * A pass the file ends inside (the run was killed) still appears, ending with its last
//!   layer, and says so in its `cut_short` arg.
//! * Each anomaly a pass reports is an instant event (`"ph": "i"`, `"s": "t"`, category
//!   `anomaly`) named by its description, at the end of the layer it is about; the pass's own
//!   anomaly (its first) has `first: true`.
//! * Counters (`"ph": "C"`), stamped at the end of each pass that recorded them: `KV cache`
//!   `bytes` (the sum of each cache's latest size) and `quantization` `worst cosine` (the
//!   smallest cosine similarity of the pass's quantization records).
//! * Metadata events name the process (the header's model, else `model-trace`) and each thread
//!   (its name, else `thread N`), and order the threads by id.
//!
//! Several files merge into one timeline: times are placed on the wall clock through each
//! header's `clock` (`epoch_unix_ns` is shared by the sessions of one process, so its threads
//! line up exactly), and the earliest session start becomes 0. Events are sorted by time. The
//! complete events of a thread nest as the format requires, in every way viewers read the
//! numbers back: a span that pokes out of its parent, by a rounding or in the data, is cut at
//! the parent's end (see `nest`). Viewers key threads by `tid` alone, so a thread id that
//! another process's thread already has is renumbered above every id in the input; its name
//! and the `metadata` object say which thread it is.
//!
//! The JSON is written beside the output under a temporary name and renamed into place, so a
//! failure never leaves half a file.

mod event;
mod nest;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use trace_runtime::{Anomaly, Event, LayerEvent, RunMetadata, TensorStats, TraceHeader};

use crate::command::Outcome;
use crate::input::{self, InputError, TraceRun};
use event::{AnomalyArgs, Args, CounterValue, Float, LayerArgs, PassArgs, Phase, TraceEvent};
use nest::Span;

/// Where to open the output, for the closing line.
const VIEWERS: &str = "https://ui.perfetto.dev or chrome://tracing";

/// The `cut_short` arg of a pass the file ends inside.
const CUT_SHORT: &str = "the file ends inside this pass; shown ending with its last layer";

/// Converts `files` into one timeline written to `output`, and says so in one line.
pub(crate) fn run(files: &[PathBuf], output: &Path) -> Result<Outcome, InputError> {
    let mut paths = Vec::new();
    for path in files {
        paths.extend(crate::input::files(path)?);
    }
    let sessions = paths
        .iter()
        .map(|path| SessionTrace::read(path))
        .collect::<Result<Vec<_>, _>>()?;
    let timeline = Timeline::new(&sessions);
    crate::output::write_file(output, |out| timeline.write(out, &sessions))?;
    for cut in sessions.iter().flat_map(|s| &s.truncated) {
        eprintln!("model-trace: note: {cut}");
    }
    crate::output::emit(&format!(
        "wrote {}: {} — open in {VIEWERS}\n",
        output.display(),
        timeline.counts()
    ))?;
    Ok(Outcome::Ok)
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

/// What the timeline shows of one trace file.
struct SessionTrace {
    path: PathBuf,
    header: TraceHeader,
    /// Tracepoint and function names, stored once (a long trace repeats a few of them).
    names: Names,
    passes: BTreeMap<usize, PassRecord>,
    layers: Vec<LayerRecord>,
    /// The KV caches' total size after each pass's last step, in bytes.
    kv_bytes: BTreeMap<usize, usize>,
    /// The worst (smallest) finite cosine similarity of each pass's quantization records.
    worst_cosine: BTreeMap<usize, f32>,
    /// The note about a cut last line.
    truncated: Vec<String>,
}

/// A pass as its begin and end events tell it.
struct PassRecord {
    position: usize,
    start_ns: u64,
    tracepoint: usize,
    function: usize,
    /// `None` when the file ends inside the pass.
    end: Option<PassEnded>,
}

struct PassEnded {
    duration_ns: u64,
    layers: usize,
    anomalies: Vec<Anomaly>,
}

/// A layer call, without its tensors beyond what the timeline shows.
struct LayerRecord {
    pass: usize,
    layer: usize,
    tracepoint: usize,
    function: usize,
    start_ns: u64,
    duration_ns: u64,
    output: Option<TensorStats>,
    /// `scores: 1 NaN; output: 64 NaN`, or empty.
    non_finite: String,
}

impl SessionTrace {
    fn read(path: &Path) -> Result<Self, InputError> {
        let mut names = Names::default();
        let mut passes: BTreeMap<usize, PassRecord> = BTreeMap::new();
        let mut layers = Vec::new();
        let mut cache_bytes: BTreeMap<Option<usize>, usize> = BTreeMap::new();
        let mut kv_bytes = BTreeMap::new();
        let mut worst_cosine: BTreeMap<usize, f32> = BTreeMap::new();
        let run = TraceRun::open(&[path.to_path_buf()])?;
        let notes = input::read(&run, |_, event| match event {
            Event::PassBegin(begin) => {
                let record = PassRecord {
                    position: begin.position,
                    start_ns: begin.start_ns,
                    tracepoint: names.id(&begin.tracepoint),
                    function: names.id(&begin.function),
                    end: None,
                };
                passes.insert(begin.pass, record);
            }
            Event::PassEnd(end) => {
                if let Some(record) = passes.get_mut(&end.pass) {
                    record.end = Some(PassEnded {
                        duration_ns: end.duration_ns,
                        layers: end.layers,
                        anomalies: end.anomalies,
                    });
                }
            }
            Event::Layer(layer) => layers.push(LayerRecord::new(&layer, &mut names)),
            Event::KvCache(kv) => {
                cache_bytes.insert(kv.state.layer, kv.state.cache_size_bytes);
                if let Some(pass) = kv.pass {
                    kv_bytes.insert(pass, cache_bytes.values().sum());
                }
            }
            Event::Quant(quant) => {
                let cosine = quant.error.cosine_similarity;
                if let (Some(pass), true) = (quant.pass, cosine.is_finite()) {
                    let worst = worst_cosine.entry(pass).or_insert(cosine);
                    *worst = worst.min(cosine);
                }
            }
            _ => {}
        })?;
        Ok(Self {
            path: path.to_owned(),
            header: run.header().clone(),
            names,
            passes,
            layers,
            kv_bytes,
            worst_cosine,
            truncated: notes.truncated,
        })
    }

    /// A time of this file on the wall clock, in ns since the Unix epoch.
    fn unix_ns(&self, ns: u64) -> u64 {
        self.header.clock.epoch_unix_ns.saturating_add(ns)
    }

    /// The earliest time the file mentions, on the wall clock.
    fn earliest_unix_ns(&self) -> u64 {
        let passes = self.passes.values().map(|p| p.start_ns);
        let layers = self.layers.iter().map(|l| l.start_ns);
        let earliest = passes
            .chain(layers)
            .fold(self.header.clock.session_start_ns, u64::min);
        self.unix_ns(earliest)
    }

    /// Adds the file's passes, layers and anomalies to the items of its thread, in ns from
    /// `origin` (ns since the Unix epoch).
    fn items<'a>(&'a self, origin: u64, out: &mut Vec<(Span, Item<'a>)>) {
        let at = |ns: u64| self.unix_ns(ns).saturating_sub(origin);
        let mut last_layer_end: HashMap<usize, u64> = HashMap::new();
        let mut first_call_end: HashMap<(usize, usize), u64> = HashMap::new();
        for layer in &self.layers {
            let start = at(layer.start_ns);
            let end = at(layer.start_ns.saturating_add(layer.duration_ns));
            let last = last_layer_end.entry(layer.pass).or_insert(end);
            *last = (*last).max(end);
            first_call_end
                .entry((layer.pass, layer.layer))
                .or_insert(end);
            out.push((
                Span {
                    start,
                    end,
                    rank: 1,
                },
                Item::Layer(layer),
            ));
        }
        for (&pass, record) in &self.passes {
            let start = at(record.start_ns);
            let end = match &record.end {
                Some(ended) => at(record.start_ns.saturating_add(ended.duration_ns)),
                None => last_layer_end.get(&pass).copied().unwrap_or(start),
            }
            .max(start);
            out.push((
                Span {
                    start,
                    end,
                    rank: 0,
                },
                Item::Pass(pass, record),
            ));
            let anomalies = record.end.iter().flat_map(|ended| &ended.anomalies);
            for (index, anomaly) in anomalies.enumerate() {
                let at = first_call_end
                    .get(&(pass, anomaly.layer))
                    .copied()
                    .unwrap_or(end);
                let item = Item::Anomaly {
                    pass,
                    position: record.position,
                    anomaly,
                    first: index == 0,
                };
                out.push((
                    Span {
                        start: at,
                        end: at,
                        rank: 2,
                    },
                    item,
                ));
            }
        }
    }

    /// `cut_short` of the metadata: the cut line, or a missing end.
    fn cut_short(&self) -> Option<Cow<'_, str>> {
        if let Some(cut) = self.truncated.first() {
            return Some(Cow::Borrowed(cut));
        }
        let open = self.passes.values().filter(|p| p.end.is_none()).count();
        (open > 0).then(|| Cow::Owned(format!("the file ends inside {open} pass(es)")))
    }
}

impl LayerRecord {
    fn new(layer: &LayerEvent, names: &mut Names) -> Self {
        let non_finite: Vec<String> = layer
            .stages
            .iter()
            .filter_map(|stage| {
                let stats = &stage.tensor.stats;
                let mut counts = Vec::new();
                if stats.nan_count > 0 {
                    counts.push(format!("{} NaN", stats.nan_count));
                }
                if stats.inf_count > 0 {
                    counts.push(format!("{} Inf", stats.inf_count));
                }
                (!counts.is_empty()).then(|| format!("{}: {}", stage.name, counts.join(", ")))
            })
            .collect();
        Self {
            pass: layer.pass,
            layer: layer.layer,
            tracepoint: names.id(&layer.tracepoint),
            function: names.id(&layer.function),
            start_ns: layer.start_ns,
            duration_ns: layer.duration_ns,
            output: layer.stage("output").map(|stage| stage.tensor.stats),
            non_finite: non_finite.join("; "),
        }
    }
}

/// Strings stored once, by number.
#[derive(Default)]
struct Names {
    ids: HashMap<String, usize>,
    names: Vec<String>,
}

impl Names {
    fn id(&mut self, name: &str) -> usize {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        self.names.push(name.to_owned());
        self.ids.insert(name.to_owned(), self.names.len() - 1);
        self.names.len() - 1
    }

    fn get(&self, id: usize) -> &str {
        &self.names[id]
    }
}

// ---------------------------------------------------------------------------------------------
// The timeline
// ---------------------------------------------------------------------------------------------

/// What a span of a thread's track stands for.
enum Item<'a> {
    Pass(usize, &'a PassRecord),
    Layer(&'a LayerRecord),
    Anomaly {
        pass: usize,
        position: usize,
        anomaly: &'a Anomaly,
        first: bool,
    },
}

/// A thread of the output: its process and `tid`.
type Track = (u32, u64);

/// The events of the output, sorted by time, and what they count.
struct Timeline<'a> {
    events: Vec<TraceEvent<'a>>,
    passes: usize,
    layers: usize,
    anomalies: usize,
    /// ts 0 on the wall clock, in ns since the Unix epoch.
    origin_unix_ns: u64,
    /// Each session's `tid`.
    tids: Vec<u64>,
}

impl<'a> Timeline<'a> {
    fn new(sessions: &'a [SessionTrace]) -> Self {
        let origin_unix_ns = sessions
            .iter()
            .map(SessionTrace::earliest_unix_ns)
            .min()
            .unwrap_or(0);
        let tids = thread_ids(sessions);
        let mut timeline = Self {
            events: Vec::new(),
            passes: 0,
            layers: 0,
            anomalies: 0,
            origin_unix_ns,
            tids,
        };
        let labels = timeline.metadata_events(sessions);
        let mut tracks: BTreeMap<Track, Vec<(Span, Item<'a>, &'a SessionTrace)>> = BTreeMap::new();
        for (session, &tid) in sessions.iter().zip(&timeline.tids) {
            let mut items = Vec::new();
            session.items(origin_unix_ns, &mut items);
            tracks
                .entry((session.header.process_id, tid))
                .or_default()
                .extend(items.into_iter().map(|(span, item)| (span, item, session)));
        }
        for (track, items) in tracks {
            let mut spans: Vec<Span> = items.iter().map(|(span, _, _)| *span).collect();
            nest::nest(&mut spans);
            for (span, (_, item, session)) in spans.into_iter().zip(items) {
                timeline.add(track, span, &item, session, labels.get(&track));
            }
        }
        timeline.events.sort_by_key(|event| {
            (
                event.ts_ns,
                event.phase.rank(),
                Reverse(event.phase.dur_ns()),
            )
        });
        timeline
    }

    /// Adds the metadata events; returns, for processes with several threads, the label of
    /// each thread for its counters' names.
    fn metadata_events(&mut self, sessions: &'a [SessionTrace]) -> HashMap<Track, String> {
        let mut threads: BTreeMap<Track, &'a SessionTrace> = BTreeMap::new();
        for (session, &tid) in sessions.iter().zip(&self.tids) {
            threads
                .entry((session.header.process_id, tid))
                .or_insert(session);
        }
        let mut named = BTreeSet::new();
        for (&(pid, tid), session) in &threads {
            if named.insert(pid) {
                let model = sessions
                    .iter()
                    .filter(|s| s.header.process_id == pid)
                    .find_map(|s| s.header.metadata.model.as_deref());
                self.metadata(
                    pid,
                    tid,
                    "process_name",
                    model.unwrap_or("model-trace").into(),
                );
            }
            let name = thread_label(&session.header);
            self.metadata(pid, tid, "thread_name", name.into());
            self.events.push(TraceEvent {
                phase: Phase::Metadata,
                ts_ns: 0,
                pid,
                tid,
                name: Cow::Borrowed("thread_sort_index"),
                cat: None,
                args: Args::SortIndex { sort_index: tid },
            });
        }
        threads
            .iter()
            .filter(|(&(pid, _), _)| threads.keys().filter(|(p, _)| *p == pid).count() > 1)
            .map(|(&track, session)| (track, thread_label(&session.header)))
            .collect()
    }

    fn metadata(&mut self, pid: u32, tid: u64, what: &'static str, name: Cow<'a, str>) {
        self.events.push(TraceEvent {
            phase: Phase::Metadata,
            ts_ns: 0,
            pid,
            tid,
            name: Cow::Borrowed(what),
            cat: None,
            args: Args::Name { name },
        });
    }

    /// Adds the event of `item`, placed at `span`, and a pass's counters.
    fn add(
        &mut self,
        (pid, tid): Track,
        span: Span,
        item: &Item<'a>,
        session: &'a SessionTrace,
        label: Option<&String>,
    ) {
        let (name, cat, phase, args) = match *item {
            Item::Pass(pass, record) => {
                self.passes += 1;
                self.counters((pid, tid), span.end, pass, session, label);
                let anomalies = record.end.as_ref().map_or(&[][..], |e| &e.anomalies);
                let args = PassArgs {
                    pass,
                    position: record.position,
                    layers: record.end.as_ref().map_or_else(
                        || session.layers.iter().filter(|l| l.pass == pass).count(),
                        |ended| ended.layers,
                    ),
                    tracepoint: session.names.get(record.tracepoint),
                    function: session.names.get(record.function),
                    anomaly: anomalies.first().map(|a| a.description.as_str()),
                    anomalies: anomalies.len(),
                    cut_short: record.end.is_none().then_some(CUT_SHORT),
                    session: session.header.session,
                    file: session.path.to_string_lossy(),
                };
                (
                    Cow::Owned(format!("pass {pass} (position {})", record.position)),
                    "pass",
                    Phase::Complete {
                        dur_ns: span.end - span.start,
                    },
                    Args::Pass(args),
                )
            }
            Item::Layer(layer) => {
                self.layers += 1;
                let output = layer.output;
                let args = LayerArgs {
                    pass: layer.pass,
                    layer: layer.layer,
                    tracepoint: session.names.get(layer.tracepoint),
                    function: session.names.get(layer.function),
                    duration_ns: layer.duration_ns,
                    output_mean: output.map(|s| Float(s.mean)),
                    output_std: output.map(|s| Float(s.std)),
                    output_max_abs: output.map(|s| Float(s.min.abs().max(s.max.abs()))),
                    output_nan_count: output.map(|s| s.nan_count),
                    output_inf_count: output.map(|s| s.inf_count),
                    non_finite: &layer.non_finite,
                };
                (
                    Cow::Owned(format!("layer {}", layer.layer)),
                    "layer",
                    Phase::Complete {
                        dur_ns: span.end - span.start,
                    },
                    Args::Layer(args),
                )
            }
            Item::Anomaly {
                pass,
                position,
                anomaly,
                first,
            } => {
                self.anomalies += 1;
                let args = AnomalyArgs {
                    pass,
                    position,
                    layer: anomaly.layer,
                    stage: anomaly.stage.as_deref(),
                    kind: anomaly.kind.to_string(),
                    first,
                };
                (
                    Cow::Borrowed(anomaly.description.as_str()),
                    "anomaly",
                    Phase::Instant,
                    Args::Anomaly(args),
                )
            }
        };
        self.events.push(TraceEvent {
            phase,
            ts_ns: span.start,
            pid,
            tid,
            name,
            cat: Some(cat),
            args,
        });
    }

    /// The counters of `pass` at `ts_ns`, its end.
    fn counters(
        &mut self,
        (pid, tid): Track,
        ts_ns: u64,
        pass: usize,
        session: &SessionTrace,
        label: Option<&String>,
    ) {
        #[allow(clippy::cast_precision_loss)]
        let kv = session.kv_bytes.get(&pass).map(|&bytes| bytes as f64);
        // The f32's shortest decimal, not its binary expansion (0.999682, not 0.99968200922).
        let quant = session
            .worst_cosine
            .get(&pass)
            .map(|&c| c.to_string().parse().unwrap_or(f64::from(c)));
        for (counter, series, value) in [
            ("KV cache", "bytes", kv),
            ("quantization", "worst cosine", quant),
        ] {
            let Some(value) = value else { continue };
            let name = match label {
                Some(label) => Cow::Owned(format!("{counter} ({label})")),
                None => Cow::Borrowed(counter),
            };
            self.events.push(TraceEvent {
                phase: Phase::Counter,
                ts_ns,
                pid,
                tid,
                name,
                cat: Some("counter"),
                args: Args::Counter(CounterValue { series, value }),
            });
        }
    }

    /// `16 passes, 480 layers, 0 anomalies`.
    fn counts(&self) -> String {
        format!(
            "{}, {}, {}",
            plural(self.passes, "pass", "passes"),
            plural(self.layers, "layer", "layers"),
            plural(self.anomalies, "anomaly", "anomalies")
        )
    }

    /// The whole JSON object.
    fn write(&self, out: &mut impl Write, sessions: &[SessionTrace]) -> io::Result<()> {
        out.write_all(b"{\"traceEvents\":[\n")?;
        for (index, event) in self.events.iter().enumerate() {
            if index > 0 {
                out.write_all(b",\n")?;
            }
            event.write(out)?;
        }
        out.write_all(b"\n],\n\"displayTimeUnit\":\"ms\",\n\"metadata\":")?;
        let metadata = Metadata {
            generator: concat!("model-trace chrome ", env!("CARGO_PKG_VERSION")),
            clock_origin_unix_ns: self.origin_unix_ns.to_string(),
            sessions: sessions
                .iter()
                .zip(&self.tids)
                .map(|(session, &tid)| SessionMetadata {
                    file: session.path.to_string_lossy(),
                    session: session.header.session,
                    process_id: session.header.process_id,
                    thread_id: session.header.thread.id,
                    tid,
                    thread_name: session.header.thread.name.as_deref(),
                    writer: &session.header.writer,
                    run: &session.header.metadata,
                    cut_short: session.cut_short(),
                })
                .collect(),
        };
        serde_json::to_writer(&mut *out, &metadata)?;
        out.write_all(b"}\n")
    }
}

/// The output's `metadata` object.
#[derive(Serialize)]
struct Metadata<'a> {
    generator: &'static str,
    /// ts 0 on the wall clock, in ns since the Unix epoch (a string: a double cannot hold it).
    clock_origin_unix_ns: String,
    sessions: Vec<SessionMetadata<'a>>,
}

/// Where a session's events came from.
#[derive(Serialize)]
struct SessionMetadata<'a> {
    file: Cow<'a, str>,
    session: u64,
    process_id: u32,
    thread_id: u64,
    /// Its `tid` in the events (the thread id unless another process has it too).
    tid: u64,
    thread_name: Option<&'a str>,
    writer: &'a str,
    /// What the user said about the run.
    run: &'a RunMetadata,
    #[serde(skip_serializing_if = "Option::is_none")]
    cut_short: Option<Cow<'a, str>>,
}

/// Each session's `tid`: its thread id, unless a thread of another process already has that
/// id (viewers key threads by `tid` alone); those get new ids above every id of the input.
fn thread_ids(sessions: &[SessionTrace]) -> Vec<u64> {
    let mut next = sessions
        .iter()
        .map(|s| s.header.thread.id)
        .max()
        .unwrap_or(0);
    let mut taken: HashMap<u64, u32> = HashMap::new();
    let mut assigned: HashMap<(u32, u64), u64> = HashMap::new();
    sessions
        .iter()
        .map(|session| {
            let key = (session.header.process_id, session.header.thread.id);
            *assigned.entry(key).or_insert_with(|| {
                let tid = if taken.contains_key(&key.1) {
                    next += 1;
                    next
                } else {
                    key.1
                };
                taken.insert(tid, key.0);
                tid
            })
        })
        .collect()
}

/// The thread's name, else `thread N`; `rank R: ` before it for a rank of a run.
fn thread_label(header: &TraceHeader) -> String {
    let thread = header
        .thread
        .name
        .clone()
        .unwrap_or_else(|| format!("thread {}", header.thread.id));
    match header.rank {
        Some(rank) => format!("rank {rank}: {thread}"),
        None => thread,
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_say_one_or_many() {
        assert_eq!(plural(1, "anomaly", "anomalies"), "1 anomaly");
        assert_eq!(plural(0, "anomaly", "anomalies"), "0 anomalies");
    }
}

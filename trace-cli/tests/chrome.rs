//! `model-trace chrome` on trace files that two threads of a small annotated model wrote at the
//! same time: the output is checked against the trace event format's rules (times in
//! microseconds, complete events properly nested per thread, instants with a scope, metadata
//! naming the threads), against the trace files it came from, and on a file cut short.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use model_trace::{
    trace_kv_cache, trace_layer, trace_model, trace_tensor, ModelTracerConfig, Session,
};

use common::{run, scratch, text};
use serde_json::Value;

/// Blocks in the model; each calls one nested layer (its MLP, numbered 100 + block).
const BLOCKS: usize = 3;
const PASSES: usize = 3;

struct Cache {
    keys: Vec<f32>,
}

impl Cache {
    #[trace_kv_cache(len = self.keys.len(), capacity = 64, bytes = self.keys.len() * 4)]
    fn append(&mut self, key: f32) {
        self.keys.push(key);
    }
}

/// A model whose block `layer` records a NaN score at `position` when `nan_at` says so; the
/// scores feed nothing, so only that layer is anomalous.
struct Model {
    nan_at: Option<(usize, usize)>,
}

impl Model {
    #[trace_layer(index = 100 + index)]
    fn mlp(&self, x: &[f32], index: usize) -> Vec<f32> {
        x.iter()
            .map(|v| (v * 0.5 + index as f32 * 0.1).tanh())
            .collect()
    }

    #[trace_layer(index = index)]
    fn block(&self, x: &[f32], index: usize, position: usize) -> Vec<f32> {
        let mut scores: Vec<f32> = x.iter().map(|v| v * 0.1).collect();
        if self.nan_at == Some((position, index)) {
            scores[3] = f32::NAN;
        }
        trace_tensor!("scores", &scores);
        let mlp_out = self.mlp(x, index);
        x.iter().zip(&mlp_out).map(|(a, b)| a + b).collect()
    }

    /// Called inside `forward`: joins its pass.
    #[trace_model]
    fn blocks(&self, mut x: Vec<f32>, position: usize) -> Vec<f32> {
        for index in 0..BLOCKS {
            x = self.block(&x, index, position);
        }
        x
    }

    #[trace_model(position = position)]
    fn forward(&self, position: usize, cache: &mut Cache) -> Vec<f32> {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i + position) as f32 * 0.37).sin())
            .collect();
        cache.append(x[0]);
        self.blocks(x, position)
    }
}

/// Runs the model on a thread named `thread`, writing `name` in `dir`; returns the file.
fn trace_on_thread(dir: &Path, name: &str, thread: &str, model: Model) -> PathBuf {
    let path = dir.join(name);
    std::thread::Builder::new()
        .name(thread.to_owned())
        .spawn(move || {
            let session = Session::builder(ModelTracerConfig::lightweight())
                .trace_file(&path)
                .start()
                .expect("the trace file can be created");
            let written = session.trace_file().expect("a trace file").to_owned();
            let mut cache = Cache { keys: Vec::new() };
            for position in 0..PASSES {
                model.forward(position, &mut cache);
            }
            session.finish();
            written
        })
        .expect("a thread")
        .join()
        .expect("the thread ran")
}

/// Traces of two threads running at the same time: `worker-a` with a NaN in pass 1, layer 1.
fn two_threads(dir: &Path) -> (PathBuf, PathBuf) {
    std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            trace_on_thread(
                dir,
                "a.ndjson",
                "worker-a",
                Model {
                    nan_at: Some((1, 1)),
                },
            )
        });
        let b =
            scope.spawn(|| trace_on_thread(dir, "b.ndjson", "worker-b", Model { nan_at: None }));
        (a.join().unwrap(), b.join().unwrap())
    })
}

/// Converts `files` and returns the parsed JSON and what the command said.
fn chrome(files: &[&Path], out: &Path) -> (Value, String) {
    let mut args = vec!["chrome"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    args.extend(["-o", out.to_str().unwrap()]);
    let output = run(&args);
    assert!(output.status.success(), "{}", text(&output));
    let json = std::fs::read_to_string(out).expect("the output exists");
    (
        serde_json::from_str(&json).expect("the output is JSON"),
        text(&output),
    )
}

fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents")
}

fn f(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{value} is not a number"))
}

fn end(event: &Value) -> f64 {
    f(&event["ts"]) + f(&event["dur"])
}

/// The thread of an event.
fn track(event: &Value) -> (u64, u64) {
    (
        event["pid"].as_u64().unwrap(),
        event["tid"].as_u64().unwrap(),
    )
}

/// Checks the format's rules for every event and that the complete and thread-scoped instant
/// events of each thread nest properly; returns each of those events' parent (an index into
/// the events), found with a stack as a viewer does.
fn check_format(trace: &Value) -> HashMap<usize, Option<usize>> {
    assert_eq!(trace["displayTimeUnit"], "ms");
    assert!(trace["metadata"].is_object());
    let events = events(trace);
    let mut last_ts = 0.0;
    for event in events {
        let ph = event["ph"].as_str().expect("ph");
        assert!(["X", "i", "C", "M"].contains(&ph), "{event}");
        assert!(event["pid"].is_u64() && event["tid"].is_u64(), "{event}");
        assert!(event["name"].is_string(), "{event}");
        let ts = f(&event["ts"]);
        assert!(ts >= 0.0 && ts >= last_ts, "ts sorted from 0: {event}");
        last_ts = ts;
        match ph {
            "X" => assert!(f(&event["dur"]) >= 0.0, "{event}"),
            "i" => assert_eq!(event["s"], "t", "{event}"),
            "C" => assert!(event["args"]
                .as_object()
                .unwrap()
                .values()
                .all(Value::is_number)),
            _ => {}
        }
    }
    let mut by_thread: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
    for (index, event) in events.iter().enumerate() {
        if event["ph"] == "X" || event["ph"] == "i" {
            by_thread.entry(track(event)).or_default().push(index);
        }
    }
    let dur = |i: usize| events[i]["dur"].as_f64().unwrap_or(0.0);
    let mut parents = HashMap::new();
    for (_, mut indices) in by_thread {
        indices.sort_by(|&a, &b| {
            f(&events[a]["ts"])
                .total_cmp(&f(&events[b]["ts"]))
                .then(dur(b).total_cmp(&dur(a)))
        });
        let mut open: Vec<usize> = Vec::new();
        for index in indices {
            let (ts, end) = (
                f(&events[index]["ts"]),
                f(&events[index]["ts"]) + dur(index),
            );
            while let Some(&top) = open.last() {
                if f(&events[top]["ts"]) + dur(top) <= ts {
                    open.pop();
                } else {
                    break;
                }
            }
            if let Some(&parent) = open.last() {
                let parent_end = f(&events[parent]["ts"]) + dur(parent);
                assert!(
                    end <= parent_end,
                    "{} pokes out of {}",
                    events[index],
                    events[parent]
                );
            }
            parents.insert(index, open.last().copied());
            open.push(index);
        }
    }
    parents
}

/// `layer` events of a trace file: (pass, layer) -> duration_ns.
fn layer_durations(file: &Path) -> HashMap<(u64, u64), u64> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["event"] == "layer")
        .map(|event| {
            (
                (
                    event["pass"].as_u64().unwrap(),
                    event["layer"].as_u64().unwrap(),
                ),
                event["duration_ns"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The `tid` of the thread named `name`.
fn tid_of(trace: &Value, name: &str) -> u64 {
    events(trace)
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == name)
        .unwrap_or_else(|| panic!("no thread_name {name}"))["tid"]
        .as_u64()
        .unwrap()
}

/// Two threads' traces converted together.
struct Converted {
    trace: Value,
    said: String,
    out: PathBuf,
    /// Each thread's file and `tid`: `worker-a` (with the NaN), `worker-b`.
    a: (PathBuf, u64),
    b: (PathBuf, u64),
    /// Each complete or instant event's parent.
    parents: HashMap<usize, Option<usize>>,
}

fn converted(name: &str) -> Converted {
    let dir = scratch(name);
    let (a, b) = two_threads(&dir);
    let out = dir.join("trace.json");
    let (trace, said) = chrome(&[&a, &b], &out);
    let parents = check_format(&trace);
    let (tid_a, tid_b) = (tid_of(&trace, "worker-a"), tid_of(&trace, "worker-b"));
    Converted {
        trace,
        said,
        out,
        a: (a, tid_a),
        b: (b, tid_b),
        parents,
    }
}

#[test]
fn two_threads_are_two_named_tracks_of_one_process() {
    let Converted {
        trace,
        said,
        out,
        a,
        b,
        ..
    } = converted("threads");
    let layers = 2 * PASSES * 2 * BLOCKS;
    let passes = 2 * PASSES;
    let line = format!(
        "wrote {}: {passes} passes, {layers} layers, 1 anomaly",
        out.display()
    );
    assert!(said.contains(&line), "{said}");
    assert!(said.contains("https://ui.perfetto.dev"), "{said}");
    let events = events(&trace);
    assert_ne!(a.1, b.1);
    let pids: Vec<u64> = events.iter().map(|e| track(e).0).collect();
    assert!(pids.windows(2).all(|w| w[0] == w[1]), "one process");
    let metadata = |name: &str, tid: u64| {
        events
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == name && e["tid"] == tid)
    };
    assert!(
        metadata("process_name", a.1.min(b.1)),
        "on the process's first thread"
    );
    for tid in [a.1, b.1] {
        assert!(metadata("thread_name", tid) && metadata("thread_sort_index", tid));
    }
    // Time 0 is the earliest session start: the first pass follows within a second.
    let first = events.iter().find(|e| e["ph"] == "X").unwrap();
    assert!(f(&first["ts"]) < 1e6, "{first}");
    let sessions = trace["metadata"]["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[0]["thread_name"], "worker-a");
    assert_eq!(sessions[1]["tid"], b.1);
}

#[test]
fn passes_hold_their_layers_with_times_in_microseconds() {
    let Converted {
        trace,
        a,
        b,
        parents,
        ..
    } = converted("layers");
    let events = events(&trace);
    for (file, tid) in [a, b] {
        let recorded = layer_durations(&file);
        assert_eq!(recorded.len(), PASSES * 2 * BLOCKS);
        let on_thread = |cat: &str| {
            events
                .iter()
                .enumerate()
                .filter(move |(_, e)| e["tid"] == tid && e["cat"] == cat)
                .collect::<Vec<_>>()
        };
        let passes = on_thread("pass");
        assert_eq!(passes.len(), PASSES);
        for (position, (_, pass)) in passes.iter().enumerate() {
            assert_eq!(pass["ph"], "X");
            assert_eq!(
                pass["name"],
                format!("pass {position} (position {position})")
            );
            assert_eq!(pass["args"]["layers"], 2 * BLOCKS);
        }
        let mut layer_time: HashMap<usize, f64> = HashMap::new();
        for (index, layer) in on_thread("layer") {
            let (pass, number) = (
                layer["args"]["pass"].as_u64().unwrap(),
                layer["args"]["layer"].as_u64().unwrap(),
            );
            assert_eq!(layer["name"], format!("layer {number}"));
            let duration_ns = recorded[&(pass, number)];
            assert_eq!(layer["args"]["duration_ns"], duration_ns);
            let dur = f(&layer["dur"]);
            assert!(
                (dur - duration_ns as f64 / 1000.0).abs() <= 0.0025,
                "dur {dur} µs for {duration_ns} ns"
            );
            // Up the parents to the pass: blocks sit in the pass, MLPs in their block.
            let parent = parents[&index].expect("a layer has a parent");
            let pass_index = if number >= 100 {
                assert_eq!(events[parent]["name"], format!("layer {}", number - 100));
                parents[&parent].unwrap()
            } else {
                *layer_time.entry(parent).or_default() += dur;
                parent
            };
            assert_eq!(events[pass_index]["cat"], "pass", "{layer}");
            assert_eq!(events[pass_index]["args"]["pass"], pass, "{layer}");
            assert!(layer["args"]["output_std"].as_f64().unwrap() > 0.0);
        }
        for (pass, time) in layer_time {
            assert!(
                time <= f(&events[pass]["dur"]),
                "{time} in {}",
                events[pass]
            );
        }
    }
}

#[test]
fn the_anomaly_is_a_thread_instant_at_the_end_of_its_layer() {
    let Converted {
        trace, a, parents, ..
    } = converted("anomaly");
    let events = events(&trace);
    let anomalies: Vec<(usize, &Value)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["cat"] == "anomaly")
        .collect();
    assert_eq!(anomalies.len(), 1, "{anomalies:?}");
    let (index, anomaly) = anomalies[0];
    assert_eq!(
        (anomaly["ph"].as_str(), anomaly["s"].as_str()),
        (Some("i"), Some("t"))
    );
    assert_eq!(anomaly["tid"], a.1);
    let args = &anomaly["args"];
    assert_eq!(
        (&args["pass"], &args["layer"], &args["first"]),
        (&Value::from(1), &Value::from(1), &Value::Bool(true))
    );
    let name = anomaly["name"].as_str().unwrap();
    assert!(name.contains("NaN") && name.contains("scores"), "{name}");
    let layer = events
        .iter()
        .find(|e| {
            e["tid"] == a.1
                && e["cat"] == "layer"
                && e["args"]["pass"] == 1
                && e["args"]["layer"] == 1
        })
        .unwrap();
    assert!(
        (f(&anomaly["ts"]) - end(layer)).abs() <= 0.0025,
        "{anomaly} at the end of {layer}"
    );
    let non_finite = layer["args"]["non_finite"].as_str().unwrap();
    assert!(non_finite.contains("scores: 1 NaN"), "{non_finite}");
    let pass = parents[&index].expect("the anomaly lies in its pass");
    assert_eq!(events[pass]["name"], "pass 1 (position 1)");
    assert_eq!(events[pass]["args"]["anomaly"], name);
}

#[test]
fn the_kv_cache_is_a_counter_stamped_at_each_pass_end() {
    let Converted { trace, a, b, .. } = converted("counters");
    let events = events(&trace);
    for ((_, tid), thread) in [(a, "worker-a"), (b, "worker-b")] {
        let pass_ends: Vec<f64> = events
            .iter()
            .filter(|e| e["tid"] == tid && e["cat"] == "pass")
            .map(end)
            .collect();
        let counters: Vec<(f64, f64)> = events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == format!("KV cache ({thread})"))
            .map(|e| (f(&e["ts"]), f(&e["args"]["bytes"])))
            .collect();
        assert_eq!(counters.len(), PASSES);
        for (&(ts, bytes), (pass_end, keys)) in counters.iter().zip(pass_ends.iter().zip(1..)) {
            assert_eq!(bytes, f64::from(keys * 4), "one 4-byte key a pass");
            assert!((ts - pass_end).abs() <= 0.0025, "{ts} at {pass_end}");
        }
    }
}

#[test]
fn a_file_cut_mid_line_still_converts() {
    let dir = scratch("cut");
    let (a, _) = two_threads(&dir);
    let text = std::fs::read_to_string(&a).unwrap();
    // Cut inside the second pass_end: pass 1 has all its layers but no end.
    let mut pass_ends = text
        .match_indices("{\"event\":\"pass_end\"")
        .map(|(at, _)| at);
    let second = pass_ends.nth(1).expect("two pass ends");
    let cut = dir.join("cut.ndjson");
    std::fs::write(&cut, &text[..second + 30]).unwrap();
    let out = dir.join("cut.json");
    let (trace, said) = chrome(&[&cut], &out);
    assert!(said.contains("2 passes, 12 layers, 0 anomalies"), "{said}");
    assert!(said.contains("cut short"), "{said}");
    let parents = check_format(&trace);
    let events = events(&trace);
    let passes: Vec<&Value> = events.iter().filter(|e| e["cat"] == "pass").collect();
    assert!(passes[0]["args"].get("cut_short").is_none());
    let open = passes[1];
    assert!(open["args"]["cut_short"].is_string(), "{open}");
    let last_layer = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["cat"] == "layer" && e["args"]["pass"] == 1)
        .inspect(|(index, _)| {
            let parent = parents[index].unwrap();
            assert!(events[parent] == *open || events[parent]["cat"] == "layer");
        })
        .map(|(_, e)| end(e))
        .fold(0.0, f64::max);
    assert!(
        (end(open) - last_layer).abs() <= 0.0025,
        "{open} ends with its last layer"
    );
    assert!(trace["metadata"]["sessions"][0]["cut_short"].is_string());
}

#[test]
fn files_of_two_processes_keep_their_pids_and_get_distinct_tids() {
    let dir = scratch("processes");
    let (a, _) = two_threads(&dir);
    // The same run as if another process (pid 1 above) had written it, with its thread
    // unnamed: the same thread id in another process.
    let text = std::fs::read_to_string(&a).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let mut header: Value = serde_json::from_str(header).unwrap();
    let pid = header["process_id"].as_u64().unwrap();
    let thread = header["thread"]["id"].as_u64().unwrap();
    header["process_id"] = Value::from(pid + 1);
    header["thread"]["name"] = Value::Null;
    header["metadata"]["model"] = Value::from("other model");
    let other = dir.join("other.ndjson");
    std::fs::write(&other, format!("{header}\n{rest}")).unwrap();
    let out = dir.join("processes.json");
    let (trace, said) = chrome(&[&a, &other], &out);
    assert!(said.contains("6 passes, 36 layers, 2 anomalies"), "{said}");
    check_format(&trace);
    let events = events(&trace);
    let names: Vec<(u64, u64, &str, &str)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] != "thread_sort_index")
        .map(|e| {
            let (pid, tid) = track(e);
            (
                pid,
                tid,
                e["name"].as_str().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    let renumbered = trace["metadata"]["sessions"][1]["tid"].as_u64().unwrap();
    assert_ne!(renumbered, thread, "viewers key threads by tid alone");
    assert_eq!(
        names,
        [
            (pid, thread, "process_name", "model-trace"),
            (pid, thread, "thread_name", "worker-a"),
            (pid + 1, renumbered, "process_name", "other model"),
            (
                pid + 1,
                renumbered,
                "thread_name",
                &*format!("thread {thread}")
            ),
        ]
    );
    let passes_of = |pid: u64| {
        events
            .iter()
            .filter(|e| e["cat"] == "pass" && e["pid"] == pid)
            .count()
    };
    assert_eq!((passes_of(pid), passes_of(pid + 1)), (PASSES, PASSES));
}

#[test]
fn a_missing_file_exits_2_naming_it_and_writes_nothing() {
    let dir = scratch("missing");
    let out = dir.join("never.json");
    let missing = run(&[
        "chrome",
        "/nonexistent/trace.ndjson",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        text(&missing).contains("/nonexistent/trace.ndjson"),
        "{}",
        text(&missing)
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

//! Traces leaving the process: a small annotated model writes trace files, which read back to
//! the same records; captured tensors read back to the same bits; what goes wrong (a cut file,
//! a full disk, an unwritable path, a panic, two threads) is reported, never lost silently.
//!
//! Nothing here reads the caller's environment except the one test of `MODEL_TRACE_OUT`, which
//! sets the session's variables and restores what the caller had.

use model_trace::{
    trace_attention, trace_kv_cache, trace_layer, trace_logits, trace_model, trace_quant,
    trace_tensor, ModelTracerConfig, Session,
};

const WIDTH: usize = 6;

struct Cache {
    keys: Vec<f32>,
}

impl Cache {
    #[trace_kv_cache(len = self.keys.len(), capacity = 64, bytes = self.keys.len() * 4)]
    fn append(&mut self, key: f32) {
        self.keys.push(key);
    }
}

struct Block {
    gain: f32,
    /// Makes the block produce NaN and Inf when set.
    poison: bool,
}

impl Block {
    #[trace_layer]
    fn forward(&self, x: &[f32], cache: &mut Cache) -> Vec<f32> {
        let attn_in: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
        trace_tensor!("attn_in", &attn_in);
        cache.append(attn_in[0]);
        let probs = self.attention(cache);
        let mixed: f32 = probs.iter().zip(&cache.keys).map(|(p, k)| p * k).sum();
        let mut mlp_out = self.project(&attn_in);
        if self.poison {
            mlp_out[1] = f32::NAN;
            mlp_out[2] = f32::NEG_INFINITY;
        }
        trace_tensor!("mlp_out", &mlp_out);
        x.iter().zip(&mlp_out).map(|(a, b)| a + b + mixed).collect()
    }

    /// One query over every cached key: a softmax of the keys.
    #[trace_attention]
    fn attention(&self, cache: &Cache) -> Vec<f32> {
        let exp: Vec<f32> = cache.keys.iter().map(|k| k.exp()).collect();
        let sum: f32 = exp.iter().sum();
        exp.iter().map(|e| e / sum).collect()
    }

    fn exact(&self, x: &[f32]) -> Vec<f32> {
        x.iter().map(|v| v * self.gain).collect()
    }

    /// The gain rounded to a 1/16 grid, standing in for a quantized kernel.
    #[trace_quant(reference = Self::exact, quant = Q8_0)]
    fn project(&self, x: &[f32]) -> Vec<f32> {
        let gain = (self.gain * 16.0).round() / 16.0;
        x.iter().map(|v| v * gain).collect()
    }
}

struct Model {
    blocks: Vec<Block>,
    caches: Vec<Cache>,
    /// Makes every logit NaN when set.
    nan_head: bool,
}

impl Model {
    fn new(layers: usize) -> Self {
        Model {
            blocks: (0..layers)
                .map(|i| Block {
                    gain: 0.3 + 0.1 * i as f32,
                    poison: false,
                })
                .collect(),
            caches: (0..layers).map(|_| Cache { keys: Vec::new() }).collect(),
            nan_head: false,
        }
    }

    #[trace_model(position = position)]
    fn forward(&mut self, token: f32, position: usize) -> Vec<f32> {
        let mut x: Vec<f32> = (0..WIDTH).map(|i| token + i as f32 * 0.25).collect();
        for (block, cache) in self.blocks.iter().zip(&mut self.caches) {
            x = block.forward(&x, cache);
        }
        self.head(&x)
    }

    #[trace_logits]
    fn head(&self, x: &[f32]) -> Vec<f32> {
        let scale = if self.nan_head { f32::NAN } else { 2.0 };
        let mut logits: Vec<f32> = x.iter().map(|v| v * scale).collect();
        logits.extend(x.iter().map(|v| -v * scale / 2.0));
        logits
    }

    fn generate(&mut self, steps: usize) -> Vec<Vec<f32>> {
        (0..steps)
            .map(|position| self.forward(position as f32 * 0.1, position))
            .collect()
    }
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("model-trace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[cfg(not(feature = "enabled"))]
#[test]
fn compiled_out_sessions_write_no_file() {
    let dir = scratch_dir("off");
    let path = dir.join("run.ndjson");
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(&path)
        .start()
        .expect("starts");
    assert_eq!(session.trace_file(), None);
    Model::new(2).generate(2);
    assert!(session.finish().activation_traces().is_empty());
    assert!(!path.exists());
}

#[cfg(feature = "enabled")]
mod enabled {
    use super::*;
    use model_trace::{
        read_capture, Event, ModelTracer, ReadError, RecordErrorKind, SessionError, TraceReader,
        SCHEMA_VERSION,
    };
    use std::io::Write as _;
    use std::path::Path;

    fn read_all(path: &Path) -> (model_trace::TraceHeader, Vec<Event>) {
        let mut reader = TraceReader::open(path).expect("a trace file");
        let events = (&mut reader)
            .collect::<Result<Vec<_>, _>>()
            .expect("every line reads");
        (reader.header().clone(), events)
    }

    fn json<T: serde::Serialize>(value: &T) -> String {
        serde_json::to_string(value).expect("serializes")
    }

    #[test]
    fn a_trace_file_reads_back_to_the_tracer_recorded_in_memory() {
        let dir = scratch_dir("round-trip");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file(&path)
            .in_memory(true)
            .model("tiny")
            .prompt("0.0 0.1 0.2")
            .start()
            .expect("the file can be created");
        assert_eq!(session.trace_file(), Some(path.as_path()));
        let outputs = Model::new(3).generate(3);
        let (in_memory, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            outputs,
            Model::new(3).generate(3),
            "tracing changed the outputs"
        );

        let (header, events) = read_all(&path);
        assert_eq!(header.schema, SCHEMA_VERSION);
        assert_eq!(header.config, ModelTracerConfig::full());
        assert_eq!(header.metadata.model.as_deref(), Some("tiny"));
        assert_eq!(header.tracepoints.len(), model_trace::tracepoints().len());
        let replayed = ModelTracer::from_events(header.config.clone(), &events);
        assert_eq!(json(&replayed), json(&in_memory));
        assert_eq!(replayed.summary(), in_memory.summary());

        // What the file holds, kind by kind: 3 passes of 3 layers, each with input, two stages
        // and output, all with digests; attention, KV and quant per layer, logits per pass.
        let count = |kind: &str| events.iter().filter(|e| e.kind_name() == kind).count();
        assert_eq!((count("pass_begin"), count("pass_end")), (3, 3));
        assert_eq!(count("layer"), 9);
        assert_eq!(
            (count("attention"), count("kv_cache"), count("quant")),
            (9, 9, 9)
        );
        assert_eq!((count("logits"), count("session_end")), (3, 1));
        for event in &events {
            if let Event::Layer(layer) = event {
                let names: Vec<&str> = layer.stages.iter().map(|s| s.name.as_ref()).collect();
                assert_eq!(names, ["input", "attn_in", "mlp_out", "output"]);
                assert!(layer.stages.iter().all(|s| s.tensor.has_digest()));
                assert_eq!(layer.stages[0].tensor.shape, [WIDTH]);
                // stages are numbered in execution order, after the layer itself
                let seqs: Vec<u64> = layer.stages.iter().map(|s| s.seq).collect();
                assert!(seqs.windows(2).all(|w| w[0] < w[1]) && seqs[0] > layer.seq);
                assert_eq!(layer.function, "trace_file::forward");
            }
            if let Event::KvCache(kv) = event {
                assert!(
                    kv.state.layer.is_some(),
                    "each layer's cache says which it is"
                );
            }
        }
        // sequence numbers are unique
        let mut seqs: Vec<u64> = events.iter().map(Event::seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), events.len());
    }

    #[test]
    fn a_file_backed_session_keeps_only_the_summary_unless_asked() {
        let dir = scratch_dir("summary-only");
        let run = |path: &Path, keep: Option<bool>| {
            let builder = Session::builder(ModelTracerConfig::full()).trace_file(path);
            let builder = match keep {
                Some(keep) => builder.in_memory(keep),
                None => builder,
            };
            let session = builder.start().expect("starts");
            let mut model = Model::new(3);
            model.blocks[1].poison = true;
            model.generate(3);
            session.finish()
        };
        let by_default = run(&dir.join("default.ndjson"), None);
        let kept = run(&dir.join("kept.ndjson"), Some(true));
        assert!(by_default.is_summary_only() && !kept.is_summary_only());
        assert!(by_default.activation_traces().is_empty());
        assert!(by_default.attention_traces().is_empty());
        assert!(by_default.logit_traces().is_empty());
        assert!(by_default.quant_traces().is_empty());
        assert!(by_default.kv_trace().steps.is_empty());
        assert_eq!(kept.activation_traces().len(), 3);
        // The summary covers every record either way, and says where the records are.
        let (summary, kept_summary) = (by_default.summary(), kept.summary());
        assert!(summary.summary_only && !kept_summary.summary_only);
        assert_eq!(summary.records_dropped, 0);
        assert_eq!(
            model_trace::ModelTracerSummary {
                summary_only: false,
                ..summary.clone()
            },
            kept_summary
        );
        assert_eq!((summary.total_forwards, summary.anomalies_detected), (3, 3));
        assert!(
            summary.to_string().contains("Records: in the trace file"),
            "{summary}"
        );
        // Without a file, records are kept as before.
        let session = Session::builder(ModelTracerConfig::full())
            .start()
            .expect("starts");
        Model::new(3).generate(1);
        assert!(!session.finish().is_summary_only());
    }

    #[test]
    fn each_rank_writes_its_own_file_and_says_so() {
        let dir = scratch_dir("ranks");
        let asked = dir.join("run.ndjson");
        let files: Vec<_> = (0..2)
            .map(|rank| {
                let session = Session::builder(ModelTracerConfig::lightweight())
                    .trace_file(&asked)
                    .rank(rank, 2)
                    .run("launch-1")
                    .start()
                    .expect("starts");
                let file = session.trace_file().expect("a file").to_path_buf();
                Model::new(2).generate(1);
                drop(session.finish());
                file
            })
            .collect();
        assert_eq!(
            files,
            [dir.join("run.rank0.ndjson"), dir.join("run.rank1.ndjson")]
        );
        for (rank, file) in files.iter().enumerate() {
            let (header, events) = read_all(file);
            assert_eq!((header.rank, header.world_size), (Some(rank), Some(2)));
            assert_eq!(header.run, "launch-1");
            assert!(events.iter().any(|e| e.kind_name() == "layer"));
        }
        // Without a rank, the header says none, and the run is the process's.
        let session = Session::builder(ModelTracerConfig::lightweight())
            .trace_file(dir.join("plain.ndjson"))
            .start()
            .expect("starts");
        let file = session.trace_file().expect("a file").to_path_buf();
        drop(session.finish());
        let (header, _) = read_all(&file);
        assert_eq!((header.rank, header.world_size), (None, None));
        assert!(!header.run.is_empty());
    }

    #[test]
    fn timing_nests_layers_inside_their_pass() {
        let dir = scratch_dir("timing");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::lightweight())
            .trace_file(&path)
            .start()
            .expect("starts");
        Model::new(2).generate(2);
        session.finish();
        let (header, events) = read_all(&path);
        let mut pass_start = 0;
        for event in &events {
            match event {
                Event::PassBegin(begin) => {
                    assert!(begin.start_ns >= header.clock.session_start_ns);
                    pass_start = begin.start_ns;
                }
                Event::Layer(layer) => assert!(layer.start_ns >= pass_start),
                Event::PassEnd(end) => assert!(end.duration_ns > 0),
                _ => {}
            }
        }
    }

    #[test]
    fn nan_and_infinity_round_trip_exactly() {
        let dir = scratch_dir("nan");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::lightweight())
            .trace_file(&path)
            .in_memory(true)
            .start()
            .expect("starts");
        let mut model = Model::new(2);
        model.blocks[1].poison = true;
        model.generate(1);
        let in_memory = session.finish();
        let (header, events) = read_all(&path);
        let layer = events
            .iter()
            .find_map(|e| match e {
                Event::Layer(layer) if layer.layer == 1 => Some(layer),
                _ => None,
            })
            .expect("layer 1");
        let mlp_out = &layer.stage("mlp_out").expect("mlp_out").tensor;
        assert!(mlp_out.head[1].is_nan());
        assert_eq!(mlp_out.head[2], f32::NEG_INFINITY);
        assert_eq!((mlp_out.stats.nan_count, mlp_out.stats.inf_count), (1, 1));
        let end = events
            .iter()
            .find_map(|e| match e {
                Event::PassEnd(end) => Some(end),
                _ => None,
            })
            .expect("pass end");
        assert_eq!(end.anomalies[0].layer, 1);
        assert_eq!(end.anomalies[0].stage.as_deref(), Some("mlp_out"));
        let replayed = ModelTracer::from_events(header.config, &events);
        assert_eq!(json(&replayed), json(&in_memory));
    }

    #[test]
    fn a_decode_step_with_nan_logits_is_written_and_flagged() {
        let dir = scratch_dir("nan-logits");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file(&path)
            .in_memory(true)
            .start()
            .expect("starts");
        let mut model = Model::new(2);
        model.forward(0.0, 0);
        model.nan_head = true;
        assert!(model.forward(0.1, 1).iter().all(|v| v.is_nan()));
        let (in_memory, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        let (header, events) = read_all(&path);

        // Both steps' logits are in the file; the second's statistics count its NaN.
        let logits: Vec<(usize, usize, usize)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Logits(l) => Some((l.pass, l.layer, l.logits.stats.nan_count)),
                _ => None,
            })
            .collect();
        assert_eq!(logits, [(0, 2, 0), (1, 2, 2 * WIDTH)]);
        // The second pass ends with an anomaly of its logits, the first with none.
        let anomalies: Vec<Vec<String>> = events
            .iter()
            .filter_map(|e| match e {
                Event::PassEnd(end) => Some(
                    end.anomalies
                        .iter()
                        .map(|a| a.description.clone())
                        .collect(),
                ),
                _ => None,
            })
            .collect();
        assert_eq!(
            anomalies,
            [
                vec![],
                vec!["layer 2 logits: NaN (12 of 12 values)".to_owned()]
            ]
        );
        let summary = in_memory.summary();
        assert_eq!(summary.anomalies_detected, 1);
        assert_eq!(summary.first_anomaly_position, Some(1));
        // The first step's logit trace is there; the second had no finite logit to follow.
        assert_eq!(in_memory.logit_traces().len(), 1);
        let replayed = ModelTracer::from_events(header.config, &events);
        assert_eq!(json(&replayed), json(&in_memory));
    }

    #[test]
    fn the_entropy_of_a_row_with_one_key_is_written_as_zero() {
        let dir = scratch_dir("entropy");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file(&path)
            .start()
            .expect("starts");
        // The first step attends to one cached key: weight 1, entropy 0.
        Model::new(1).generate(1);
        session.finish();
        let text = std::fs::read_to_string(&path).expect("written");
        let attention = text
            .lines()
            .find(|line| line.starts_with(r#"{"event":"attention""#))
            .expect("an attention event");
        assert!(attention.contains(r#""entropy":0.0,"#), "{attention}");
        assert!(!text.contains(r#""entropy":-0.0"#));
    }

    #[test]
    fn a_cut_last_line_is_reported_and_everything_before_it_is_read() {
        let dir = scratch_dir("cut");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file(&path)
            .start()
            .expect("starts");
        Model::new(2).generate(2);
        session.finish();
        let text = std::fs::read_to_string(&path).expect("written");
        let complete_lines = text.lines().count();
        // cut in the middle of the last line, as a crash would
        let cut = &text[..text.len() - 20];
        let cut_path = dir.join("cut.ndjson");
        std::fs::write(&cut_path, cut).expect("write");
        let results: Vec<_> = TraceReader::open(&cut_path)
            .expect("header reads")
            .collect();
        let (last, complete) = results.split_last().expect("events");
        assert_eq!(
            complete.len(),
            complete_lines - 2,
            "all but the header and the cut line"
        );
        assert!(complete.iter().all(Result::is_ok));
        match last {
            Err(error @ ReadError::Truncated { line, .. }) => {
                assert_eq!(*line, complete_lines);
                assert!(error.is_truncation());
                assert!(error.to_string().contains("cut short"), "{error}");
            }
            other => panic!("expected a truncation, got {other:?}"),
        }

        // a bad line in the middle is an error naming it, and reading goes on
        let mut lines: Vec<&str> = text.lines().collect();
        lines[3] = r#"{"event":"layer","seq":"three"}"#;
        let bad_path = dir.join("bad.ndjson");
        std::fs::write(&bad_path, lines.join("\n") + "\n").expect("write");
        let results: Vec<_> = TraceReader::open(&bad_path).expect("header").collect();
        let errors: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(ToString::to_string))
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("bad.ndjson:4:"), "{}", errors[0]);
        assert!(errors[0].contains("bad \"layer\" event"), "{}", errors[0]);
        assert_eq!(results.len(), complete_lines - 1);

        // a newer schema is refused up front
        let newer = text.replacen(
            &format!("\"schema\":{SCHEMA_VERSION}"),
            &format!("\"schema\":{}", SCHEMA_VERSION + 1),
            1,
        );
        let newer_path = dir.join("newer.ndjson");
        std::fs::write(&newer_path, newer).expect("write");
        let error = TraceReader::open(&newer_path).expect_err("refused");
        assert!(
            matches!(error, ReadError::UnsupportedSchema { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("upgrade model-trace"), "{error}");
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let path = Path::new("/nonexistent-model-trace-dir/run.ndjson");
        let error = Session::builder(ModelTracerConfig::lightweight())
            .trace_file(path)
            .start()
            .expect_err("cannot create");
        assert!(matches!(error, SessionError::CreateFile { .. }));
        assert!(
            error
                .to_string()
                .contains("/nonexistent-model-trace-dir/run.ndjson"),
            "{error}"
        );
        assert!(!Session::is_active(), "no session was left behind");
    }

    #[test]
    fn a_full_disk_stops_the_file_and_is_reported_without_changing_the_model() {
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file("/dev/full")
            .in_memory(true)
            .start()
            .expect("/dev/full opens");
        let outputs = Model::new(3).generate(3);
        let during = session.errors();
        let (tracer, errors) = session.finish_with_errors();
        assert_eq!(outputs, Model::new(3).generate(3));
        let sink_errors: Vec<_> = errors
            .iter()
            .filter(|e| e.kind == RecordErrorKind::Sink)
            .collect();
        assert_eq!(sink_errors.len(), 1, "{errors:?}");
        assert!(
            sink_errors[0].message.contains("/dev/full"),
            "{}",
            sink_errors[0]
        );
        assert!(
            during.iter().any(|e| e.kind == RecordErrorKind::Sink),
            "Session::errors sees it too"
        );
        // the in-memory tracer went on recording
        assert_eq!(tracer.activation_traces().len(), 3);
        assert_eq!(tracer.summary().record_errors, 1);
    }

    #[test]
    fn two_threads_write_two_files_that_do_not_mix() {
        let dir = scratch_dir("threads");
        let path = dir.join("run.ndjson");
        let written: Vec<_> = (0..2)
            .map(|passes| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let session = Session::builder(ModelTracerConfig::lightweight())
                        .trace_file(&path)
                        .start()
                        .expect("starts");
                    Model::new(2).generate(passes + 2);
                    let file = session.trace_file().expect("a file").to_path_buf();
                    session.finish();
                    (passes + 2, file)
                })
            })
            .map(|thread| thread.join().expect("no panic"))
            .collect();
        assert_ne!(written[0].1, written[1].1);
        let mut names: Vec<String> = written
            .iter()
            .map(|(_, f)| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["run.1.ndjson", "run.ndjson"]);
        let mut threads = Vec::new();
        for (passes, file) in &written {
            let (header, events) = read_all(file);
            let begun = events
                .iter()
                .filter(|e| e.kind_name() == "pass_begin")
                .count();
            assert_eq!(begun, *passes, "{}", file.display());
            threads.push(header.thread.id);
        }
        assert_ne!(threads[0], threads[1]);
    }

    #[test]
    fn a_panic_leaves_a_complete_file() {
        let dir = scratch_dir("panic");
        let path = dir.join("run.ndjson");
        let thread_path = path.clone();
        let result = std::thread::spawn(move || {
            let _session = Session::builder(ModelTracerConfig::lightweight())
                .trace_file(&thread_path)
                .start()
                .expect("starts");
            let mut model = Model::new(2);
            model.generate(2);
            panic!("the model crashed");
        })
        .join();
        assert!(result.is_err());
        let (_, events) = read_all(&path);
        assert_eq!(events.last().map(Event::kind_name), Some("session_end"));
        assert_eq!(
            events
                .iter()
                .filter(|e| e.kind_name() == "pass_end")
                .count(),
            2
        );
    }

    #[test]
    fn captured_tensors_read_back_bit_for_bit() {
        let dir = scratch_dir("capture");
        let path = dir.join("run.ndjson");
        let session = Session::builder(ModelTracerConfig::lightweight())
            .trace_file(&path)
            .capture("layer:*,tensor:mlp_out,pass=1")
            .start()
            .expect("starts");
        let mut model = Model::new(2);
        model.blocks[0].poison = true;
        model.generate(3);
        session.finish();
        let (_, events) = read_all(&path);
        let mut captured = 0;
        for event in &events {
            let Event::Layer(layer) = event else { continue };
            for stage in &layer.stages {
                let wanted = layer.pass == 1 && stage.name != "attn_in";
                assert_eq!(
                    stage.tensor.capture.is_some(),
                    wanted,
                    "pass {} {}",
                    layer.pass,
                    stage.name
                );
                let Some(reference) = &stage.tensor.capture else {
                    continue;
                };
                let (shape, values) = read_capture(&path, reference).expect("reads");
                assert_eq!(shape, stage.tensor.shape);
                assert_eq!(
                    model_trace::Fingerprint::of(&values),
                    stage.tensor.fingerprint.expect("digest")
                );
                // and with the safetensors crate
                let bytes = std::fs::read(dir.join(&reference.file)).expect("chunk");
                let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
                let view = file.tensor(&reference.tensor).expect("named");
                assert_eq!(view.shape(), shape.as_slice());
                let from_crate: Vec<u32> = view
                    .data()
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                assert_eq!(
                    from_crate,
                    values.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
                captured += 1;
            }
        }
        assert_eq!(
            captured,
            2 * 3,
            "input, mlp_out and output of 2 layers in pass 1"
        );
    }

    #[test]
    fn a_capture_needs_a_trace_file() {
        let error = Session::builder(ModelTracerConfig::lightweight())
            .capture("layer:*")
            .start()
            .expect_err("refused");
        assert!(matches!(error, SessionError::CaptureWithoutFile), "{error}");
    }

    /// Sets `MODEL_TRACE_OUT` to `path`, with `MODEL_TRACE` and `MODEL_TRACE_CAPTURE` unset,
    /// for as long as it lives; restores what the caller had when dropped.
    struct TraceOut(Vec<(&'static str, Option<std::ffi::OsString>)>);

    impl TraceOut {
        fn set(path: impl AsRef<std::ffi::OsStr>) -> Self {
            use model_trace::{CAPTURE_ENV_VAR, FILTER_ENV_VAR, OUT_ENV_VAR};
            let saved = [FILTER_ENV_VAR, OUT_ENV_VAR, CAPTURE_ENV_VAR]
                .into_iter()
                .map(|var| (var, std::env::var_os(var)))
                .collect();
            std::env::remove_var(FILTER_ENV_VAR);
            std::env::remove_var(CAPTURE_ENV_VAR);
            std::env::set_var(OUT_ENV_VAR, path);
            Self(saved)
        }
    }

    impl Drop for TraceOut {
        fn drop(&mut self) {
            for (var, value) in &self.0 {
                match value {
                    Some(value) => std::env::set_var(var, value),
                    None => std::env::remove_var(var),
                }
            }
        }
    }

    #[test]
    fn model_trace_out_turns_the_file_on_without_code() {
        let dir = scratch_dir("env");
        let path = dir.join("from-env.ndjson");
        let environment = TraceOut::set(&path);
        let session = Session::start(ModelTracerConfig::lightweight());
        drop(environment);
        assert_eq!(session.trace_file(), Some(path.as_path()));
        Model::new(1).generate(1);
        session.finish();
        let (_, events) = read_all(&path);
        assert_eq!(
            events.iter().filter(|e| e.kind_name() == "layer").count(),
            1
        );

        // an unusable value is reported and the session goes on without the file
        let environment = TraceOut::set("/nonexistent-model-trace-dir/x.ndjson");
        let session = Session::start(ModelTracerConfig::lightweight());
        drop(environment);
        assert_eq!(session.trace_file(), None);
        let errors = session.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].kind, RecordErrorKind::Config);
        assert!(errors[0]
            .message
            .contains("/nonexistent-model-trace-dir/x.ndjson"));
        Model::new(1).generate(1);
        assert_eq!(session.finish().activation_traces().len(), 1);
    }

    #[test]
    fn a_user_sink_sees_every_event_in_order() {
        use std::sync::{Arc, Mutex};

        #[derive(Default, Clone)]
        struct Recorder(Arc<Mutex<Vec<String>>>);

        impl model_trace::TraceSink for Recorder {
            fn name(&self) -> std::borrow::Cow<'_, str> {
                "recorder".into()
            }

            fn event(&mut self, event: &Event) -> Result<(), model_trace::SinkError> {
                self.0.lock().unwrap().push(event.kind_name().to_owned());
                Ok(())
            }
        }

        let recorder = Recorder::default();
        let session = Session::builder(ModelTracerConfig::lightweight())
            .sink(recorder.clone())
            .in_memory(false)
            .start()
            .expect("starts");
        Model::new(1).generate(1);
        assert!(
            session.finish().activation_traces().is_empty(),
            "nothing kept in memory"
        );
        let kinds = recorder.0.lock().unwrap().clone();
        assert_eq!(
            kinds,
            ["pass_begin", "kv_cache", "layer", "pass_end", "session_end"]
        );
    }

    #[test]
    fn the_sketch_sees_what_statistics_cannot() {
        // Two layers' outputs with the same values in another order: equal statistics,
        // different sketches and fingerprints.
        let values: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut reversed = values.clone();
        reversed.reverse();
        let a = model_trace::TensorSummary::of_values(vec![64], "f32", &values);
        let b = model_trace::TensorSummary::of_values(vec![64], "f32", &reversed);
        assert_eq!(a.stats.count, b.stats.count);
        assert!((a.stats.mean - b.stats.mean).abs() < 1e-6);
        assert_ne!(a.sketch, b.sketch);
        assert_ne!(a.fingerprint, b.fingerprint);
        // a file written line by line can be read by anything that reads NDJSON
        let mut line = Vec::new();
        serde_json::to_writer(&mut line, &a).unwrap();
        line.write_all(b"\n").unwrap();
        assert!(serde_json::from_slice::<serde_json::Value>(&line).is_ok());
    }

    #[cfg(feature = "tracing")]
    #[test]
    fn passes_and_layers_become_tracing_spans() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::{Context, SubscriberExt as _};
        use tracing_subscriber::registry::LookupSpan;
        use tracing_subscriber::Layer;

        /// Records each span's name with its parent's, and each event with its span.
        #[derive(Clone, Default)]
        struct Spans(Arc<Mutex<Vec<String>>>);

        impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
            fn on_new_span(
                &self,
                _: &tracing::span::Attributes<'_>,
                id: &tracing::span::Id,
                ctx: Context<'_, S>,
            ) {
                let span = ctx.span(id).expect("new span");
                let parent = span.parent().map_or("-", |p| p.name());
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("span {} in {parent}", span.name()));
            }

            fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
                let within = ctx.event_span(event).map_or("-", |s| s.name());
                let mut message = String::new();
                struct Message<'a>(&'a mut String);
                impl tracing::field::Visit for Message<'_> {
                    fn record_debug(
                        &mut self,
                        field: &tracing::field::Field,
                        value: &dyn std::fmt::Debug,
                    ) {
                        if field.name() == "message" {
                            *self.0 = format!("{value:?}");
                        }
                    }
                }
                event.record(&mut Message(&mut message));
                self.0
                    .lock()
                    .unwrap()
                    .push(format!("event {message} in {within}"));
            }
        }

        let seen = Spans::default();
        let subscriber = tracing_subscriber::registry().with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            let session = Session::builder(ModelTracerConfig::lightweight())
                .sink(model_trace::TracingSink::new())
                .start()
                .expect("starts");
            let mut model = Model::new(2);
            model.blocks[1].poison = true;
            model.generate(1);
            session.finish();
        });
        let seen = seen.0.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                "span pass in -",
                "span layer in pass",
                "event kv_cache in layer",
                "event layer recorded in layer",
                "span layer in pass",
                "event kv_cache in layer",
                "event layer recorded in layer",
                "event anomaly: layer 1 mlp_out: NaN (1 of 6 values) in pass",
            ]
        );
    }
}

//! SmolLM2 run pipeline-parallel (two stages, layers 0-14 and 15-29, each on a thread of its
//! own with its own session and trace file) against the whole model on one thread: the same
//! tokens and logits, and rank traces that are the one-rank trace cut in two (with `--features
//! trace`); and the pipeline itself, traced or not. Missing weights fail the tests (never skip):
//! run `scripts/fetch-models`.

use model_trace::{ModelTracerConfig, Session};
use smollm::generate::{greedy, load};
use smollm::model::argmax;
use smollm::pipeline::{split, Pipeline, PipelineError};
use smollm::{GgufTokenizer, Model};

const PROMPT: &str = "The capital of France is";
const STAGES: usize = 2;

fn load_model() -> (Model, GgufTokenizer) {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
}

#[test]
fn greedy_on_a_pipeline_says_what_greedy_on_the_model_says() {
    let (mut model, tokenizer) = load_model();
    let whole = greedy(&mut model, &tokenizer, PROMPT, 6).unwrap();
    let (model, _) = load_model();
    // Four stages of 30 blocks: 7, 8, 7 and 8 of them.
    let mut pipeline = Pipeline::spawn(model, 4).unwrap();
    let pipelined = greedy(&mut pipeline, &tokenizer, PROMPT, 6).unwrap();
    assert_eq!(pipelined.generated, whole.generated);
    assert_eq!(pipelined.text, whole.text);
    let stages = pipeline.finish().unwrap();
    let layers: Vec<_> = stages.iter().map(|stage| stage.layers.clone()).collect();
    assert_eq!(layers, [0..7, 7..15, 15..22, 22..30]);
    assert!(stages.iter().all(|stage| stage.traced.is_none()));
}

#[test]
fn split_refuses_no_stages_more_stages_than_layers_and_the_logit_lens() {
    let (model, _) = load_model();
    assert!(matches!(
        split(model, 0),
        Err(PipelineError::Stages {
            stages: 0,
            layers: 30
        })
    ));
    let (model, _) = load_model();
    assert!(matches!(
        split(model, 31),
        Err(PipelineError::Stages { stages: 31, .. })
    ));
    let (mut model, _) = load_model();
    model.logit_lens = true;
    assert!(matches!(split(model, 2), Err(PipelineError::LogitLens)));
    let (model, _) = load_model();
    let layers: Vec<_> = split(model, 30)
        .unwrap()
        .iter()
        .map(|stage| stage.layers())
        .collect();
    assert_eq!(layers, (0..30).map(|i| i..i + 1).collect::<Vec<_>>());
}

#[test]
fn a_failing_stage_is_an_error_that_names_it_and_the_pipeline_goes_on() {
    let (model, tokenizer) = load_model();
    let prompt = tokenizer.encode(PROMPT).unwrap();
    let mut pipeline = Pipeline::spawn(model, STAGES).unwrap();
    let error = pipeline.forward(&prompt, 3).unwrap_err();
    assert!(
        matches!(error, PipelineError::Stage { rank: 0, .. }),
        "{error:?}"
    );
    // (candle appends a backtrace when RUST_BACKTRACE is set)
    let message = error.to_string();
    assert!(
        message.starts_with(
            "stage 0 (layers 0-14): forward at position 3, but 0 positions are cached"
        ),
        "{message}"
    );
    let logits = pipeline.forward(&prompt, 0).unwrap();
    assert_eq!(
        tokenizer.decode(&[argmax(&logits).unwrap()]).unwrap(),
        " Paris"
    );
    pipeline.finish().unwrap();
}

#[test]
fn a_session_starter_that_panics_is_an_error_not_a_hang() {
    let (model, _) = load_model();
    let result = Pipeline::spawn_traced(model, STAGES, |rank, stages| {
        assert_eq!(rank, 0, "no session for rank {rank}");
        Session::builder(ModelTracerConfig::lightweight())
            .rank(rank, stages)
            .start()
    });
    match result {
        Err(PipelineError::Panicked {
            rank: 1, message, ..
        }) => {
            assert!(message.contains("no session for rank 1"), "{message}");
        }
        Err(other) => panic!("another error: {other:?}"),
        Ok(_) => panic!("the pipeline started"),
    }
}

/// The traced runs: what the ranks' trace files say.
#[cfg(feature = "trace")]
mod traced {
    use super::{load_model, PROMPT, STAGES};
    use model_trace::{
        Event, LayerBegin, ModelTracerConfig, Session, SinkError, TensorSummary, TraceHeader,
        TraceReader, TraceSink,
    };
    use smollm::generate::Decoder;
    use smollm::model::argmax;
    use smollm::pipeline::{Pipeline, PipelineError};
    use std::borrow::Cow;
    use std::collections::BTreeMap;
    use std::ops::RangeInclusive;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;

    /// Forward passes of each run: the prompt, then single tokens.
    const STEPS: usize = 3;
    /// The layers of SmolLM2's two stages, and the layer its logits are recorded at.
    const RANK_LAYERS: [RangeInclusive<usize>; STAGES] = [0..=14, 15..=29];
    const LOGITS_LAYER: usize = 30;

    /// A trace file path of this test process, unique per `name`.
    fn trace_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("smollm-{name}-{}.ndjson", std::process::id()))
    }

    /// What a session for `path` records; the caller's environment is not read.
    fn session_builder(path: &Path) -> model_trace::SessionBuilder {
        Session::builder(ModelTracerConfig::full()).trace_file(path)
    }

    /// Greedy decoding for `STEPS` forward passes: the generated ids and each pass's logits.
    fn decode(decoder: &mut impl Decoder, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
        let mut generated = Vec::new();
        let mut all_logits = Vec::new();
        let mut logits = decoder.forward(prompt, 0).unwrap();
        for step in 0..STEPS {
            let next = argmax(&logits).unwrap();
            generated.push(next);
            all_logits.push(logits.to_vec1::<f32>().unwrap());
            if step + 1 < STEPS {
                logits = decoder.forward(&[next], prompt.len() + step).unwrap();
            }
        }
        (generated, all_logits)
    }

    /// A traced run and the trace files it wrote, rank by rank.
    struct Run {
        generated: Vec<u32>,
        logits: Vec<Vec<f32>>,
        files: Vec<Trace>,
    }

    /// A trace file read back.
    struct Trace {
        header: TraceHeader,
        events: Vec<Event>,
    }

    fn read(path: &Path) -> Trace {
        let mut reader = TraceReader::open(path).unwrap_or_else(|e| panic!("{e}"));
        let events = (&mut reader)
            .map(|event| event.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .collect();
        Trace {
            header: reader.header().clone(),
            events,
        }
    }

    /// The whole model on this thread, in one session without a rank.
    fn one_rank() -> &'static Run {
        static RUN: OnceLock<Run> = OnceLock::new();
        RUN.get_or_init(|| {
            let (mut model, tokenizer) = load_model();
            let prompt = tokenizer.encode(PROMPT).unwrap();
            let session = session_builder(&trace_path("one-rank"))
                .start()
                .unwrap_or_else(|e| panic!("{e}"));
            let file = session.trace_file().unwrap().to_path_buf();
            let (generated, logits) = decode(&mut model, &prompt);
            let (_, errors) = session.finish_with_errors();
            assert!(errors.is_empty(), "not recorded: {errors:?}");
            Run {
                generated,
                logits,
                files: vec![read(&file)],
            }
        })
    }

    /// The model in two stages, each in a session of its own as rank r of 2.
    fn two_ranks() -> &'static Run {
        static RUN: OnceLock<Run> = OnceLock::new();
        RUN.get_or_init(|| {
            let (model, tokenizer) = load_model();
            let prompt = tokenizer.encode(PROMPT).unwrap();
            let path = trace_path("two-ranks");
            let mut pipeline = Pipeline::spawn_traced(model, STAGES, move |rank, stages| {
                session_builder(&path).rank(rank, stages).start()
            })
            .unwrap_or_else(|e| panic!("{e}"));
            let (generated, logits) = decode(&mut pipeline, &prompt);
            let stages = pipeline.finish().unwrap_or_else(|e| panic!("{e}"));
            let mut files = Vec::new();
            for (rank, stage) in stages.into_iter().enumerate() {
                assert_eq!(stage.rank, rank);
                let (_, errors) = stage.traced.expect("a traced stage");
                assert!(errors.is_empty(), "rank {rank} did not record: {errors:?}");
                let file = stage.trace_file.expect("a trace file");
                assert_eq!(
                    file.file_name().and_then(|name| name.to_str()),
                    Some(
                        format!("smollm-two-ranks-{}.rank{rank}.ndjson", std::process::id())
                            .as_str()
                    )
                );
                files.push(read(&file));
            }
            Run {
                generated,
                logits,
                files,
            }
        })
    }

    /// Every tensor summary of a trace by where it was recorded: each layer's stages by (pass,
    /// layer, stage), the logits as stage `logits`, attention probabilities as stage `attention`.
    fn summaries(trace: &Trace) -> BTreeMap<(usize, usize, String), TensorSummary> {
        let mut all = BTreeMap::new();
        for event in &trace.events {
            match event {
                Event::Layer(layer) => {
                    for stage in &layer.stages {
                        let key = (layer.pass, layer.layer, stage.name.to_string());
                        assert!(all.insert(key, stage.tensor.clone()).is_none());
                    }
                }
                Event::Logits(logits) => {
                    let key = (logits.pass, logits.layer, "logits".to_owned());
                    assert!(all.insert(key, logits.logits.clone()).is_none());
                }
                Event::Attention(attention) => {
                    let pass = attention.pass.expect("attention inside a pass");
                    let key = (pass, attention.layer, "attention".to_owned());
                    assert!(all.insert(key, attention.probs.clone()).is_none());
                }
                _ => {}
            }
        }
        all
    }

    /// The (pass, position, tracepoint) of every pass a trace began.
    fn passes(trace: &Trace) -> Vec<(usize, usize, String)> {
        trace
            .events
            .iter()
            .filter_map(|event| match event {
                Event::PassBegin(begin) => {
                    Some((begin.pass, begin.position, begin.tracepoint.to_string()))
                }
                _ => None,
            })
            .collect()
    }

    /// The layer index of every record of a trace that has one, with what it is.
    fn layers_recorded(trace: &Trace) -> Vec<(&'static str, usize)> {
        trace
            .events
            .iter()
            .filter_map(|event| match event {
                Event::Layer(layer) => Some(("layer", layer.layer)),
                Event::Logits(logits) => Some(("logits", logits.layer)),
                Event::Attention(attention) => Some(("attention", attention.layer)),
                Event::KvCache(kv) => Some(("kv_cache", kv.state.layer.expect("a layer's cache"))),
                Event::Quant(quant) => Some(("quant", quant.error.layer_idx)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn two_stages_decode_the_same_tokens_with_bit_identical_logits() {
        let (one, two) = (one_rank(), two_ranks());
        let (_, tokenizer) = load_model();
        assert!(
            tokenizer.decode(&one.generated).unwrap().contains("Paris"),
            "continuation: {:?}",
            tokenizer.decode(&one.generated)
        );
        assert_eq!(two.generated, one.generated);
        for (step, (one, two)) in one.logits.iter().zip(&two.logits).enumerate() {
            let bits = |logits: &[f32]| logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(bits(one) == bits(two), "step {step}: logits differ");
        }
    }

    #[test]
    fn headers_name_the_rank_the_world_size_and_one_run() {
        let (one, two) = (one_rank(), two_ranks());
        let header = &one.files[0].header;
        assert_eq!((header.rank, header.world_size), (None, None));
        for (rank, file) in two.files.iter().enumerate() {
            let header = &file.header;
            assert_eq!((header.rank, header.world_size), (Some(rank), Some(STAGES)));
            assert!(!header.run.is_empty());
            assert_eq!(header.run, two.files[0].header.run);
            assert_eq!(
                header.thread.name.as_deref(),
                Some(format!("stage-{rank}").as_str())
            );
        }
    }

    #[test]
    fn each_rank_records_its_own_layers_and_the_last_the_logits_at_layer_30() {
        let two = two_ranks();
        for (rank, file) in two.files.iter().enumerate() {
            let recorded = layers_recorded(file);
            let mut layers: Vec<usize> = recorded
                .iter()
                .filter(|(what, _)| *what == "layer")
                .map(|&(_, layer)| layer)
                .collect();
            layers.sort_unstable();
            layers.dedup();
            assert_eq!(layers, RANK_LAYERS[rank].clone().collect::<Vec<_>>());
            for &(what, layer) in &recorded {
                // The head's logits and its quantized matmul are outside any layer: one past the
                // last, on the last rank only.
                let outside = (what == "logits" || what == "quant") && layer == LOGITS_LAYER;
                assert!(
                    RANK_LAYERS[rank].contains(&layer) || (outside && rank == STAGES - 1),
                    "rank {rank}: {what} at layer {layer}"
                );
            }
            let logits = recorded
                .iter()
                .filter(|(what, _)| *what == "logits")
                .count();
            let expected = if rank == STAGES - 1 { STEPS } else { 0 };
            assert_eq!(logits, expected, "rank {rank}: logits events");
        }
    }

    #[test]
    fn every_rank_has_the_passes_of_the_one_rank_run() {
        let (one, two) = (one_rank(), two_ranks());
        let whole = passes(&one.files[0]);
        assert_eq!(whole.len(), STEPS);
        for (rank, file) in two.files.iter().enumerate() {
            let rank_passes = passes(file);
            // Explicit passes (the stage's own `#[trace_model]`), none implicit.
            assert!(rank_passes
                .iter()
                .all(|(_, _, tracepoint)| tracepoint == "stage"));
            let numbered = |passes: &[(usize, usize, String)]| -> Vec<(usize, usize)> {
                passes
                    .iter()
                    .map(|&(pass, position, _)| (pass, position))
                    .collect()
            };
            assert_eq!(numbered(&rank_passes), numbered(&whole), "rank {rank}");
            for event in &file.events {
                match event {
                    Event::PassEnd(end) => {
                        assert_eq!(end.layers, RANK_LAYERS[rank].clone().count());
                        assert!(end.anomalies.is_empty(), "rank {rank}: {:?}", end.anomalies);
                    }
                    Event::Error(error) => panic!("rank {rank}: {error:?}"),
                    Event::SessionEnd(end) => assert_eq!(end.passes, STEPS),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn every_tensor_summary_equals_the_one_rank_runs() {
        let (one, two) = (one_rank(), two_ranks());
        let whole = summaries(&one.files[0]);
        // layers' seven stages and attention on 30 layers, logits at layer 30, every pass
        assert_eq!(whole.len(), STEPS * (30 * 8 + 1));
        let mut ranks = BTreeMap::new();
        for file in &two.files {
            ranks.extend(summaries(file));
        }
        assert_eq!(
            ranks.keys().collect::<Vec<_>>(),
            whole.keys().collect::<Vec<_>>()
        );
        for (key, summary) in &whole {
            assert!(summary.fingerprint.is_some(), "{key:?}: no fingerprint");
            assert!(
                &ranks[key] == summary,
                "{key:?}: the ranks recorded another tensor"
            );
        }
    }

    #[test]
    fn a_session_that_does_not_start_is_an_error_that_names_its_rank() {
        let (model, _) = load_model();
        let good = trace_path("session-error");
        let missing_dir = std::env::temp_dir().join(format!("no-such-dir-{}", std::process::id()));
        let result = Pipeline::spawn_traced(model, STAGES, move |rank, stages| {
            let path = if rank == 1 {
                missing_dir.join("run.ndjson")
            } else {
                good.clone()
            };
            session_builder(&path).rank(rank, stages).start()
        });
        match result {
            Err(error @ PipelineError::Session { rank: 1, .. }) => {
                assert!(error
                    .to_string()
                    .starts_with("the session of rank 1 did not start: "));
            }
            Err(other) => panic!("another error: {other:?}"),
            Ok(_) => panic!("the pipeline started"),
        }
    }

    /// A sink that panics when layer `at` begins: a stage's thread that dies halfway through a
    /// forward pass.
    struct PanicAtLayer {
        at: usize,
    }

    impl TraceSink for PanicAtLayer {
        fn name(&self) -> Cow<'_, str> {
            Cow::Borrowed("panics at a layer")
        }

        fn layer_begin(&mut self, begin: &LayerBegin) -> Result<(), SinkError> {
            assert_ne!(begin.layer, self.at, "the test's sink gives up");
            Ok(())
        }

        fn event(&mut self, _: &Event) -> Result<(), SinkError> {
            Ok(())
        }
    }

    #[test]
    fn a_stage_whose_thread_panics_stops_the_pipeline_with_an_error_not_a_hang() {
        let (model, tokenizer) = load_model();
        let prompt = tokenizer.encode(PROMPT).unwrap();
        let mut pipeline = Pipeline::spawn_traced(model, STAGES, |rank, stages| {
            Session::builder(ModelTracerConfig::lightweight())
                .rank(rank, stages)
                .sink(PanicAtLayer { at: 20 })
                .start()
        })
        .unwrap();
        let error = pipeline.forward(&prompt, 0).unwrap_err();
        match &error {
            PipelineError::Panicked {
                rank: 1,
                layers,
                message,
            } => {
                assert_eq!(*layers, 15..30);
                assert!(message.contains("the test's sink gives up"), "{message}");
            }
            other => panic!("another error: {other:?}"),
        }
        assert!(matches!(
            pipeline.forward(&prompt, 0),
            Err(PipelineError::Stopped)
        ));
        assert!(matches!(pipeline.finish(), Err(PipelineError::Stopped)));
    }
}

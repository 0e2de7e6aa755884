//! The annotated model on the real SmolLM2 weights, traced: what the records say must match what
//! the model computed. Missing weights fail the tests (never skip): run `scripts/fetch-models`.
//!
//! Forward passes are few (a debug build of this crate): one full session of `STEPS` passes is
//! shared by most tests.
#![cfg(feature = "trace")]

use candle_core::quantized::GgmlDType;
use model_trace::{
    ActivationAnomalyKind, Event, ModelTracer, ModelTracerConfig, QuantType, RecordError, Session,
    TraceFilter, TraceReader,
};
use smollm::generate::load;
use smollm::model::argmax;
use smollm::{GgufTokenizer, Model};
use std::sync::OnceLock;

const PROMPT: &str = "The capital of France is";
/// Forward passes of the shared run: the prompt, then single tokens.
const STEPS: usize = 4;

/// A session recording what `config` asks for; `MODEL_TRACE` and the other variables of the
/// caller's environment are not read.
fn session(config: ModelTracerConfig) -> Session {
    Session::with_trace_filter(config, TraceFilter::all())
}

fn model() -> (Model, GgufTokenizer) {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
}

/// Greedy decoding for `steps` forward passes: the generated ids and each pass's logits.
fn decode(model: &mut Model, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut generated = Vec::new();
    let mut all_logits = Vec::new();
    let mut logits = model.forward(prompt, 0).unwrap();
    for step in 0..steps {
        let next = argmax(&logits).unwrap();
        generated.push(next);
        all_logits.push(logits.to_vec1::<f32>().unwrap());
        if step + 1 < steps {
            logits = model.forward(&[next], prompt.len() + step).unwrap();
        }
    }
    (generated, all_logits)
}

struct FullRun {
    prompt_len: usize,
    generated: Vec<u32>,
    text: String,
    logits: Vec<Vec<f32>>,
    tracer: ModelTracer,
    errors: Vec<RecordError>,
    config: smollm::Config,
    /// Format of every quantized matmul, as the GGUF has it, in call order within a pass.
    matmul_formats: Vec<GgmlDType>,
    kv_capacity: usize,
    kv_bytes: usize,
    /// The trace file the session wrote besides keeping the records in memory.
    trace_file: std::path::PathBuf,
}

/// `STEPS` passes of greedy decoding inside a full session that also writes a trace file,
/// shared by the tests below.
fn full_run() -> &'static FullRun {
    static RUN: OnceLock<FullRun> = OnceLock::new();
    RUN.get_or_init(|| {
        let (mut model, tokenizer) = model();
        let prompt = tokenizer.encode(PROMPT).unwrap();
        let trace_file =
            std::env::temp_dir().join(format!("smollm-traced-{}.ndjson", std::process::id()));
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file(&trace_file)
            .in_memory(true)
            .start()
            .unwrap_or_else(|e| panic!("{e}"));
        let (generated, logits) = decode(&mut model, &prompt, STEPS);
        let (tracer, errors) = session.finish_with_errors();
        FullRun {
            prompt_len: prompt.len(),
            text: tokenizer.decode(&generated).unwrap(),
            generated,
            logits,
            tracer,
            errors,
            config: model.config().clone(),
            matmul_formats: model
                .quant_linears()
                .iter()
                .map(|l| l.ggml_dtype())
                .collect(),
            kv_capacity: model.caches()[0].capacity(),
            kv_bytes: model.caches().iter().map(|c| c.bytes()).sum(),
            trace_file,
        }
    })
}

/// Tokens processed by pass `pass` of the shared run.
fn tokens_in_pass(run: &FullRun, pass: usize) -> usize {
    if pass == 0 {
        run.prompt_len
    } else {
        1
    }
}

#[test]
fn full_session_answers_paris_without_record_errors() {
    let run = full_run();
    assert!(run.text.contains("Paris"), "continuation: {:?}", run.text);
    assert!(run.errors.is_empty(), "not recorded: {:?}", run.errors);
    let summary = run.tracer.summary();
    assert_eq!(summary.total_forwards, STEPS);
    assert_eq!(summary.layers_per_pass, 30);
}

#[test]
fn the_trace_file_reads_back_to_the_tracer_kept_in_memory() {
    let run = full_run();
    let mut reader = TraceReader::open(&run.trace_file).unwrap_or_else(|e| panic!("{e}"));
    let events: Vec<Event> = (&mut reader)
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let header = reader.header();
    assert_eq!(header.config, ModelTracerConfig::full());
    let replayed = ModelTracer::from_events(header.config.clone(), &events);
    let json = |t: &ModelTracer| serde_json::to_string(t).unwrap();
    assert!(
        json(&replayed) == json(&run.tracer),
        "the replayed tracer differs"
    );
    assert_eq!(replayed.summary(), run.tracer.summary());
    // Every tensor of a CPU run carries a digest; the final logits are those the model returned.
    let last_logits = events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Logits(logits) => Some(logits),
            _ => None,
        })
        .expect("logits events");
    let expected = model_trace::Fingerprint::of(run.logits.last().unwrap());
    assert_eq!(last_logits.logits.fingerprint, Some(expected));
    assert_eq!(
        last_logits.batch_rows[0].top_tokens[0],
        *run.generated.last().unwrap()
    );
}

#[test]
fn logits_are_bit_identical_with_and_without_a_session() {
    let run = full_run();
    let (mut model, tokenizer) = model();
    let prompt = tokenizer.encode(PROMPT).unwrap();
    assert!(!Session::is_active());
    let (generated, logits) = decode(&mut model, &prompt, STEPS);
    assert_eq!(generated, run.generated);
    for (step, (untraced, traced)) in logits.iter().zip(&run.logits).enumerate() {
        let untraced: Vec<u32> = untraced.iter().map(|v| v.to_bits()).collect();
        let traced: Vec<u32> = traced.iter().map(|v| v.to_bits()).collect();
        assert!(untraced == traced, "step {step}: logits differ");
    }
}

#[test]
fn every_pass_records_thirty_layers_with_every_stage() {
    let run = full_run();
    let width = run.config.hidden_size;
    let passes = run.tracer.activation_traces();
    assert_eq!(passes.len(), STEPS);
    for (p, pass) in passes.iter().enumerate() {
        let count = width * tokens_in_pass(run, p);
        assert_eq!(pass.layers.len(), run.config.num_layers, "pass {p}");
        for (i, layer) in pass.layers.iter().enumerate() {
            assert_eq!(layer.layer_idx, i);
            let names: Vec<&str> = layer.stages().map(|(name, _)| name).collect();
            assert_eq!(
                names,
                [
                    "input",
                    "attn_in",
                    "attn_out",
                    "resid_mid",
                    "mlp_in",
                    "mlp_out",
                    "output"
                ]
            );
            for (stage, stats) in layer.stages() {
                assert_eq!(stats.count, count, "pass {p} layer {i} {stage}");
                assert_eq!(stats.nan_count + stats.inf_count, 0);
                assert!(stats.std > 0.0, "pass {p} layer {i} {stage}: {stats:?}");
            }
        }
        // The output of one layer is the input of the next.
        for pair in pass.layers.windows(2) {
            assert_eq!(pair[0].output_stats, pair[1].input_stats);
        }
    }
}

#[test]
fn one_kv_cache_step_per_layer_and_generated_token() {
    let run = full_run();
    let c = &run.config;
    let kv = run.tracer.kv_trace();
    assert_eq!(kv.steps.len(), run.generated.len() * c.num_layers);
    for (i, step) in kv.steps.iter().enumerate() {
        let (pass, layer) = (i / c.num_layers, i % c.num_layers);
        assert_eq!((step.layer, step.step), (Some(layer), pass), "step {i}");
        assert_eq!(step.valid_positions, run.prompt_len + pass);
        assert_eq!(step.capacity, run.kv_capacity);
        assert_eq!(step.cache_size_bytes, run.kv_bytes / c.num_layers);
        assert_eq!(step.evictions_this_step, 0);
    }
    // The session's peak is the sum over the layers' caches: keys and values, f32, the whole
    // capacity, every layer.
    assert_eq!(kv.peak_memory_bytes, run.kv_bytes);
    assert_eq!(
        run.kv_bytes,
        c.num_layers * 2 * run.kv_capacity * c.num_kv_heads * c.head_dim * 4
    );
}

#[test]
fn every_quantized_matmul_reports_its_error() {
    let run = full_run();
    // Ground truth from the GGUF: seven Q4_1 matmuls per block and the tied Q8_0 head.
    let q4_1 = run
        .matmul_formats
        .iter()
        .filter(|f| **f == GgmlDType::Q4_1)
        .count();
    let q8_0 = run
        .matmul_formats
        .iter()
        .filter(|f| **f == GgmlDType::Q8_0)
        .count();
    assert_eq!((q4_1, q8_0), (210, 1));
    assert_eq!(run.matmul_formats.len(), 211);

    let passes = run.tracer.quant_traces();
    assert_eq!(passes.len(), STEPS);
    for (p, pass) in passes.iter().enumerate() {
        let expected_position = if p == 0 { 0 } else { run.prompt_len + p - 1 };
        assert_eq!(pass.position, Some(expected_position));
        assert_eq!(pass.traces.len(), 211, "pass {p}");
        let (blocks, head) = pass.traces.split_at(210);
        for (i, trace) in blocks.iter().enumerate() {
            assert_eq!(
                (trace.site.as_str(), trace.quant_type, trace.layer_idx),
                ("q4_1_matmul", QuantType::Q4_1, i / 7),
                "pass {p} call {i}"
            );
        }
        assert_eq!(head[0].site, "q8_0_matmul");
        assert_eq!(head[0].quant_type, QuantType::Q8_0);
        // outside any layer, like the final logits: one past the last block
        assert_eq!(head[0].layer_idx, 30);
        assert_eq!(head[0].num_elements, run.config.vocab_size);
        for trace in &pass.traces {
            assert_eq!(trace.non_finite, 0);
            assert!(
                trace.cosine_similarity > 0.99 && trace.cosine_similarity <= 1.0 + 1e-6,
                "pass {p}: {trace:?}"
            );
        }
    }
    let figures = smollm::report::quant_figures(&run.tracer);
    let sites: Vec<(&str, usize)> = figures.iter().map(|f| (f.site.as_str(), f.calls)).collect();
    assert_eq!(
        sites,
        [("q4_1_matmul", 210 * STEPS), ("q8_0_matmul", STEPS)]
    );
}

#[test]
fn attention_and_final_logits_are_recorded_per_pass() {
    let run = full_run();
    let c = &run.config;
    let rows: usize = (0..STEPS).map(|p| tokens_in_pass(run, p)).sum();
    assert_eq!(
        run.tracer.attention_traces().len(),
        c.num_layers * c.num_heads * rows
    );
    // The final head is the only logits tracepoint without the lens; its best token is the
    // token greedy decoding chose.
    let logit_traces = run.tracer.logit_traces();
    assert_eq!(logit_traces.len(), STEPS);
    for (trace, &chosen) in logit_traces.iter().zip(&run.generated) {
        let winner = &trace.tracked_tokens[0];
        assert_eq!(winner.token_id, chosen);
        assert_eq!(winner.layers, [c.num_layers]);
        assert_eq!(winner.final_rank(), Some(0));
    }
}

#[test]
fn logit_lens_ranks_the_chosen_token_first_by_the_last_layer() {
    let (mut model, tokenizer) = model();
    model.logit_lens = true;
    let prompt = tokenizer.encode(PROMPT).unwrap();
    let session = session(ModelTracerConfig {
        trace_logits: true,
        ..ModelTracerConfig::default()
    });
    let logits = model.forward(&prompt, 0).unwrap();
    let tracer = session.finish();
    let chosen = argmax(&logits).unwrap();
    assert_eq!(tokenizer.decode(&[chosen]).unwrap(), " Paris");

    let traces = tracer.logit_traces();
    assert_eq!(traces.len(), 1);
    let winner = &traces[0].tracked_tokens[0];
    assert_eq!(winner.token_id, chosen);
    // Layers 0..=29 from the lens, then the final head, recorded as layer 30.
    assert_eq!(winner.layers, (0..=30).collect::<Vec<_>>());
    assert_eq!(winner.ranks_by_layer[29], 0);
    assert_eq!(winner.ranks_by_layer[30], 0);
    // Early layers do not yet predict it.
    assert!(winner.ranks_by_layer[0] > 0, "{:?}", winner.ranks_by_layer);
}

#[test]
fn a_nan_in_layer_7_is_reported_at_layer_7_and_not_earlier() {
    const POISONED: usize = 7;
    let (mut model, tokenizer) = model();
    model.poison_layer(POISONED).unwrap();
    let prompt = tokenizer.encode(PROMPT).unwrap();
    let session = session(ModelTracerConfig::lightweight());
    decode(&mut model, &prompt, 2);
    let tracer = session.finish();

    let passes = tracer.activation_traces();
    assert_eq!(passes.len(), 2);
    for pass in passes {
        let position = pass.position;
        for layer in &pass.layers[..POISONED] {
            assert!(
                layer
                    .stages()
                    .all(|(_, s)| s.nan_count == 0 && s.inf_count == 0),
                "position {position}: layer {} is not clean",
                layer.layer_idx
            );
        }
        let tokens = pass.layers[POISONED].input_stats.count / model.config().hidden_size;
        // One NaN per row, in the first channel of the norm's output.
        let attn_in = pass.layers[POISONED].stage("attn_in").map(|s| s.nan_count);
        assert_eq!(attn_in, Some(tokens));
        assert!(pass.has_anomaly, "position {position}");
        assert_eq!(
            (pass.anomaly_layer, pass.anomaly_kind),
            (Some(POISONED), Some(ActivationAnomalyKind::Nan)),
            "position {position}: {:?}",
            pass.anomaly_desc
        );
    }
    assert_eq!(tracer.summary().anomalies_detected, 2);
}

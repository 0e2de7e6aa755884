//! The annotated MiniLM tells the truth about itself: inside a full model-trace session it
//! computes exactly what it computes untraced, each layer record holds the statistics of that
//! layer's real hidden state (checked against candle-transformers' BERT), the attention records
//! agree with the probabilities the model computed, and a NaN injected into one layer is
//! reported at that layer. Real weights; missing weights fail with the command that fetches them.
#![cfg(feature = "trace")]

mod common;

use candle_core::{Device, Tensor};
use common::{encode, fixture, ReferenceBert, SENTENCE, SENTENCE_EMBEDDING_START, TOLERANCE};
use minilm::report::{token_labels, StrongestKeys};
use minilm::Model;
use model_trace::{
    ActivationAnomalyKind, Event, LayerActivationTrace, ModelTracer, ModelTracerConfig, Session,
    TensorStats, TraceFilter, TraceReader, RESIDUAL_DOMINANCE_THRESHOLD,
};

const LAYERS: usize = 6;
const HEADS: usize = 12;
const TOKENS: usize = 7;

/// Runs `forward` in a session recording everything; `MODEL_TRACE` is not read, so the
/// environment cannot filter the records away.
fn traced<T>(forward: impl FnOnce() -> T) -> (T, ModelTracer) {
    let session = Session::with_trace_filter(ModelTracerConfig::full(), TraceFilter::all());
    let output = forward();
    let (tracer, errors) = session.finish_with_errors();
    assert!(
        errors.is_empty(),
        "tracepoints failed to record: {errors:?}"
    );
    (output, tracer)
}

fn values(tensor: &Tensor) -> Vec<f32> {
    tensor.flatten_all().unwrap().to_vec1().unwrap()
}

fn stats_of(tensor: &Tensor) -> TensorStats {
    TensorStats::from_slice(&values(tensor))
}

fn bits(tensor: &Tensor) -> Vec<u32> {
    values(tensor).into_iter().map(f32::to_bits).collect()
}

/// Largest relative difference over the fields, and which field it is. `std`, `l2_norm`, `min`
/// and `max` are compared relative to the reference value. `mean` is relative to
/// `max(|mean|, std)`: after LayerNorm the mean of a hidden state is a small difference of
/// large terms, so its own magnitude is no scale for float noise, while the spread is.
fn worst_field(recorded: &TensorStats, reference: &TensorStats) -> (f32, &'static str) {
    assert_eq!(recorded.count, reference.count);
    assert_eq!((recorded.nan_count, recorded.inf_count), (0, 0));
    let relative = |got: f32, want: f32, scale: f32| (got - want).abs() / scale.abs();
    [
        (
            relative(
                recorded.mean,
                reference.mean,
                reference.mean.abs().max(reference.std),
            ),
            "mean",
        ),
        (relative(recorded.std, reference.std, reference.std), "std"),
        (
            relative(recorded.l2_norm, reference.l2_norm, reference.l2_norm),
            "l2_norm",
        ),
        (relative(recorded.min, reference.min, reference.min), "min"),
        (relative(recorded.max, reference.max, reference.max), "max"),
    ]
    .into_iter()
    .fold(
        (0.0, "none"),
        |worst, field| {
            if field.0 > worst.0 {
                field
            } else {
                worst
            }
        },
    )
}

/// The sentence's embedding pass against its golden trace (`tests/golden/minilm-sentence.ndjson`):
/// every layer's stages and attention, bit-exact on the machine that blessed it. After a
/// change that moves the numbers on purpose: `MODEL_TRACE_BLESS=1 cargo test -p minilm
/// --features trace --test traced golden`.
#[test]
fn the_sentence_embedding_matches_its_golden_trace() {
    let fixture = fixture();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let embedding = model_trace::golden::check("tests/golden/minilm-sentence.ndjson", || {
        fixture.model.embed(&ids, &mask).unwrap()
    });
    let first: f32 = embedding.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0];
    assert!((first - SENTENCE_EMBEDDING_START[0]).abs() <= TOLERANCE);
}

#[test]
fn tracing_changes_nothing_and_the_embedding_still_matches() {
    let fixture = fixture();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let untraced = fixture.model.forward(&ids, &mask).unwrap();
    let (traced_hidden, tracer) = traced(|| fixture.model.forward(&ids, &mask).unwrap());
    assert_eq!(bits(&traced_hidden), bits(&untraced));
    // The session really recorded the pass, so "bit-identical" is not about an idle tracer.
    assert_eq!(tracer.activation_traces().len(), 1);
    assert_eq!(tracer.activation_traces()[0].layers.len(), LAYERS);

    let (embedding, _) = traced(|| fixture.model.embed(&ids, &mask).unwrap());
    let embedding: Vec<f32> = embedding.squeeze(0).unwrap().to_vec1().unwrap();
    for (dim, (got, want)) in embedding.iter().zip(SENTENCE_EMBEDDING_START).enumerate() {
        assert!(
            (got - want).abs() <= TOLERANCE,
            "dimension {dim}: {got} vs {want}"
        );
    }
}

#[test]
fn a_trace_file_reads_back_to_the_tracer_kept_in_memory() {
    let fixture = fixture();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let path = std::env::temp_dir().join(format!("minilm-traced-{}.ndjson", std::process::id()));
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(&path)
        .capture("layer:*")
        .in_memory(true)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let hidden = fixture.model.forward(&ids, &mask).unwrap();
    let (in_memory, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:?}");

    let mut reader = TraceReader::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let events: Vec<Event> = (&mut reader)
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let replayed = ModelTracer::from_events(reader.header().config.clone(), &events);
    let json = |t: &ModelTracer| serde_json::to_string(t).unwrap();
    assert!(
        json(&replayed) == json(&in_memory),
        "the replayed tracer differs"
    );

    // The last layer's output, captured in full, is the model's output bit for bit.
    let last = events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Layer(layer) if layer.layer == LAYERS - 1 => layer.stage("output"),
            _ => None,
        })
        .expect("the last layer's output");
    let reference = last.tensor.capture.as_ref().expect("captured");
    let (shape, captured) = model_trace::read_capture(&path, reference).unwrap();
    assert_eq!(shape, hidden.dims());
    let as_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(as_bits(&captured), bits(&hidden));
}

#[test]
fn layer_records_hold_the_statistics_of_each_layers_hidden_state() {
    let fixture = fixture();
    let reference = ReferenceBert::load(&fixture.files);
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let (_, tracer) = traced(|| fixture.model.forward(&ids, &mask).unwrap());

    assert_eq!(tracer.forward_passes(), 1);
    let pass = &tracer.activation_traces()[0];
    let indices: Vec<usize> = pass.layers.iter().map(|l| l.layer_idx).collect();
    assert_eq!(indices, (0..LAYERS).collect::<Vec<_>>());

    // Layer 0's input is the embeddings: the reference with no layers.
    let (error, field) = worst_field(
        &pass.layers[0].input_stats,
        &stats_of(&reference.hidden_after(0, &ids, &mask)),
    );
    eprintln!("embeddings (layer 0 input): worst relative error {error:.2e} ({field})");
    assert!(
        error <= TOLERANCE,
        "layer 0 input: {field} off by {error:e}"
    );
    for (k, layer) in pass.layers.iter().enumerate() {
        let expected = stats_of(&reference.hidden_after(k + 1, &ids, &mask));
        let (error, field) = worst_field(&layer.output_stats, &expected);
        eprintln!("layer {k} output: worst relative error {error:.2e} ({field})");
        assert!(
            error <= TOLERANCE,
            "layer {k} output: {field} off by {error:e}\nrecorded  {:?}\nreference {expected:?}",
            layer.output_stats
        );
        let names: Vec<&str> = layer.stages().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            ["input", "attn_out", "resid_mid", "mlp_out", "output"]
        );
        assert_eq!(
            layer.stage("resid_mid").map(|s| s.count),
            Some(TOKENS * 384)
        );
        if k > 0 {
            assert_eq!(layer.input_stats, pass.layers[k - 1].output_stats);
        }
    }
}

/// Residual dominance ("the layer barely changed its input") is judged from the recorded input
/// and output statistics, an upper bound of the exact ratio. A post-LN layer's input and output
/// are both LayerNorm outputs with nearly the same spread, so the bound sits near 1 whatever the
/// layer does; the exact ratio, computed here from the real tensors, says how much it did.
#[test]
fn healthy_model_reports_no_anomaly() {
    let fixture = fixture();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let (_, tracer) = traced(|| fixture.model.forward(&ids, &mask).unwrap());
    let pass = &tracer.activation_traces()[0];

    let bias = Model::attention_bias(&mask).unwrap();
    let mut hidden = fixture.model.embeddings().forward(&ids).unwrap();
    let mut ratios = Vec::new();
    for (layer, record) in fixture.model.layers().iter().zip(&pass.layers) {
        let output = layer.forward(&hidden, &bias).unwrap();
        let exact = LayerActivationTrace::residual_ratio_of(&values(&hidden), &values(&output));
        eprintln!(
            "layer {}: residual ratio exact {exact:.4}, recorded (statistics bound) {:.4}",
            record.layer_idx, record.residual_ratio
        );
        ratios.push((record.layer_idx, exact, record.residual_ratio));
        hidden = output;
    }
    assert!(
        ratios
            .iter()
            .all(|&(_, exact, _)| exact < RESIDUAL_DOMINANCE_THRESHOLD),
        "a layer really is residual-dominated: {ratios:?}"
    );
    assert!(
        !pass.has_anomaly,
        "healthy model flagged: {:?}; (layer, exact ratio, recorded ratio): {ratios:?}",
        pass.anomaly_desc
    );
}

#[test]
fn attention_records_cover_every_row_and_agree_with_the_probabilities() {
    let fixture = fixture();
    let encoded = encode(&fixture, SENTENCE);
    let (ids, mask) = encoded.to_tensors(&Device::Cpu).unwrap();
    let ((_, captured), tracer) =
        traced(|| fixture.model.forward_with_attention(&ids, &mask).unwrap());

    let traces = tracer.attention_traces();
    assert_eq!(traces.len(), LAYERS * HEADS * TOKENS);
    let mut seen = vec![false; LAYERS * HEADS * TOKENS];
    for trace in traces {
        let row = (trace.layer_idx * HEADS + trace.head_idx) * TOKENS + trace.query_pos;
        assert!(!seen[row], "row recorded twice: {trace:?}");
        seen[row] = true;
        assert_eq!(trace.num_keys, TOKENS);
        assert!(
            trace.top_k_weights.windows(2).all(|w| w[0] >= w[1]),
            "top-k not descending: {trace:?}"
        );
        let probs: Vec<f32> = captured[trace.layer_idx]
            .get(0)
            .and_then(|p| p.get(trace.head_idx))
            .and_then(|p| p.get(trace.query_pos))
            .and_then(|p| p.to_vec1())
            .unwrap();
        let argmax: usize = captured[trace.layer_idx]
            .get(0)
            .and_then(|p| p.get(trace.head_idx))
            .and_then(|p| p.get(trace.query_pos))
            .and_then(|p| p.argmax(0))
            .and_then(|p| p.to_scalar::<u32>())
            .unwrap() as usize;
        assert_eq!(trace.top_k_positions.first(), Some(&argmax), "{trace:?}");
        assert_eq!(trace.top_k_weights[0], probs[argmax]);
    }

    // The CLI prints its lines from the records when they are complete: the same lines.
    let labels = token_labels(&encoded.tokens);
    let from_records = StrongestKeys::from_traces(traces, LAYERS, HEADS, TOKENS)
        .expect("every row has a kept key");
    let from_probabilities = StrongestKeys::from_probabilities(&captured).unwrap();
    assert_eq!(
        from_records.lines(&labels),
        from_probabilities.lines(&labels)
    );
}

#[test]
fn nan_in_one_layer_is_reported_at_that_layer_and_not_earlier() {
    let mut fixture = fixture();
    fixture.model.poison_layer(3).unwrap();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let (hidden, tracer) = traced(|| fixture.model.forward(&ids, &mask).unwrap());
    assert!(
        values(&hidden).iter().all(|v| v.is_nan()),
        "the poison did not reach the output"
    );

    let pass = &tracer.activation_traces()[0];
    assert_eq!(pass.layers.len(), LAYERS);
    for layer in &pass.layers[..3] {
        assert!(
            layer.stages().all(|(_, stats)| stats.nan_count == 0),
            "NaN before layer 3: {layer:?}"
        );
    }
    assert!(pass.layers[3]
        .stage("attn_out")
        .is_some_and(|s| s.nan_count > 0));
    assert_eq!(
        pass.anomaly_layer,
        Some(3),
        "anomaly: {:?}",
        pass.anomaly_desc
    );
    assert_eq!(pass.anomaly_kind, Some(ActivationAnomalyKind::Nan));
    let description = pass.anomaly_desc.as_deref().unwrap_or_default();
    assert!(
        description.starts_with("layer 3 attn_out: NaN"),
        "{description}"
    );
    // Every later layer is poisoned too; the report still names the first.
    for layer in &pass.layers[3..] {
        assert!(layer.output_stats.nan_count > 0, "{layer:?}");
    }
    assert!(tracer.summary().anomalies_detected >= 1);
}

#[test]
fn poisoning_a_layer_the_model_does_not_have_is_an_error() {
    let mut fixture = fixture();
    assert!(fixture.model.poison_layer(LAYERS).is_err());
}

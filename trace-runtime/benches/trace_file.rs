//! Writing and reading trace files: events shaped like a SmolLM2 decode step traced in full
//! without quantization (30 layers of 7 stages over 576 values with digests, 30 attention
//! events of 9 rows), encoded by `TraceFileSink` and read back by `TraceReader`.
//!
//! `cargo bench -p trace-runtime --bench trace_file -- --warm-up-time 1 --measurement-time 3`
//! prints time per pass and throughput in bytes per second of trace file.

use std::borrow::Cow;
use std::hint::black_box;
use std::io::Cursor;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use trace_runtime::{
    AttentionEvent, AttentionWeightTrace, Event, LayerEvent, PassBegin, PassEnd, StageEvent,
    TensorSummary, TraceFileSink, TraceHeader, TraceReader, TraceSink,
};

const LAYERS: usize = 30;
const WIDTH: usize = 576;
const STAGES: [&str; 7] = [
    "input",
    "attn_in",
    "attn_out",
    "resid_mid",
    "mlp_in",
    "mlp_out",
    "output",
];

/// One decode step's events.
fn decode_step(pass: usize) -> Vec<Event> {
    let mut seq = (pass * 1000) as u64;
    let mut next = || {
        seq += 1;
        seq
    };
    let mut events = vec![Event::PassBegin(PassBegin {
        seq: next(),
        pass,
        position: pass,
        tracepoint: Cow::Borrowed("forward"),
        function: Cow::Borrowed("smollm::model::forward"),
        start_ns: 1_000,
        tokens: None,
    })];
    for layer in 0..LAYERS {
        let layer_seq = next();
        let stages = STAGES
            .iter()
            .enumerate()
            .map(|(s, name)| {
                let values: Vec<f32> = (0..WIDTH)
                    .map(|i| ((i * 31 + s * 7 + layer) as f32 * 0.013).sin())
                    .collect();
                StageEvent {
                    seq: next(),
                    name: Cow::Borrowed(name),
                    tensor: TensorSummary::of_values(vec![1, 1, WIDTH], "f32", &values),
                }
            })
            .collect();
        let probs: Vec<f32> = (0..=pass).map(|k| 1.0 / (k + 1) as f32).collect();
        events.push(Event::Attention(AttentionEvent {
            seq: next(),
            pass: Some(pass),
            layer,
            tracepoint: Cow::Borrowed("attention_probs"),
            function: Cow::Borrowed("smollm::model::attention_probs"),
            probs: TensorSummary::of_values(vec![1, 9, 1, probs.len()], "f32", &probs),
            rows: (0..9)
                .map(|head| AttentionWeightTrace::from_weights(layer, head, pass, &probs, 10))
                .collect(),
        }));
        events.push(Event::Layer(LayerEvent {
            seq: layer_seq,
            pass,
            layer,
            tracepoint: Cow::Borrowed("forward"),
            function: Cow::Borrowed("smollm::model::forward"),
            start_ns: 2_000,
            duration_ns: 3_000_000,
            stages,
            residual_ratio: None,
        }));
    }
    events.push(Event::PassEnd(PassEnd {
        seq: next(),
        pass,
        position: pass,
        duration_ns: 90_000_000,
        layers: LAYERS,
        anomalies: Vec::new(),
        logit_evolution: Vec::new(),
    }));
    events
}

fn header() -> TraceHeader {
    serde_json::from_str(&format!(
        r#"{{"format":"model-trace","schema":{},"writer":"bench","session":1,"process_id":1,
        "thread":{{"id":1,"name":null}},"clock":{{"epoch_unix_ns":0,"session_start_ns":0}},
        "config":{{}},"filter":"","capture":"","tracepoints":[],"metadata":{{}}}}"#,
        trace_runtime::SCHEMA_VERSION
    ))
    .expect("a valid header")
}

fn trace_file(c: &mut Criterion) {
    let passes: Vec<Vec<Event>> = (0..16).map(decode_step).collect();
    let path = std::env::temp_dir().join(format!("trace-file-bench-{}.ndjson", std::process::id()));
    let write_all = || {
        let mut sink = TraceFileSink::create(&path).expect("temp file");
        sink.start(&header()).expect("header");
        for events in &passes {
            for event in events {
                sink.event(event).expect("write");
            }
        }
        sink.finish().expect("flush");
    };
    write_all();
    let bytes = std::fs::read(&path).expect("written");
    let per_pass = bytes.len() as u64 / passes.len() as u64;
    eprintln!(
        "trace of {} passes: {} bytes, {per_pass} bytes per decode step",
        passes.len(),
        bytes.len()
    );

    let mut group = c.benchmark_group("trace_file");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("write_16_decode_steps", |b| b.iter(write_all));
    group.bench_function("read_16_decode_steps", |b| {
        b.iter(|| {
            let reader = TraceReader::new(Cursor::new(black_box(&bytes))).expect("header");
            reader.filter(|e| e.is_ok()).count()
        })
    });
    group.finish();
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, trace_file);
criterion_main!(benches);

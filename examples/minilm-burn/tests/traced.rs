//! The annotated burn MiniLM tells the truth about itself: inside a full model-trace session it
//! computes exactly what it computes untraced; its records hold its token ids, every layer's
//! stages and attention, with the statistics of the candle port's records; and interventions
//! change the tensors it takes and returns by value. Both backends; real weights.
#![cfg(feature = "trace")]

mod common;

use burn_tensor::{Tensor, TensorData};
use common::{burn_values, candle_port, fixture, SENTENCE_IDS};
use minilm_burn::Backend;
use model_trace::{
    trace_layer, trace_model, Action, Event, ModelTracer, ModelTracerConfig, RecordErrorKind,
    Session, TensorStats, TraceFilter, TraceReader,
};

const LAYERS: usize = 6;
const HEADS: usize = 12;
const TOKENS: usize = 7;

/// Runs `forward` in a session recording everything (the environment's `MODEL_TRACE` unread).
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

fn bits(values: Vec<f32>) -> Vec<u32> {
    values.into_iter().map(f32::to_bits).collect()
}

/// The largest difference of mean, std, min and max, relative to the reference's spread.
fn stats_error(ours: &TensorStats, reference: &TensorStats) -> f32 {
    assert_eq!(ours.count, reference.count);
    let scale = reference
        .std
        .max(reference.max.abs())
        .max(reference.min.abs());
    [
        ours.mean - reference.mean,
        ours.std - reference.std,
        ours.min - reference.min,
        ours.max - reference.max,
    ]
    .into_iter()
    .fold(0f32, |worst, d| worst.max(d.abs() / scale))
}

#[test]
fn tracing_changes_nothing_and_records_every_layer_and_head() {
    for backend in Backend::ALL {
        let fixture = fixture(backend);
        let (ids, mask) = fixture.tensors();
        let untraced = burn_values(fixture.model.forward(ids.clone(), mask.clone()));
        let (hidden, tracer) = traced(|| fixture.model.forward(ids, mask));
        assert_eq!(bits(burn_values(hidden)), bits(untraced), "{backend:?}");

        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), 1);
        let indices: Vec<usize> = passes[0].layers.iter().map(|l| l.layer_idx).collect();
        assert_eq!(indices, (0..LAYERS).collect::<Vec<_>>());
        for layer in &passes[0].layers {
            let names: Vec<&str> = layer.stages().map(|(name, _)| name).collect();
            assert_eq!(
                names,
                ["input", "attn_out", "resid_mid", "mlp_out", "output"]
            );
            assert_eq!(layer.output_stats.count, TOKENS * 384);
        }
        let rows = tracer.attention_traces();
        assert_eq!(
            rows.len(),
            LAYERS * HEADS * TOKENS,
            "{backend:?}: a row per query"
        );
        let heads: std::collections::BTreeSet<(usize, usize)> =
            rows.iter().map(|r| (r.layer_idx, r.head_idx)).collect();
        assert_eq!(heads.len(), LAYERS * HEADS);
    }
}

#[test]
fn the_records_are_the_candle_ports_within_float_noise() {
    let (candle, candle_ids, candle_mask) = candle_port();
    let (_, reference) = traced(|| candle.forward(&candle_ids, &candle_mask).unwrap());
    let reference = &reference.activation_traces()[0].layers;
    for backend in Backend::ALL {
        let fixture = fixture(backend);
        let (ids, mask) = fixture.tensors();
        let (_, tracer) = traced(|| fixture.model.forward(ids, mask));
        let ours = &tracer.activation_traces()[0].layers;
        let mut worst = 0f32;
        for (layer, want) in ours.iter().zip(reference) {
            for ((name, got), (want_name, want)) in layer.stages().zip(want.stages()) {
                assert_eq!(name, want_name);
                let error = stats_error(got, want);
                assert!(
                    error <= 1e-5,
                    "{backend:?}: layer {} {name} off by {error:e}\n{got:?}\n{want:?}",
                    layer.layer_idx
                );
                worst = worst.max(error);
            }
        }
        eprintln!("{backend:?}: worst statistic off by {worst:.2e} of the candle port's");
    }
}

#[test]
fn the_trace_file_holds_the_token_ids_the_pass_consumed() {
    let fixture = fixture(Backend::NdArray);
    let (ids, mask) = fixture.tensors();
    let events = events_of(Session::builder(ModelTracerConfig::lightweight()), || {
        fixture.model.forward(ids, mask);
    });
    let tokens: Vec<Option<Vec<u32>>> = events
        .into_iter()
        .filter_map(|event| match event {
            Event::PassBegin(begin) => Some(begin.tokens),
            Event::Error(error) => panic!("not recorded: {error:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, [Some(SENTENCE_IDS.to_vec())]);
}

/// Interventions on a model whose layers take and return their tensors by value: the layer's
/// output replaced (what the next layer receives), its input scaled (what it records).
#[test]
fn interventions_change_what_a_layer_takes_and_returns_by_value() {
    for backend in Backend::ALL {
        let fixture = fixture(backend);
        let (ids, mask) = fixture.tensors();
        let session = Session::builder(ModelTracerConfig::lightweight())
            .intervene("layer=1", Action::Zero)
            .intervene("stage=input,layer=3", Action::Scale(2.0))
            .start()
            .unwrap();
        let hidden = fixture.model.forward(ids.clone(), mask.clone());
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{backend:?}: {errors:?}");
        let layers = &tracer.activation_traces()[0].layers;
        assert_eq!(layers[1].output_stats.max, 0.0);
        assert_eq!(layers[1].output_stats.min, 0.0);
        assert_eq!(layers[2].input_stats.max, 0.0, "layer 2 received the zeros");
        let doubled = 2.0 * layers[2].output_stats.max;
        assert_eq!(layers[3].input_stats.max, doubled, "{backend:?}");
        let clean = burn_values(fixture.model.forward(ids, mask));
        assert_ne!(bits(burn_values(hidden)), bits(clean));
    }
}

/// The events of a session over `run`, read back from its trace file.
fn events_of(builder: model_trace::SessionBuilder, run: impl FnOnce()) -> Vec<Event> {
    let path = std::env::temp_dir().join(format!(
        "minilm-burn-events-{}-{:?}.ndjson",
        std::process::id(),
        std::thread::current().id()
    ));
    let session = builder
        .trace_file(&path)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    run();
    drop(session);
    let events = TraceReader::open(&path)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|event| event.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    std::fs::remove_file(&path).ok();
    events
}

/// `position=99` on a pass of 7 tokens reaches no row: nothing changes, and the session says so
/// at its end instead of passing over it.
#[test]
fn an_intervention_past_the_passs_tokens_is_a_warning() {
    let fixture = fixture(Backend::Flex);
    let (ids, mask) = fixture.tensors();
    let clean = burn_values(fixture.model.forward(ids.clone(), mask.clone()));
    let mut hidden = Vec::new();
    let builder = Session::builder(ModelTracerConfig::lightweight())
        .intervene("layer=1,position=99", Action::Zero);
    let events = events_of(builder, || {
        hidden = burn_values(fixture.model.forward(ids, mask));
    });
    assert_eq!(bits(hidden), bits(clean), "nothing changed");
    let warning = events.iter().find_map(|event| match event {
        Event::Error(error) if error.kind == RecordErrorKind::UnusedIntervention => {
            Some(error.message.clone())
        }
        _ => None,
    });
    let warning = warning.expect("a warning that the intervention changed nothing");
    assert!(warning.contains("position=99"), "{warning}");
}

/// What a block does, for a block generic over it: burn blocks were generic over their backend
/// before burn 0.22 (`impl<B: Backend> Block<B>`), and blocks are still generic over their parts.
trait Mix {
    fn mix(&self, x: Tensor<3>) -> Tensor<3>;
}

struct Scale(f32);

impl Mix for Scale {
    fn mix(&self, x: Tensor<3>) -> Tensor<3> {
        x.mul_scalar(self.0)
    }
}

struct Block<M> {
    index: usize,
    mix: M,
}

impl<M: Mix> Block<M> {
    #[trace_layer(index = self.index)]
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.mix.mix(x)
    }
}

#[trace_model]
fn generic_blocks<M: Mix>(blocks: &[Block<M>], x: Tensor<3>) -> Tensor<3> {
    blocks.iter().fold(x, |x, block| block.forward(x))
}

#[test]
fn methods_of_a_generic_impl_block_are_traced_and_changed_like_any() {
    let device = Backend::Flex.device();
    let blocks = [
        Block {
            index: 0,
            mix: Scale(2.0),
        },
        Block {
            index: 1,
            mix: Scale(3.0),
        },
    ];
    let x = Tensor::<3>::from_data(
        TensorData::new(vec![1.0f32, -1.0, 0.5, 2.0], [1, 2, 2]),
        &device,
    );
    let session = Session::builder(ModelTracerConfig::lightweight())
        .intervene("stage=input,layer=1", Action::Scale(0.5))
        .start()
        .unwrap();
    let out = burn_values(generic_blocks(&blocks, x));
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(out, [3.0, -3.0, 1.5, 6.0], "x 2, halved, x 3");
    let layers = &tracer.activation_traces()[0].layers;
    assert_eq!(layers.len(), 2);
    assert_eq!(
        (layers[0].input_stats.max, layers[0].output_stats.max),
        (2.0, 4.0)
    );
    assert_eq!(
        (layers[1].input_stats.max, layers[1].output_stats.max),
        (2.0, 6.0)
    );
}

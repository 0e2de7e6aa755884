//! Interventions on the user's own code: a tracepoint changes the tensor it sees before the
//! program goes on with it. Each test checks what an intervention claims: it changes what it
//! selects and what depends on it, nothing before it, and the trace says it happened.
#![cfg(feature = "enabled")]

use model_trace::{
    trace_layer, trace_model, trace_stage, Action, Event, Intervention, ModelTracerConfig,
    RecordErrorKind, Session, TraceReader,
};

const WIDTH: usize = 4;

struct Block {
    gain: f32,
}

impl Block {
    /// `x + attn(x)`, where the attention stage can be changed.
    #[trace_layer]
    fn forward(&self, x: &Vec<f32>) -> Vec<f32> {
        let attn: Vec<f32> = x.iter().map(|v| v * self.gain + 1.0).collect();
        let attn = trace_stage!("attn_out", attn);
        x.iter().zip(&attn).map(|(a, b)| a + b).collect()
    }
}

struct Model {
    blocks: Vec<Block>,
}

impl Model {
    fn new(layers: usize) -> Self {
        Model {
            blocks: (0..layers)
                .map(|i| Block {
                    gain: 0.5 + i as f32 * 0.25,
                })
                .collect(),
        }
    }

    #[trace_model]
    fn forward(&self, x: Vec<f32>) -> Vec<f32> {
        self.blocks.iter().fold(x, |h, block| block.forward(&h))
    }
}

/// A layer taking its input by value, and one whose output borrows the input.
#[trace_layer(index = 9)]
fn owned_layer(x: Vec<f32>) -> Vec<f32> {
    x.iter().map(|v| v + 1.0).collect()
}

#[trace_layer(index = 10)]
fn borrowing_layer(x: &Vec<f32>) -> &Vec<f32> {
    x
}

fn input() -> Vec<f32> {
    (0..WIDTH).map(|i| i as f32 - 1.5).collect()
}

/// Runs the model once under `interventions`; its output and the session's tracer.
fn run(interventions: &[(&str, Action)]) -> (Vec<f32>, model_trace::ModelTracer) {
    let mut builder = Session::builder(ModelTracerConfig::full());
    for (selector, action) in interventions {
        builder = builder.intervene(selector, action.clone());
    }
    let session = builder.start().expect("session");
    let out = Model::new(3).forward(input());
    (out, session.finish())
}

/// The layers' (input, attn_out, output) means, in order.
fn layer_means(tracer: &model_trace::ModelTracer) -> Vec<[f32; 3]> {
    tracer.activation_traces()[0]
        .layers
        .iter()
        .map(|layer| {
            let stage = |name: &str| layer.stage(name).map_or(f32::NAN, |s| s.mean);
            [stage("input"), stage("attn_out"), stage("output")]
        })
        .collect()
}

#[test]
fn zeroing_a_stage_changes_only_what_depends_on_it() {
    let (clean_out, clean) = run(&[]);
    let (out, ablated) = run(&[("stage=attn_out,layer=1", Action::Zero)]);
    let (clean, ablated) = (layer_means(&clean), layer_means(&ablated));
    assert_eq!(clean[0], ablated[0], "layer 0 runs before the change");
    assert_eq!(clean[1][0], ablated[1][0], "layer 1 receives what it did");
    assert_eq!(ablated[1][1], 0.0, "its attention is zero");
    assert_eq!(ablated[1][2], ablated[1][0], "so its output is its input");
    assert_ne!(clean[2], ablated[2], "layer 2 depends on it");
    assert_ne!(clean_out, out);
}

#[test]
fn a_layer_records_what_it_received_and_returned() {
    let (_, tracer) = run(&[
        ("stage=input,layer=2", Action::Scale(2.0)),
        ("layer=0", Action::Zero),
    ]);
    let means = layer_means(&tracer);
    assert_eq!(
        means[0][2], 0.0,
        "layer 0's output, zeroed, is recorded as zero"
    );
    assert_eq!(means[1][0], 0.0, "and is what layer 1 received");
    assert_eq!(
        means[2][0],
        2.0 * means[1][2],
        "layer 2 records the doubled input it received"
    );
}

#[test]
fn adding_a_vector_at_a_layer_leaves_the_layers_before_it_bit_identical() {
    let record = |tracer: &model_trace::ModelTracer| -> Vec<Vec<u64>> {
        tracer.activation_traces()[0]
            .layers
            .iter()
            .map(|layer| {
                layer
                    .stages
                    .iter()
                    .map(|(_, s)| s.mean.to_bits() as u64 ^ (s.std.to_bits() as u64) << 32)
                    .collect()
            })
            .collect()
    };
    let (_, clean) = run(&[]);
    let steer = Action::parse("add(1 0 0 -1)").unwrap();
    let (_, steered) = run(&[("layer=2,stage=input", steer)]);
    let (clean, steered) = (record(&clean), record(&steered));
    assert_eq!(clean[..2], steered[..2]);
    assert_ne!(clean[2], steered[2]);
}

#[test]
fn positions_on_a_value_without_rows_are_an_error() {
    let session = Session::builder(ModelTracerConfig::full())
        .intervene("layer=9,stage=input,position=1", Action::Zero)
        .start()
        .unwrap();
    // Two rows of two: [seq 2, hidden 2] seen as rows by `position=`? A Vec is flat: it has
    // no token dimension, which is an error of the tracepoint, not a silent no-op.
    let out = owned_layer(vec![1.0, 2.0, 3.0, 4.0]);
    let (_, errors) = session.finish_with_errors();
    assert_eq!(out, [2.0, 3.0, 4.0, 5.0], "nothing changed");
    assert!(
        errors
            .iter()
            .any(|e| e.kind == RecordErrorKind::Intervention && e.message.contains("position=")),
        "{errors:?}"
    );
}

#[test]
fn an_owned_input_and_a_closure() {
    let session = Session::builder(ModelTracerConfig::full())
        .intervene(
            "layer=9,stage=input",
            Action::closure(|values, site| {
                assert_eq!(site.stage, "input");
                assert_eq!(site.layer, Some(9));
                values.reverse();
            }),
        )
        .start()
        .unwrap();
    let out = owned_layer(vec![1.0, 2.0, 3.0]);
    let tracer = session.finish();
    assert_eq!(out, [4.0, 3.0, 2.0]);
    let layer = &tracer.activation_traces()[0].layers[0];
    assert_eq!(layer.stage("input").map(|s| s.max), Some(3.0));
}

#[test]
fn what_cannot_be_changed_is_an_error_and_what_changes_nothing_a_warning() {
    let session = Session::builder(ModelTracerConfig::full())
        .intervene("layer=10", Action::Zero)
        .intervene("layer=99", Action::Zero)
        .start()
        .unwrap();
    let x = vec![1.0, 2.0];
    assert_eq!(borrowing_layer(&x), &[1.0, 2.0]);
    let unused = |session: &Session| {
        session
            .warnings()
            .into_iter()
            .filter(|w| w.kind == RecordErrorKind::UnusedIntervention)
            .map(|w| w.message)
            .collect::<Vec<_>>()
    };
    assert!(unused(&session).is_empty(), "said at the end only");
    let (_, errors) = session.finish_with_errors();
    let borrowed = errors
        .iter()
        .find(|e| e.kind == RecordErrorKind::Intervention)
        .expect("the borrowed output is an error");
    assert!(
        borrowed.message.contains("borrowed"),
        "{}",
        borrowed.message
    );
}

#[test]
fn the_trace_file_says_what_was_changed() {
    let dir = std::env::temp_dir().join(format!("interventions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("patched.ndjson");
    let patch =
        Intervention::parse_list("stage=attn_out,layer=1 scale(0.5); layer=7 zero").unwrap();
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(&path)
        .interventions(patch)
        .start()
        .unwrap();
    Model::new(3).forward(input());
    drop(session);
    let mut reader = TraceReader::open(&path).unwrap();
    assert_eq!(
        reader.header().interventions,
        ["stage=attn_out,layer=1 scale(0.5)", "layer=7 zero"]
    );
    let events: Vec<Event> = reader.by_ref().map(Result::unwrap).collect();
    let changes: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Intervention(i) => Some(i),
            _ => None,
        })
        .collect();
    assert_eq!(changes.len(), 1);
    let change = changes[0];
    assert_eq!((change.pass, change.layer), (Some(0), Some(1)));
    assert_eq!(change.stage, "attn_out");
    assert_eq!(change.intervention, "stage=attn_out,layer=1 scale(0.5)");
    assert!((change.delta_l2 - change.before_l2 / 2.0).abs() < 1e-5);
    let unused = events.iter().any(|e| match e {
        Event::Error(error) => {
            error.kind == RecordErrorKind::UnusedIntervention && error.message.contains("layer=7")
        }
        _ => false,
    });
    assert!(unused, "the intervention that changed nothing is a warning");
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs `model` with captures of every layer into `path`, then under `builder`'s changes; the
/// outputs and the second run's layer means.
fn capture_then(
    dir: &std::path::Path,
    reference: &Model,
    port: &Model,
    change: impl FnOnce(model_trace::SessionBuilder, &std::path::Path) -> model_trace::SessionBuilder,
) -> (Vec<f32>, Vec<f32>, model_trace::ModelTracer) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("reference.ndjson");
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(&path)
        .capture("layer:*")
        .start()
        .unwrap();
    let reference_out = reference.forward(input());
    drop(session);
    let builder = change(
        Session::builder(ModelTracerConfig::full()).in_memory(true),
        &path,
    );
    let session = builder.start().unwrap();
    let port_out = port.forward(input());
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:?}");
    (reference_out, port_out, tracer)
}

#[test]
fn patching_a_run_with_its_own_captures_reproduces_it_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("self-patch-{}", std::process::id()));
    let (_, clean) = run(&[]);
    let (reference_out, out, patched) =
        capture_then(&dir, &Model::new(3), &Model::new(3), |b, p| {
            b.intervene("layer=0..", Action::replace(p).unwrap())
                .isolate(p)
        });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&reference_out));
    assert_eq!(layer_means(&patched), layer_means(&clean));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn isolation_confines_a_bug_to_its_layer() {
    let dir = std::env::temp_dir().join(format!("isolate-{}", std::process::id()));
    let clean = Model::new(3);
    let mut buggy = Model::new(3);
    buggy.blocks[1].gain *= 1.5;
    // Without isolation the bug at layer 1 reaches layer 2's output.
    let (_, plain) = {
        let session = Session::builder(ModelTracerConfig::full()).start().unwrap();
        let out = buggy.forward(input());
        (out, session.finish())
    };
    let (_, reference) = run(&[]);
    let (plain, reference) = (layer_means(&plain), layer_means(&reference));
    assert_ne!(plain[2][2], reference[2][2]);
    // With it, layer 2 gets the reference's input and computes the reference's output.
    let (_, _, isolated) = capture_then(&dir, &clean, &buggy, |b, p| b.isolate(p));
    let isolated = layer_means(&isolated);
    assert_eq!(isolated[0], reference[0]);
    assert_eq!(isolated[1][0], reference[1][0]);
    assert_ne!(isolated[1][2], reference[1][2], "layer 1 is wrong itself");
    assert_eq!(isolated[2], reference[2], "layer 2 only inherited it");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn isolating_on_a_trace_without_captures_is_an_error_saying_how_to_make_one() {
    let dir = std::env::temp_dir().join(format!("no-captures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plain.ndjson");
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(&path)
        .start()
        .unwrap();
    Model::new(1).forward(input());
    drop(session);
    let error = Session::builder(ModelTracerConfig::full())
        .isolate(&path)
        .start()
        .unwrap_err();
    let message = error.to_string();
    assert!(message.contains("MODEL_TRACE_CAPTURE=layer:*"), "{message}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_steering_vector_from_a_file_is_the_same_as_written_inline() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = std::env::temp_dir().join(format!("steer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("steer.safetensors");
    let vector = [1.0f32, 0.0, 0.0, -1.0];
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![WIDTH], &bytes).unwrap();
    safetensors::serialize_to_file([("honesty", view)], None, &path).unwrap();

    let from_file = Action::parse(&format!("add({}:honesty)", path.display())).unwrap();
    let only_tensor = Action::parse(&format!("add({})", path.display())).unwrap();
    assert_eq!(
        from_file.to_string(),
        format!("add({}:honesty)", path.display())
    );
    let inline = Action::parse("add(1 0 0 -1)").unwrap();
    let (by_file, _) = run(&[("layer=2,stage=input", from_file)]);
    let (by_only, _) = run(&[("layer=2,stage=input", only_tensor)]);
    let (by_text, _) = run(&[("layer=2,stage=input", inline)]);
    assert_eq!(by_file, by_text);
    assert_eq!(by_only, by_text);
    let missing = Action::parse(&format!("add({}:nope)", path.display())).unwrap_err();
    assert!(missing.contains("no tensor named"), "{missing}");
    std::fs::remove_dir_all(&dir).ok();
}

struct Biased {
    bias: Vec<f32>,
}

impl Biased {
    /// The input is a field: it cannot be changed.
    #[trace_layer(index = 20, input = &self.bias)]
    fn forward(&self) -> Vec<f32> {
        self.bias.clone()
    }
}

/// A generic input: which type it is, the expansion cannot know.
#[trace_layer(index = 21)]
fn generic_layer<T: Clone>(x: &T) -> T {
    x.clone()
}

#[test]
fn an_input_that_cannot_be_changed_is_an_error_at_its_first_call() {
    let session = Session::builder(ModelTracerConfig::full())
        .intervene("stage=input,layer=20..=21", Action::Zero)
        .start()
        .unwrap();
    let biased = Biased {
        bias: vec![1.0, 2.0],
    };
    assert_eq!(biased.forward(), [1.0, 2.0]);
    assert_eq!(biased.forward(), [1.0, 2.0]);
    assert_eq!(generic_layer(&vec![3.0_f32]), [3.0]);
    let (_, errors) = session.finish_with_errors();
    let cannot: Vec<_> = errors
        .iter()
        .filter(|e| e.kind == RecordErrorKind::Intervention)
        .collect();
    assert_eq!(cannot.len(), 2, "{errors:?}");
    assert!(cannot
        .iter()
        .all(|e| e.message.contains("cannot be changed")));
    assert_eq!(cannot[0].occurrences, 2, "once per call, kept once");
}

//! `#[trace_router]` and `trace_router_value!` on a small mixture-of-experts block of slices:
//! what a call records, what the arguments change, what a wrong value reports, and the
//! `router` kind of the tracepoint filter. Sessions are built with `Session::builder`, which
//! reads no environment variable. Cost: a few milliseconds.

use model_trace::{
    trace_layer, trace_router, trace_router_value, ModelTracerConfig, Session, TensorRef,
};

/// Three tokens, four experts, two chosen per token: ids as `f32`, as a slice holds them.
const LOGITS: [f32; 12] = [
    2.0, 1.0, 0.5, -1.0, //
    0.0, 0.1, 3.0, 0.2, //
    1.0, 1.0, 0.0, 0.9,
];
const WEIGHTS: [f32; 6] = [0.7, 0.3, 0.8, 0.2, 0.5, 0.5];
const EXPERTS: [f32; 6] = [0.0, 1.0, 2.0, 3.0, 1.0, 0.0];

type Routing<'a> = (TensorRef<'a>, TensorRef<'a>, TensorRef<'a>);

struct Moe {
    bias: Vec<f32>,
}

impl Moe {
    #[trace_layer(index = 5)]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let _ = self.route(&EXPERTS);
        x.to_vec()
    }

    /// Returns a `Result`, as candle code does; the layer is the enclosing one.
    #[trace_router(scoring = sigmoid, bias = &self.bias, name = "gate")]
    fn route<'a>(&self, experts: &'a [f32]) -> Result<Routing<'a>, String> {
        let logits = TensorRef::new(&LOGITS, &[3, 4]).map_err(|e| e.to_string())?;
        let weights = TensorRef::new(&WEIGHTS, &[3, 2]).map_err(|e| e.to_string())?;
        let experts = TensorRef::new(experts, &[3, 2]).map_err(|e| e.to_string())?;
        Ok((logits, weights, experts))
    }
}

/// The inline form, grouped: two groups of two experts, one chosen.
fn grouped(layer: usize, experts: &[f32]) {
    let logits = TensorRef::new(&LOGITS, &[3, 4]).unwrap();
    let weights = TensorRef::new(&WEIGHTS, &[3, 2]).unwrap();
    let experts = TensorRef::new(experts, &[3, 2]).unwrap();
    trace_router_value!(
        &logits,
        &weights,
        &experts,
        groups = (2u8, 1),
        layer = layer
    );
}

#[cfg(not(feature = "enabled"))]
#[test]
fn compiled_out_routers_record_nothing() {
    let session = Session::builder(ModelTracerConfig::full())
        .start()
        .expect("starts");
    let moe = Moe { bias: vec![0.0; 4] };
    moe.forward(&[1.0]);
    grouped(1, &EXPERTS);
    assert!(session.finish().routers().is_empty());
}

#[cfg(feature = "enabled")]
mod enabled {
    use super::*;
    use model_trace::{RecordErrorKind, RouterScoring, TracepointKind};

    #[test]
    fn the_attribute_records_one_event_a_call_with_its_arguments() {
        let session = Session::builder(ModelTracerConfig::full())
            .start()
            .expect("starts");
        let moe = Moe {
            bias: vec![0.0, 0.0, 0.0, 0.4],
        };
        moe.forward(&[1.0]);
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        let [call] = tracer.routers() else {
            panic!("one call: {:?}", tracer.routers());
        };
        assert_eq!((call.layer, &*call.tracepoint), (5, "gate"));
        assert!(call.function.ends_with("::route"), "{}", call.function);
        assert_eq!(
            (call.scoring, call.selection_bias, call.groups),
            (RouterScoring::Sigmoid, true, None)
        );
        assert_eq!((call.num_experts, call.top_k, call.tokens.len()), (4, 2, 3));
        assert_eq!(call.load, [2, 2, 1, 1]);
        assert_eq!(call.logits.shape, [3, 4]);
        // token 0: the bias makes expert 3 the runner-up, σ(-1) + 0.4 = 0.67 > σ(0.5) = 0.62
        let first = &call.tokens[0];
        assert_eq!(
            (first.runner_up, first.logits.clone()),
            (Some(3), vec![2.0, 1.0, -1.0])
        );
        assert!(first.margin > 0.0 && first.logit_margin > 0.0, "{first:?}");
        // token 2 chose 1 and 0 in that order, weights as returned
        assert_eq!(
            (
                call.tokens[2].experts.clone(),
                call.tokens[2].weights.clone()
            ),
            (vec![1, 0], vec![0.5, 0.5])
        );
    }

    #[test]
    fn the_inline_form_records_groups_and_the_given_layer() {
        let session = Session::builder(ModelTracerConfig::full())
            .start()
            .expect("starts");
        grouped(7, &EXPERTS);
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        let call = &tracer.routers()[0];
        assert_eq!(
            (call.layer, &*call.tracepoint, call.scoring),
            (7, "router", RouterScoring::Softmax)
        );
        let groups = call.groups.expect("grouped");
        assert_eq!((groups.groups, groups.top_groups), (2, 1));
        // token 1 chose 2 and 3 (group 1), the other group's best scores lower: positive
        assert!(call.tokens[1].group_margin.expect("grouped") > 0.0);
        // token 0 chose 0 and 1 (group 0), ahead of group 1: runner-up in group 0 only, none
        assert_eq!(call.tokens[0].runner_up, None);
    }

    #[test]
    fn values_that_do_not_fit_are_errors_of_the_tracepoint_never_panics() {
        let session = Session::builder(ModelTracerConfig::full())
            .start()
            .expect("starts");
        grouped(0, &[0.0, 1.0, 2.0, 4.0, 1.0, 0.0]);
        grouped(0, &[0.0, 1.0, 2.0, 1.5, 1.0, 0.0]);
        grouped(0, &[0.0, 1.0, 2.0, 2.0, 1.0, 0.0]);
        let logits = TensorRef::new(&LOGITS, &[3, 4]).unwrap();
        let weights = TensorRef::new(&WEIGHTS, &[2, 3]).unwrap();
        trace_router_value!(&logits, &weights, &weights, name = "mismatch");
        let (bias, experts) = ([0.0f32; 3], TensorRef::new(&EXPERTS, &[3, 2]).unwrap());
        let weights = TensorRef::new(&WEIGHTS, &[3, 2]).unwrap();
        trace_router_value!(&logits, &weights, &experts, bias = &bias, name = "bias");
        trace_router_value!(&logits, &"not a tensor", &logits, name = "not_a_tensor");
        let (tracer, errors) = session.finish_with_errors();
        assert!(tracer.routers().is_empty(), "{:?}", tracer.routers());
        let messages: Vec<(RecordErrorKind, String)> =
            errors.iter().map(|e| (e.kind, e.message.clone())).collect();
        let has = |kind: RecordErrorKind, text: &str| {
            messages.iter().any(|(k, m)| *k == kind && m.contains(text))
        };
        assert!(
            has(
                RecordErrorKind::Shape,
                "expert id 4 (row 1) is not one of the 4 experts"
            ),
            "{messages:?}"
        );
        assert!(
            has(RecordErrorKind::Shape, "expert id 1.5 (row 1)"),
            "{messages:?}"
        );
        assert!(
            has(
                RecordErrorKind::Shape,
                "row 1 chooses expert 2 twice ([2, 2])"
            ),
            "{messages:?}"
        );
        assert!(
            has(
                RecordErrorKind::Shape,
                "have 2 rows, logits of shape [3, 4] 3"
            ),
            "{messages:?}"
        );
        assert!(
            has(
                RecordErrorKind::Config,
                "the selection bias has 3 values for 4 experts"
            ),
            "{messages:?}"
        );
        assert!(
            has(RecordErrorKind::NotATensor, "router weights"),
            "{messages:?}"
        );
    }

    #[test]
    fn the_filter_selects_routers_by_kind() {
        let moe = Moe { bias: vec![0.0; 4] };
        let run = |filter: &str| {
            let session = Session::builder(ModelTracerConfig::full())
                .filter(filter)
                .start()
                .expect("starts");
            moe.forward(&[1.0]);
            grouped(1, &EXPERTS);
            session.finish().routers().len()
        };
        assert_eq!(run("router:*"), 2);
        assert_eq!(run("router:gate"), 1);
        assert_eq!(run("-router:*"), 0);
        assert_eq!(run("layer:*"), 0);
        let kinds: Vec<TracepointKind> =
            model_trace::tracepoints().iter().map(|t| t.kind).collect();
        assert!(kinds.contains(&TracepointKind::Router));
    }

    #[test]
    fn a_trace_file_reads_back_to_the_events_recorded_in_memory() {
        let path =
            std::env::temp_dir().join(format!("model-trace-routers-{}.ndjson", std::process::id()));
        let session = Session::builder(ModelTracerConfig::full())
            .trace_file(&path)
            .in_memory(true)
            .start()
            .expect("starts");
        Moe { bias: vec![0.0; 4] }.forward(&[1.0]);
        grouped(1, &EXPERTS);
        let tracer = session.finish();
        let mut reader = model_trace::TraceReader::open(&path).expect("a trace file");
        let read: Vec<model_trace::RouterEvent> = (&mut reader)
            .filter_map(|event| match event.expect("every line reads") {
                model_trace::Event::Router(router) => Some(router),
                _ => None,
            })
            .collect();
        assert!(reader.unknown_events().is_empty());
        assert_eq!(read, tracer.routers());
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn routers_are_off_when_the_configuration_says_so() {
        let config = ModelTracerConfig {
            trace_router: false,
            ..ModelTracerConfig::full()
        };
        let session = Session::builder(config).start().expect("starts");
        grouped(1, &EXPERTS);
        assert!(session.finish().routers().is_empty());
    }
}

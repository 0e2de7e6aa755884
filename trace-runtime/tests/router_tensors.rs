//! The router hook driven through `__private` by hand, the way `#[trace_router]` calls it,
//! with candle tensors as a candle port returns them: `[batch, seq, experts]` logits, expert
//! ids as `U32` or `I64`, weights in bf16. Cost: milliseconds.
#![cfg(all(feature = "enabled", feature = "candle"))]

use candle_core::{DType, Device, Tensor};
use trace_runtime::__private::{
    self, record_router, Callsite, Registered, RouterArgs, RouterParts, TraceTensor, TracepointKind,
};
use trace_runtime::{ModelTracerConfig, RecordErrorKind, RouterScoring, Session};

static ROUTER: Callsite = Callsite::new(
    TracepointKind::Router,
    "gate",
    "route",
    module_path!(),
    file!(),
    line!(),
);
__private::inventory::submit! { Registered(&ROUTER) }

fn args(scoring: RouterScoring) -> RouterArgs<'static> {
    RouterArgs {
        layer: Some(2),
        scoring,
        groups: None,
        bias: None,
    }
}

fn record(args: RouterArgs<'_>, logits: &Tensor, weights: &Tensor, experts: &Tensor) {
    let parts = [logits, weights, experts].map(|t| Some(t as &dyn TraceTensor));
    record_router(&ROUTER, args, RouterParts::Values(parts));
}

/// Batch 2, sequence 2, 4 experts: logits, and the top-2 as a router computes them.
fn routing(ids: DType) -> (Tensor, Tensor, Tensor) {
    let device = Device::Cpu;
    let logits: Vec<f32> = vec![
        2.0, 1.0, 0.5, -1.0, //
        0.0, 0.1, 3.0, 0.2, //
        1.0, 1.2, 0.0, 0.9, //
        -1.0, 0.0, 0.5, 2.5,
    ];
    let logits = Tensor::from_vec(logits, (2, 2, 4), &device).unwrap();
    let probs = candle_core::Tensor::exp(&logits).unwrap();
    let probs = probs.broadcast_div(&probs.sum_keepdim(2).unwrap()).unwrap();
    let experts = probs
        .arg_sort_last_dim(false)
        .unwrap()
        .narrow(2, 0, 2)
        .unwrap();
    let weights = probs.gather(&experts.contiguous().unwrap(), 2).unwrap();
    let experts = experts.reshape((4, 2)).unwrap().to_dtype(ids).unwrap();
    let weights = weights
        .reshape((4, 2))
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    (logits, weights, experts)
}

#[test]
fn candle_ids_of_either_integer_type_are_read_and_a_batch_is_read_batch_major() {
    for ids in [DType::U32, DType::I64] {
        let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
        let (logits, weights, experts) = routing(ids);
        record(args(RouterScoring::Softmax), &logits, &weights, &experts);
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        let call = &tracer.routers()[0];
        assert_eq!((call.layer, call.num_experts, call.top_k), (2, 4, 2));
        assert_eq!(call.logits.shape, [2, 2, 4]);
        let chosen: Vec<Vec<u32>> = call.tokens.iter().map(|t| t.experts.clone()).collect();
        assert_eq!(chosen, [vec![0, 1], vec![2, 3], vec![1, 0], vec![3, 2]]);
        assert_eq!(call.load, [2, 2, 2, 2]);
        // the router's own top-k: every margin positive, the bf16 weights read as f32
        assert!(call
            .tokens
            .iter()
            .all(|t| t.margin > 0.0 && t.logit_margin > 0.0));
        assert!(
            (call.tokens[0].weights[0] - 0.609).abs() < 0.01,
            "{:?}",
            call.tokens[0]
        );
        // row 2 is batch 1's first token: 1.2 and 1.0 chosen, 0.9 runs up
        assert_eq!(call.tokens[2].runner_up, Some(3));
        assert!((call.tokens[2].logit_margin - 0.05).abs() < 1e-6);
    }
}

#[test]
fn float_ids_and_a_bias_tensor_are_read_too() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    let (logits, weights, experts) = routing(DType::F32);
    let bias = Tensor::new(&[0.0f32, 0.0, 0.0, 0.1], &Device::Cpu).unwrap();
    let with_bias = RouterArgs {
        bias: Some(Some(&bias)),
        ..args(RouterScoring::Sigmoid)
    };
    record(with_bias, &logits, &weights, &experts);
    let (tracer, errors) = session.finish_with_errors();
    assert!(errors.is_empty(), "{errors:?}");
    let call = &tracer.routers()[0];
    assert!(call.selection_bias);
    assert_eq!(call.scoring, RouterScoring::Sigmoid);
}

#[test]
fn a_shape_that_does_not_fit_is_an_error_not_a_panic() {
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    let (logits, weights, experts) = routing(DType::U32);
    let three = experts.narrow(0, 0, 3).unwrap();
    record(args(RouterScoring::Softmax), &logits, &weights, &three);
    let wide = experts.reshape((2, 4)).unwrap();
    record(args(RouterScoring::Softmax), &logits, &wide, &wide);
    let (tracer, errors) = session.finish_with_errors();
    assert!(tracer.routers().is_empty());
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert!(
        errors.iter().all(|e| e.kind == RecordErrorKind::Shape),
        "{errors:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("do not match experts of shape [3, 2]")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("[2, 4] have 2 rows, logits of shape [2, 2, 4] 4")),
        "{messages:?}"
    );
}

//! The `moe` program traced to a file, on the small random models of `common` (one process a
//! run, so that an injected bug is its alone): four passes (a prefill of 9 ids, 3 decode steps)
//! with every layer's stages, attention and logits, F32 said in the header, and each
//! mixture-of-experts layer's router event; each routing bug changes its layer's `mlp_out` and
//! nothing before it (the bug is in the router, which runs after `mlp_in`); a choice that does
//! not follow the port's own logits shows in its own margins. Each run takes milliseconds; the
//! test binary's runs, about 30, under a second together.
#![cfg(feature = "trace")]

#[allow(dead_code)] // the GGUF ports' modes are not this port's
#[path = "../../shared/traced_run.rs"]
mod traced_run;

mod common;

use common::{Fixture, DEEPSEEK_V3, LAYERS, QWEN3_MOE};
use model_trace::Event;
use traced_run::TracedRun;

const PROGRAM: &str = env!("CARGO_BIN_EXE_moe");
/// The passes of a default run: the prefill and 3 decode steps.
const PASSES: usize = 4;

/// The program on `fixture`'s model with `bugs` injected (none: the clean port).
fn run(fixture: Fixture, name: &str, bugs: Option<&str>) -> TracedRun {
    let dir = fixture.dir();
    let mut args = vec!["--model", dir.to_str().unwrap()];
    if let Some(bugs) = bugs {
        args.extend(["--inject-bug", bugs]);
    }
    TracedRun::of(PROGRAM, name, &args, &[])
}

#[test]
fn each_family_records_every_pass_layer_and_stage_in_f32() {
    for (fixture, stages) in [
        (QWEN3_MOE, 9), // input, attn_in, q_norm, k_norm, attn_out, resid_mid, mlp_in, mlp_out, output
        (DEEPSEEK_V3, 7),
    ] {
        let traced = run(fixture, fixture.model_type, None);
        traced.assert_precision(&["F32"], &[], "the port");
        let fingerprints = traced.fingerprints();
        // Every layer's stages and the logits, in each pass.
        assert_eq!(
            fingerprints.len(),
            PASSES * (LAYERS * stages + 1),
            "{fixture:?}"
        );
        for pass in 0..PASSES {
            for layer in 0..LAYERS {
                for stage in ["attn_in", "attn_out", "resid_mid", "mlp_in", "mlp_out"] {
                    assert!(
                        traced.stage(pass, layer, stage).is_some(),
                        "{pass} {layer} {stage}"
                    );
                }
            }
        }
        let attention = traced
            .events
            .iter()
            .filter(|e| matches!(e, Event::Attention(_)))
            .count();
        assert_eq!(attention, PASSES * LAYERS, "{fixture:?}");
        // The decode steps' tensors are one position each.
        let mlp_out = traced.stage(1, 0, "mlp_out").unwrap();
        assert_eq!(mlp_out.shape, [1, 1, common::HIDDEN]);
    }
}

/// The routing bugs each fixture shows, injected in layer 2 (a mixture-of-experts layer of
/// both families).
const BUGS: [(Fixture, &str); 11] = [
    (QWEN3_MOE, "no-renormalize"),
    (QWEN3_MOE, "router-bf16"),
    (QWEN3_MOE, "experts-off-by-one"),
    (QWEN3_NO_NORM, "renormalize"),
    (QWEN3_NO_NORM, "softmax-after-topk"),
    (DEEPSEEK_V3, "bias-in-weights"),
    (DEEPSEEK_V3, "scale-twice"),
    (DEEPSEEK_V3, "softmax-for-sigmoid"),
    (DEEPSEEK_V3, "no-renormalize"),
    (DEEPSEEK_V3, "experts-off-by-one"),
    (DEEPSEEK_NEGATIVE, "mask-zero"),
];

/// Qwen3-MoE without `norm_topk_prob`.
const QWEN3_NO_NORM: Fixture = Fixture {
    norm_topk_prob: false,
    ..QWEN3_MOE
};

/// DeepSeek-V3 with every selection score negative (the biases shifted by -1): where masking
/// the other groups with 0 instead of -inf chooses their experts.
const DEEPSEEK_NEGATIVE: Fixture = Fixture {
    bias_shift: -1.0,
    ..DEEPSEEK_V3
};

#[test]
fn each_routing_bug_changes_its_layers_mlp_out_and_nothing_before_it() {
    const LAYER: usize = 2;
    for (fixture, bug) in BUGS {
        let name = format!("{}-{}", fixture.model_type, fixture.norm_topk_prob);
        let clean = run(fixture, &format!("{name}-clean-{bug}"), None).fingerprints();
        let bugged = run(
            fixture,
            &format!("{name}-{bug}"),
            Some(&format!("{bug}@{LAYER}")),
        )
        .fingerprints();
        assert_eq!(clean.len(), bugged.len());
        for (clean, bugged) in clean.iter().zip(&bugged) {
            let (pass, layer, stage, _) = clean;
            let before = *layer < LAYER
                || (*layer == LAYER && !matches!(stage.as_str(), "mlp_out" | "output"));
            if before {
                assert!(
                    clean == bugged,
                    "{bug}: pass {pass} layer {layer} {stage} moved"
                );
            }
            if (*pass, *layer, stage.as_str()) == (0, LAYER, "mlp_out") {
                assert!(
                    clean != bugged,
                    "{bug} on {fixture:?}: layer {LAYER}'s mlp_out unchanged"
                );
            }
        }
    }
}

/// With `norm_topk_prob` the softmax of the k chosen logits is the renormalised top-k of the
/// softmax: the same function, so `softmax-after-topk` moves the logits by float rounding only.
#[test]
fn softmax_after_topk_is_the_same_function_under_norm_topk_prob() {
    let clean = run(QWEN3_MOE, "same-clean", None);
    let bugged = run(
        QWEN3_MOE,
        "same-softmax-after-topk",
        Some("softmax-after-topk"),
    );
    for (pass, layer, stage, _) in clean.fingerprints() {
        let norm = |run: &TracedRun| match stage.as_str() {
            "logits" => logits_norm(run, pass),
            _ => run.stage(pass, layer, &stage).unwrap().stats.l2_norm,
        };
        let (a, b) = (norm(&clean), norm(&bugged));
        assert!(
            (a - b).abs() <= 1e-5 * a,
            "pass {pass} layer {layer} {stage}: {a} vs {b}"
        );
    }
}

fn logits_norm(run: &TracedRun, pass: usize) -> f32 {
    run.events
        .iter()
        .find_map(|event| match event {
            Event::Logits(l) if l.pass == pass => Some(l.logits.stats.l2_norm),
            _ => None,
        })
        .unwrap()
}

/// Every router event of a run, in the order written.
fn routers(run: &TracedRun) -> Vec<&model_trace::RouterEvent> {
    run.events
        .iter()
        .filter_map(|event| match event {
            Event::Router(router) => Some(router),
            _ => None,
        })
        .collect()
}

#[test]
fn each_moe_layer_records_its_router_in_every_pass() {
    for (fixture, experts, top_k) in [(QWEN3_MOE, 8, 2), (DEEPSEEK_V3, 16, 4)] {
        let traced = run(fixture, &format!("routers-{}", fixture.model_type), None);
        let calls = routers(&traced);
        let layers = fixture.moe_layers();
        assert_eq!(calls.len(), PASSES * layers.len(), "{fixture:?}");
        for (i, call) in calls.iter().enumerate() {
            let pass = i / layers.len();
            assert_eq!(
                (call.pass, call.layer),
                (Some(pass), layers[i % layers.len()])
            );
            assert_eq!((call.num_experts, call.top_k), (experts, top_k));
            let sigmoid = fixture.model_type == "deepseek_v3";
            assert_eq!(call.selection_bias, sigmoid);
            assert_eq!(call.groups.is_some(), sigmoid);
            // The prefill's 9 tokens, then one a decode step; each chose top_k experts.
            let rows = if pass == 0 { 9 } else { 1 };
            assert_eq!(call.tokens.len(), rows);
            assert_eq!(call.load.iter().sum::<usize>(), rows * top_k);
            // The clean port chooses the top-k of its own scores.
            assert!(call.tokens.iter().all(|t| t.margin >= 0.0), "{call:?}");
        }
    }
}

/// Without a reference, the port's own router record shows a choice that does not follow its
/// logits: the experts off by one (and a mask of 0 that lets other groups' experts in) leave
/// negative margins in their layer and nowhere else.
#[test]
fn a_choice_that_does_not_follow_the_logits_shows_in_the_ports_own_margins() {
    const LAYER: usize = 2;
    for (fixture, bug) in [
        (QWEN3_MOE, "experts-off-by-one"),
        (DEEPSEEK_V3, "experts-off-by-one"),
        (DEEPSEEK_NEGATIVE, "mask-zero"),
    ] {
        let name = format!("margins-{}-{bug}", fixture.model_type);
        let traced = run(fixture, &name, Some(&format!("{bug}@{LAYER}")));
        for call in routers(&traced) {
            let negative = call.tokens.iter().filter(|t| t.margin < 0.0).count();
            if call.layer == LAYER {
                assert!(negative > 0, "{bug}: no negative margin in {call:?}");
            } else {
                assert_eq!(negative, 0, "{bug}: layer {}", call.layer);
            }
        }
    }
}

//! `diff`, `summary` and `report` on traces with router calls: which tokens chose other experts
//! than the reference's, whether the other's router-logit error explains each (a near-tie) or
//! not (a divergence), tokens whose weights differ past that error, the experts' computation
//! against their choice, a floor, and traces without routers unchanged.
//!
//! The router events are built here from router logits (top-2 of 8 experts, softmax weights
//! renormalized over the chosen, as Mixtral does) and written into the trace beside a small
//! traced model's layers by a sink that wraps the trace-file writer. Each test writes a few
//! traces of 3 layers and 2 passes and runs the binary a few times: well under a second each.

mod common;

use std::borrow::Cow;
use std::path::Path;

use model_trace::{
    trace_layer, trace_model, trace_tensor, Event, ModelTracerConfig, RoutedToken, RouterEvent,
    RouterScoring, Session, SinkError, TensorSummary, TraceFileSink, TraceHeader, TraceSink,
};
use serde_json::Value;

use common::{embedded_data, run, scratch, text};

const LAYERS: usize = 3;
const PASSES: usize = 2;
/// Tokens per router call.
const ROWS: usize = 4;
const EXPERTS: usize = 8;
const TOP_K: usize = 2;
/// The other's error on every router logit (alternating in sign by expert).
const NOISE: f32 = 0.003;
/// An rtol that admits [`NOISE`] on every listed router logit (each at least 1 in magnitude).
const NOISE_RTOL: &str = "1e-2";
/// (pass, layer, row) of the token whose reference choice is a near-tie.
const TIED: (usize, usize, usize) = (0, 1, 2);
/// The reference's logit margin there: its runner-up 2δ below its weakest chosen expert.
const TIE_MARGIN: f32 = 0.001;

/// What a run does differently from the reference.
#[derive(Clone, Copy, Default)]
struct Run {
    /// Every router logit moved by ±[`NOISE`], which flips the choice at [`TIED`].
    noise: bool,
    /// At this (pass, layer, row), the router chooses its runner-up instead of its second
    /// expert (its top-k is wrong; its logits are the reference's).
    wrong_choice: &'static [(usize, usize, usize)],
    /// In this layer, the weights are the softmax over every expert, not renormalized over
    /// the chosen two.
    unnormalized: Option<usize>,
    /// In this layer, `mlp_out` is 10% off.
    mlp_out_off: Option<usize>,
    /// Routers of this many experts.
    experts: Option<usize>,
    /// No router calls at all.
    no_routers: bool,
    /// In this layer, every router logit 1.5 off (up for odd experts, down for even ones).
    logits_off: Option<usize>,
    /// In this layer, the router's input `mlp_in` is 10% off.
    mlp_in_off: Option<usize>,
    /// In this layer, every chosen expert and runner-up id is one more (mod the experts).
    experts_shifted: Option<usize>,
    /// Every token's router logits recorded as log-probabilities (less their logsumexp): the
    /// same softmax router, shifted per token.
    log_probabilities: bool,
    /// No `mlp_in` traced (the router's input).
    no_mlp_in: bool,
}

/// The router logits of a token: experts `(row + layer) % 8` and `+3` at 3 and 2, the runner-up
/// `+5` at 1 (at [`TIED`], just under 2), the others below 0.
fn reference_logits(pass: usize, layer: usize, row: usize, experts: usize) -> Vec<f32> {
    let first = row + layer;
    let mut logits: Vec<f32> = (0..experts)
        .map(|e| -0.5 - 0.05 * ((e + pass) % experts) as f32)
        .collect();
    logits[first % experts] = 3.0;
    logits[(first + 3) % experts] = 2.0;
    logits[(first + 5) % experts] = if (pass, layer, row) == TIED {
        2.0 - 2.0 * TIE_MARGIN
    } else {
        1.0
    };
    logits
}

/// A token routed by `logits` (top-k by logit, softmax weights over the chosen), its row.
fn routed(row: usize, logits: &[f32], unnormalized: bool) -> RoutedToken {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let chosen = &order[..TOP_K];
    let runner_up = order[TOP_K];
    let exp: Vec<f32> = logits.iter().map(|l| l.exp()).collect();
    let all: f32 = exp.iter().sum();
    let probs: Vec<f32> = exp.iter().map(|e| e / all).collect();
    let over: f32 = if unnormalized {
        1.0
    } else {
        chosen.iter().map(|&e| probs[e]).sum()
    };
    let weakest = chosen[TOP_K - 1];
    RoutedToken {
        row,
        experts: chosen.iter().map(|&e| e as u32).collect(),
        weights: chosen.iter().map(|&e| probs[e] / over).collect(),
        runner_up: Some(runner_up as u32),
        margin: probs[weakest] - probs[runner_up],
        group_margin: None,
        logit_margin: ((logits[weakest] - logits[runner_up]) / 2.0).max(0.0),
        logits: chosen
            .iter()
            .chain([&runner_up])
            .map(|&e| logits[e])
            .collect(),
    }
}

impl Run {
    /// The reference's routing but for the tokens at `wrong`, which chose their runner-up.
    fn wrong(wrong: &'static [(usize, usize, usize)]) -> Self {
        Self {
            wrong_choice: wrong,
            ..Self::default()
        }
    }

    /// The reference's model, recording no router calls.
    fn without_routers() -> Self {
        Self {
            no_routers: true,
            ..Self::default()
        }
    }

    /// The router call of `layer` in `pass`.
    fn router(&self, pass: usize, layer: usize) -> RouterEvent {
        let experts = self.experts.unwrap_or(EXPERTS);
        let tokens: Vec<RoutedToken> = (0..ROWS)
            .map(|row| self.token(pass, layer, row, experts))
            .collect();
        let mut load = vec![0; experts];
        for token in &tokens {
            for &e in &token.experts {
                load[e as usize] += 1;
            }
        }
        RouterEvent {
            seq: 0,
            pass: Some(pass),
            layer,
            tracepoint: Cow::Borrowed("route"),
            function: Cow::Borrowed("routing::route"),
            scoring: RouterScoring::Softmax,
            groups: None,
            selection_bias: false,
            num_experts: experts,
            top_k: TOP_K,
            logits: TensorSummary::of_values(
                vec![ROWS, experts],
                "f32",
                &vec![0.5; ROWS * experts],
            ),
            tokens,
            load,
        }
    }

    fn token(&self, pass: usize, layer: usize, row: usize, experts: usize) -> RoutedToken {
        let mut logits = reference_logits(pass, layer, row, experts);
        if self.noise {
            for (e, l) in logits.iter_mut().enumerate() {
                *l += if e % 2 == 0 { NOISE } else { -NOISE };
            }
            // At the tie, the noise favours the runner-up, by NOISE on each of the two.
            if (pass, layer, row) == TIED {
                let reference = reference_logits(pass, layer, row, experts);
                let (weakest, runner_up) =
                    ((row + layer + 3) % experts, (row + layer + 5) % experts);
                logits[weakest] = reference[weakest] - NOISE;
                logits[runner_up] = reference[runner_up] + NOISE;
            }
        }
        if self.logits_off == Some(layer) {
            for (e, l) in logits.iter_mut().enumerate() {
                *l += if e % 2 == 1 { 1.5 } else { -1.5 };
            }
        }
        if self.log_probabilities {
            let logsumexp = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
            logits.iter_mut().for_each(|l| *l -= logsumexp);
        }
        let mut token = routed(row, &logits, self.unnormalized == Some(layer));
        if self.experts_shifted == Some(layer) {
            let next = |e: u32| (e + 1) % experts as u32;
            token.experts = token.experts.iter().map(|&e| next(e)).collect();
            token.runner_up = token.runner_up.map(next);
        }
        if self.wrong_choice.contains(&(pass, layer, row)) {
            // The runner-up chosen in place of the second expert: the logits stay its own.
            let second = token.experts[1];
            token.experts[1] = token.runner_up.expect("a runner-up");
            token.runner_up = Some(second);
            token.logits.swap(1, 2);
            token.margin = -token.margin;
            token.logit_margin = 0.0;
        }
        token
    }

    fn mlp_out(&self, pass: usize, layer: usize) -> Vec<f32> {
        let off = if self.mlp_out_off == Some(layer) {
            1.1
        } else {
            1.0
        };
        (0..64)
            .map(|i| ((i as f32 * 0.37 + layer as f32 + pass as f32 * 0.5).sin() + 2.0) * off)
            .collect()
    }
}

#[trace_layer(index = layer)]
fn block(run: &Run, pass: usize, layer: usize) {
    let attn_out: Vec<f32> = (0..64)
        .map(|i| (i as f32 * 0.11 + layer as f32).cos())
        .collect();
    trace_tensor!("attn_out", &attn_out);
    let off = if run.mlp_in_off == Some(layer) {
        1.1
    } else {
        1.0
    };
    let mlp_in: Vec<f32> = attn_out.iter().map(|a| (a + 2.0) * off).collect();
    if !run.no_mlp_in {
        trace_tensor!("mlp_in", &mlp_in);
    }
    let mlp_out = run.mlp_out(pass, layer);
    trace_tensor!("mlp_out", &mlp_out);
}

#[trace_model(position = position)]
fn forward(run: &Run, position: usize) {
    for layer in 0..LAYERS {
        block(run, position, layer);
    }
}

/// The trace-file writer, with the router calls of each pass written before its end.
struct WithRouters {
    file: TraceFileSink,
    run: Run,
}

impl TraceSink for WithRouters {
    fn name(&self) -> Cow<'_, str> {
        self.file.name()
    }

    fn start(&mut self, header: &TraceHeader) -> Result<(), SinkError> {
        self.file.start(header)
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        if let (Event::PassEnd(end), false) = (event, self.run.no_routers) {
            for layer in 0..LAYERS {
                self.file
                    .event(&Event::Router(self.run.router(end.pass, layer)))?;
            }
        }
        self.file.event(event)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.file.finish()
    }

    fn wants_digests(&self) -> bool {
        true
    }
}

/// Writes [`PASSES`] passes of `run` to `dir/name`.
fn write(dir: &Path, name: &str, run: Run) -> String {
    let path = dir.join(name);
    let sink = WithRouters {
        file: TraceFileSink::create(&path).expect("the trace file can be created"),
        run,
    };
    let session = Session::builder(ModelTracerConfig::lightweight())
        .sink(sink)
        .start()
        .expect("the session starts");
    for position in 0..PASSES {
        forward(&run, position);
    }
    session.finish();
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// `diff --json` of `args`: its exit code and output.
fn diff_json(args: &[&str]) -> (Option<i32>, Value) {
    let output = run(&[&["diff", "--json"], args].concat());
    let value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    (output.status.code(), value)
}

/// The routing verdict of each layer.
fn verdicts(routing: &Value) -> Vec<&str> {
    routing["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| l["verdict"].as_str().expect("a verdict"))
        .collect()
}

#[test]
fn a_near_tie_is_told_from_a_divergence() {
    let dir = scratch("routing-tie");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let noisy = Run {
        noise: true,
        ..Run::default()
    };
    let tie = write(&dir, "tie.ndjson", noisy);
    // Stages, router logits included, judged at a tolerance that admits the noise (as a
    // port's rounding is admitted): its flip is a near-tie, nothing more.
    let (_, json) = diff_json(&[&reference, &tie, "--rtol", NOISE_RTOL]);
    let routing = &json["routing"];
    assert_eq!(routing["tokens"], LAYERS * PASSES * ROWS);
    assert_eq!(routing["differing"], 1, "{routing:#}");
    assert_eq!(routing["near_ties"], 1);
    assert_eq!(verdicts(routing), ["same", "near_ties", "same"]);
    let first = &routing["first_difference"];
    assert_eq!(
        (
            &first["pass"],
            &first["layer"],
            &first["row"],
            &first["position"]
        ),
        (
            &Value::from(TIED.0),
            &Value::from(TIED.1),
            &Value::from(TIED.2),
            &Value::from(TIED.2)
        )
    );
    assert_eq!(first["verdict"], "near_tie");
    // Up to a shift: the listed logits off by (±NOISE, −NOISE, +NOISE), less their mean, whose
    // largest is 4/3·NOISE.
    let error = first["logit_error"].as_f64().unwrap();
    assert!(
        (error - 4.0 / 3.0 * f64::from(NOISE)).abs() < 1e-4,
        "{error}"
    );
    assert!(routing["first_divergence"].is_null());
    assert_eq!(
        routing["weights_differ"], 0,
        "the noise explains the weights: {routing:#}"
    );

    // The same noise, and at pass 1, layer 2, row 0 a router that chose its runner-up.
    let wrong = Run {
        wrong_choice: &[(1, 2, 0)],
        ..noisy
    };
    let wrong_path = write(&dir, "wrong.ndjson", wrong);
    let (_, json) = diff_json(&[&reference, &wrong_path, "--rtol", NOISE_RTOL]);
    let routing = &json["routing"];
    assert_eq!(verdicts(routing), ["same", "near_ties", "routing"]);
    let divergence = &routing["first_divergence"];
    assert_eq!(
        (&divergence["pass"], &divergence["layer"]),
        (&Value::from(1), &Value::from(2))
    );
    assert_eq!(divergence["verdict"], "divergence");
    assert_eq!(routing["first_difference"]["verdict"], "near_tie");
    let output = run(&["diff", &reference, &wrong_path, "--rtol", NOISE_RTOL]);
    let said = text(&output);
    assert!(
        said.contains(
            "first token routed differently: pass 0, layer 1, row 2 (position 2): experts [3, 6] \
             vs [3, 0]: near-tie"
        ),
        "{said}"
    );
    assert!(
        said.contains("first routing divergence: pass 1, layer 2, row 0 (position 1)"),
        "{said}"
    );
    // After the stage comparison's headline, before its per-layer table.
    let headline = said
        .find("no tensor divergence: every matched tensor")
        .expect("the headline");
    assert!(
        said.contains("routing differs: layer 2 first (routing), 1 of 3 layers flagged"),
        "{said}"
    );
    let routing_at = said.find("routing:").expect("the routing");
    let table = said.find("layer  worst tensor").expect("the stage table");
    assert!(headline < routing_at && routing_at < table, "{said}");
}

#[test]
fn weights_that_differ_past_the_logit_error_are_counted() {
    let dir = scratch("routing-weights");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let other = write(
        &dir,
        "other.ndjson",
        Run {
            unnormalized: Some(0),
            ..Run::default()
        },
    );
    let (_, json) = diff_json(&[&reference, &other]);
    let routing = &json["routing"];
    assert_eq!(verdicts(routing), ["weights", "same", "same"]);
    let layer = &routing["layers"][0];
    assert_eq!(layer["weights_differ"], PASSES * ROWS);
    assert_eq!(layer["differing"], 0);
    let worst = &layer["worst_weights"];
    assert!(
        worst["other"].as_f64().unwrap() < worst["reference"].as_f64().unwrap(),
        "{worst}"
    );
    let said = text(&run(&["diff", &reference, &other]));
    assert!(
        said.contains("layer 0: 8 tokens chose alike with other weights"),
        "{said}"
    );
}

#[test]
fn the_experts_computation_is_told_from_their_choice() {
    let dir = scratch("routing-mlp");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let other = write(
        &dir,
        "other.ndjson",
        Run {
            mlp_out_off: Some(1),
            ..Run::default()
        },
    );
    let (code, json) = diff_json(&[&reference, &other]);
    assert_eq!(code, Some(1));
    assert_eq!(json["first_divergence"]["stage"], "mlp_out");
    let layers = &json["routing"]["layers"];
    assert_eq!(layers[1]["verdict"], "same");
    assert_eq!(layers[1]["computation_not_choice"], true);
    assert_eq!(layers[0]["computation_not_choice"], false);
    let said = text(&run(&["diff", &reference, &other]));
    assert!(
        said.contains("layer 1: routing matches, but mlp_out diverges: the experts' computation, not the choice"),
        "{said}"
    );
    // The same mlp_out with a router that chose otherwise: the choice may explain it.
    let both = write(
        &dir,
        "both.ndjson",
        Run {
            mlp_out_off: Some(1),
            ..Run::wrong(&[(0, 1, 3)])
        },
    );
    let said = text(&run(&["diff", &reference, &both]));
    assert!(
        said.contains("layer 1: mlp_out diverges, and 1 token chose other experts"),
        "{said}"
    );
    assert!(!said.contains("routing matches"), "{said}");
}

#[test]
fn a_floor_excuses_the_routing_differences_it_has_itself() {
    let dir = scratch("routing-floor");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let wrong = Run::wrong(&[(1, 2, 0)]);
    let other = write(&dir, "other.ndjson", wrong);
    let same_floor = write(&dir, "floor-same.ndjson", wrong);
    let clean_floor = write(&dir, "floor-clean.ndjson", Run::default());
    let layer2 = |floor: &str| {
        let (_, json) = diff_json(&[&reference, &other, "--floor", floor]);
        json["routing"]["layers"][2].clone()
    };
    let excused = layer2(&same_floor);
    assert_eq!(excused["verdict"], "routing");
    assert_eq!(excused["within_floor"], true);
    assert_eq!(excused["flagged"], false);
    assert_eq!(excused["floor"]["differing"], 1);
    let flagged = layer2(&clean_floor);
    assert_eq!(flagged["within_floor"], false);
    assert_eq!(flagged["flagged"], true);
    let said = text(&run(&["diff", &reference, &other, "--floor", &same_floor]));
    assert!(said.contains("routing (within the floor's)"), "{said}");
}

#[test]
fn traces_without_routers_are_unchanged_and_one_side_without_is_said() {
    let dir = scratch("moe-plain");
    let none = Run::without_routers();
    let (a, b) = (write(&dir, "a.ndjson", none), write(&dir, "b.ndjson", none));
    let (code, json) = diff_json(&[&a, &b]);
    assert_eq!(code, Some(0));
    assert!(json.get("routing").is_none(), "{json:#}");
    let said = text(&run(&["diff", &a, &b]));
    assert!(
        !said.contains("routing") && !said.contains("router"),
        "{said}"
    );

    let with = write(&dir, "with.ndjson", Run::default());
    let (_, json) = diff_json(&[&with, &b]);
    let notes = json["routing"]["notes"].to_string();
    assert!(
        notes.contains("the reference recorded 6 router calls and the other none"),
        "{notes}"
    );
    let said = text(&run(&["diff", &a, &with]));
    assert!(
        said.contains("routing: the other recorded 6 router calls and the reference none"),
        "{said}"
    );
}

#[test]
fn routers_of_other_experts_counts_are_not_compared_but_said() {
    let dir = scratch("routing-experts");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let other = write(
        &dir,
        "other.ndjson",
        Run {
            experts: Some(16),
            ..Run::default()
        },
    );
    let (_, json) = diff_json(&[&reference, &other]);
    let routing = &json["routing"];
    assert_eq!(verdicts(routing), ["experts_differ"; LAYERS]);
    assert_eq!(routing["tokens"], 0);
    let notes = routing["notes"].to_string();
    assert!(
        notes.contains(
            "layer 0: the reference's router has 8 experts, 2 per token, the other's 16 and 2"
        ),
        "{notes}"
    );
}

#[test]
fn isolation_tells_a_router_wrong_on_its_own_from_one_that_inherits() {
    let dir = scratch("routing-isolated");
    let reference = write(&dir, "ref.ndjson", Run::default());
    // The plain run routes differently in layers 1 and 2; fed the reference's input, only
    // layer 2's router still does.
    let other = write(&dir, "other.ndjson", Run::wrong(&[(0, 1, 1), (1, 2, 0)]));
    let isolated = write(&dir, "isolated.ndjson", Run::wrong(&[(1, 2, 0)]));
    let (_, json) = diff_json(&[&reference, &other, "--isolated", &isolated]);
    let first = &json["first_local_routing_divergence"];
    assert_eq!(
        (&first["pass"], &first["layer"], &first["row"]),
        (&Value::from(1), &Value::from(2), &Value::from(0))
    );
    let local: Vec<(&Value, &Value)> = json["local_routing"]
        .as_array()
        .expect("local_routing")
        .iter()
        .map(|l| (&l["inherited"], &l["local"]))
        .collect();
    assert_eq!(local[1], (&Value::from("routing"), &Value::from("same")));
    assert_eq!(local[2], (&Value::from("routing"), &Value::from("routing")));
    let said = text(&run(&["diff", &reference, &other, "--isolated", &isolated]));
    assert!(
        said.contains("first router wrong on its own: pass 1, layer 2, row 0"),
        "{said}"
    );
}

#[test]
fn summary_gives_each_layers_load_and_says_which_tokens_are_not_the_top_k() {
    let dir = scratch("routing-summary");
    let wrong = write(&dir, "wrong.ndjson", Run::wrong(&[(1, 2, 0)]));
    let output = run(&["summary", "--json", &wrong]);
    let json: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let routers = json["routers"].as_array().expect("routers");
    assert_eq!(routers.len(), LAYERS);
    for layer in routers {
        let load: Vec<u64> = (layer["load"].as_array().unwrap().iter())
            .map(|n| n.as_u64().unwrap())
            .collect();
        assert_eq!(load.iter().sum::<u64>() as usize, PASSES * ROWS * TOP_K);
        let mean = load.iter().sum::<u64>() as f64 / EXPERTS as f64;
        let imbalance = *load.iter().max().unwrap() as f64 / mean;
        assert!((layer["imbalance"].as_f64().unwrap() - imbalance).abs() < 1e-12);
    }
    let not_top_k: Vec<u64> = routers
        .iter()
        .map(|l| l["not_top_k"].as_u64().unwrap())
        .collect();
    assert_eq!(not_top_k, [0, 0, 1]);
    // Layer 1's narrowest choice is the near-tie.
    let narrowest = &routers[1]["narrowest"][0];
    assert_eq!(
        (&narrowest["pass"], &narrowest["row"]),
        (&Value::from(TIED.0), &Value::from(TIED.2))
    );
    let said = text(&run(&["summary", &wrong]));
    assert!(
        said.contains("ties: tokens whose margin is exactly 0"),
        "{said}"
    );
    assert!(
        said.contains(
            "layer 2: 1 of its 8 tokens chose experts that are not the top-2 of their own \
             selection scores"
        ),
        "{said}"
    );

    let plain = write(&dir, "plain.ndjson", Run::without_routers());
    let output = run(&["summary", "--json", &plain]);
    let json: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert!(json.get("routers").is_none());
    assert!(!text(&run(&["summary", &plain])).contains("routers:"));
}

#[test]
fn the_report_carries_each_layers_load_and_the_routing_comparison() {
    let dir = scratch("routing-report");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let wrong = write(&dir, "wrong.ndjson", Run::wrong(&[(1, 2, 0)]));
    let page = dir.join("report.html");
    let page_arg = page.to_str().unwrap();
    let output = run(&["report", &wrong, "--against", &reference, "-o", page_arg]);
    assert!(output.status.success(), "{}", text(&output));
    let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
    let routers = data["routers"].as_array().expect("routers");
    assert_eq!(routers.len(), LAYERS);
    // The summary's figures: the page draws the same loads.
    let summary: Value =
        serde_json::from_slice(&run(&["summary", "--json", &wrong]).stdout).expect("JSON");
    assert_eq!(data["routers"], summary["routers"]);
    let diff_text = data["diff"]["text"].as_str().unwrap();
    assert!(
        diff_text.contains("first token routed differently: pass 1, layer 2, row 0"),
        "{diff_text}"
    );

    let plain = write(&dir, "plain.ndjson", Run::without_routers());
    assert!(run(&["report", &plain, "-o", page_arg]).status.success());
    let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
    assert_eq!(data["routers"], Value::Array(Vec::new()));
}

#[test]
fn the_comparison_by_position_says_it_leaves_the_routers_out() {
    let dir = scratch("routing-position");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let plain = write(&dir, "plain.ndjson", Run::without_routers());
    let said = text(&run(&["diff", "--by-position", &reference, &plain]));
    assert!(
        said.contains(&format!(
            "the routers of {reference} ({} calls) are not compared by position",
            LAYERS * PASSES
        )),
        "{said}"
    );
    let said = text(&run(&["diff", "--by-position", &plain, &plain]));
    assert!(!said.contains("routers of"), "{said}");
}

#[test]
fn near_ties_in_numbers_say_the_router_logits_are_off() {
    let dir = scratch("routing-logits-off");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let off = Run {
        logits_off: Some(0),
        ..Run::default()
    };
    let other = write(&dir, "other.ndjson", off);
    let (_, json) = diff_json(&[&reference, &other]);
    let layer = &json["routing"]["layers"][0];
    // Each token's choice moved, each within the 1.5 error: near-ties, all of them ...
    assert_eq!(
        (&layer["differing"], &layer["near_ties"]),
        (&Value::from(8), &Value::from(8))
    );
    // ... which rounding does not do: said.
    let notes = json["routing"]["notes"].to_string();
    assert!(
        notes.contains("layer 0: 8 of 8 tokens are near-ties, more than rounding flips"),
        "{notes}"
    );
    assert_eq!(json["routing"]["layers"][1]["verdict"], "same");
}

#[test]
fn router_logits_off_from_an_input_within_the_tolerance_are_the_routers_own() {
    let dir = scratch("routing-own-logits");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let noisy = Run {
        noise: true,
        ..Run::default()
    };
    // Every logit 3e-3 off where the stages are judged at rtol 1e-5: each layer's router is
    // wrong on its own (mlp_in is within), and the near-tie of layer 1 is explained by it.
    let other = write(&dir, "noisy.ndjson", noisy);
    let (_, json) = diff_json(&[&reference, &other]);
    let routing = &json["routing"];
    assert_eq!(
        verdicts(routing),
        ["router_logits", "router_logits", "router_logits"]
    );
    let layer = &routing["layers"][1];
    assert_eq!(layer["flagged"], true);
    assert_eq!(layer["near_ties"], 1);
    assert_eq!(layer["router_logits"]["input"], "within");
    assert_eq!(layer["router_logits"]["own_error"], true);
    let said = text(&run(&["diff", &reference, &other]));
    assert!(
        said.contains("layer 1: the router's own logits differ: RMS error 2.83e-3"),
        "{said}"
    );
    assert!(
        said.contains("its 1 near-tie is explained by that error"),
        "{said}"
    );
    // The same logits from an input that diverged: inherited, the verdict the tokens give.
    let inherited = write(
        &dir,
        "inherited.ndjson",
        Run {
            mlp_in_off: Some(1),
            ..noisy
        },
    );
    let (_, json) = diff_json(&[&reference, &inherited]);
    let layer = &json["routing"]["layers"][1];
    assert_eq!(layer["verdict"], "near_ties");
    assert_eq!(layer["router_logits"]["input"], "diverged");
    assert_eq!(layer["router_logits"]["own_error"], false);
    // A looser tolerance (a quantized pair's) admits them.
    let (_, json) = diff_json(&[
        &reference,
        &other,
        "--check-error-stat",
        "norm",
        "--rtol",
        "0.15",
    ]);
    assert_eq!(verdicts(&json["routing"]), ["same", "near_ties", "same"]);
    // An override by the router logits' name applies to them, and is no unused override.
    let (_, json) = diff_json(&[&reference, &other, "--rtol", "layer.1.router_logits:0.15"]);
    let routing = &json["routing"];
    assert_eq!(verdicts(routing)[1], "near_ties");
    assert_eq!(verdicts(routing)[0], "router_logits");
    let warnings = json["warnings"].to_string();
    assert!(!warnings.contains("router_logits"), "{warnings}");
}

#[test]
fn an_inherited_mlp_out_divergence_is_not_blamed_on_the_experts() {
    let dir = scratch("routing-inherited-mlp");
    let reference = write(&dir, "ref.ndjson", Run::default());
    // mlp_in of layer 1 off: its mlp_out is traced the same here, but a real layer's would
    // follow; with both off, the layer inherits and is not the experts' doing.
    let other = write(
        &dir,
        "other.ndjson",
        Run {
            mlp_in_off: Some(1),
            mlp_out_off: Some(1),
            ..Run::default()
        },
    );
    let (_, json) = diff_json(&[&reference, &other]);
    let layer = &json["routing"]["layers"][1];
    assert_eq!(layer["mlp_out_diverged"], true);
    assert_eq!(layer["computation_not_choice"], false);
    let said = text(&run(&["diff", &reference, &other]));
    assert!(!said.contains("routing matches"), "{said}");
}

#[test]
fn tokens_listing_no_expert_in_common_have_an_unknown_error_never_0() {
    let dir = scratch("routing-unknown-error");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let shifted = write(
        &dir,
        "shifted.ndjson",
        Run {
            experts_shifted: Some(1),
            ..Run::default()
        },
    );
    let (_, json) = diff_json(&[&reference, &shifted]);
    let routing = &json["routing"];
    let layer = &routing["layers"][1];
    assert_eq!(layer["verdict"], "routing");
    assert_eq!(layer["unknown_errors"], PASSES * ROWS);
    assert!(layer["max_logit_error"].is_null(), "{layer:#}");
    assert!(layer["router_logits"].is_null(), "{layer:#}");
    let first = &routing["first_divergence"];
    assert!(first["logit_error"].is_null(), "{first:#}");
    let said = text(&run(&["diff", &reference, &shifted]));
    assert!(
        said.contains("the other's router-logit error unknown: no expert listed by both"),
        "{said}"
    );
    assert!(!said.contains("0.000e0"), "{said}");
    assert!(
        said.contains("layer 1: 8 tokens chose experts of which the other lists none"),
        "{said}"
    );
}

#[test]
fn softmax_router_logits_are_compared_up_to_a_shift_per_token() {
    let dir = scratch("routing-shift");
    // The reference records log-probabilities, the other raw logits and a wrong choice.
    let reference = write(
        &dir,
        "ref.ndjson",
        Run {
            log_probabilities: true,
            ..Run::default()
        },
    );
    let wrong = write(&dir, "wrong.ndjson", Run::wrong(&[(1, 2, 0)]));
    let (_, json) = diff_json(&[&reference, &wrong]);
    let routing = &json["routing"];
    assert_eq!(
        verdicts(routing),
        ["same", "same", "routing"],
        "{routing:#}"
    );
    assert_eq!(routing["divergences"], 1, "{routing:#}");
    assert_eq!(routing["near_ties"], 0, "{routing:#}");
}

#[test]
fn a_floor_with_only_near_ties_does_not_excuse_a_divergence() {
    let dir = scratch("routing-floor-ties");
    let reference = write(&dir, "ref.ndjson", Run::default());
    // A divergence in layer 1; the floor has one token differing there too, a near-tie.
    let other = write(&dir, "other.ndjson", Run::wrong(&[(0, 1, 3)]));
    let floor = write(
        &dir,
        "floor.ndjson",
        Run {
            noise: true,
            ..Run::default()
        },
    );
    let (_, json) = diff_json(&[&reference, &other, "--floor", &floor, "--rtol", NOISE_RTOL]);
    let layer = &json["routing"]["layers"][1];
    assert_eq!(layer["verdict"], "routing", "{layer:#}");
    assert_eq!(layer["floor"]["differing"], 1, "{layer:#}");
    assert_eq!(layer["floor"]["near_ties"], 1, "{layer:#}");
    assert_eq!(layer["floor"]["divergences"], 0, "{layer:#}");
    assert_eq!(layer["within_floor"], false, "{layer:#}");
    assert_eq!(layer["flagged"], true, "{layer:#}");
}

#[test]
fn router_logits_off_without_mlp_in_say_so_in_one_clause() {
    let dir = scratch("routing-no-mlp-in");
    let bare = Run {
        no_mlp_in: true,
        ..Run::default()
    };
    let reference = write(&dir, "ref.ndjson", bare);
    let off = Run {
        logits_off: Some(1),
        ..bare
    };
    let other = write(&dir, "off.ndjson", off);
    let said = text(&run(&["diff", &reference, &other]));
    assert!(
        said.contains(
            "rtol 1e-5), with mlp_in not traced (an inherited error cannot be ruled out): the \
             router's computation"
        ),
        "{said}"
    );
    assert!(!said.contains("): ("), "{said}");
}

#[test]
fn a_flagged_routing_layer_makes_diff_exit_1_and_near_ties_do_not() {
    let dir = scratch("routing-exit");
    let reference = write(&dir, "ref.ndjson", Run::default());
    let noisy = Run {
        noise: true,
        ..Run::default()
    };
    let tie = write(&dir, "tie.ndjson", noisy);
    let wrong = Run {
        wrong_choice: &[(1, 2, 0)],
        ..noisy
    };
    let wrong_path = write(&dir, "wrong.ndjson", wrong);
    // Near-ties only: not flagged, exit 0, the clean headline.
    let output = run(&["diff", &reference, &tie, "--rtol", NOISE_RTOL]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(text(&output).contains("no divergence: every matched tensor"));
    // A divergence: every tensor within, yet exit 1.
    let (code, json) = diff_json(&[&reference, &wrong_path, "--rtol", NOISE_RTOL]);
    assert!(json["first_divergence"].is_null(), "{json:#}");
    assert_eq!(code, Some(1));
    // Within a floor that has it: exit 0.
    let floor = write(&dir, "floor.ndjson", wrong);
    let (code, json) = diff_json(&[
        &reference,
        &wrong_path,
        "--rtol",
        NOISE_RTOL,
        "--floor",
        &floor,
    ]);
    assert_eq!(
        json["routing"]["layers"][2]["within_floor"], true,
        "{json:#}"
    );
    assert_eq!(code, Some(0));
}

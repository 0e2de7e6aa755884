//! The ranks of a run read together: a small model run pipeline-parallel (layers 0-1 on one
//! thread, 2-3 on another, each with its own session and file) reads as the same run on one
//! rank; tensor-parallel shards are compared rank to rank; files that are not the ranks of one
//! run are refused, naming them.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use model_trace::{trace_layer, trace_model, trace_tensor, ModelTracerConfig, Session};
use serde_json::Value;

use common::{run, scratch, text};

const LAYERS: usize = 4;
const WIDTH: usize = 32;
const PASSES: usize = 3;

/// A residual block: what each layer computes, wherever it runs.
#[trace_layer(index = index)]
fn block(x: &[f32], index: usize, scale: f32) -> Vec<f32> {
    let attn_out = attention(x, index, scale);
    trace_tensor!("attn_out", &attn_out);
    let mlp_out = mlp(&attn_out);
    trace_tensor!("mlp_out", &mlp_out);
    x.iter().zip(&mlp_out).map(|(a, b)| a + b).collect()
}

/// The block, unrecorded.
fn plain_block(x: &[f32], index: usize, scale: f32) -> Vec<f32> {
    let mlp_out = mlp(&attention(x, index, scale));
    x.iter().zip(&mlp_out).map(|(a, b)| a + b).collect()
}

fn attention(x: &[f32], index: usize, scale: f32) -> Vec<f32> {
    x.iter()
        .enumerate()
        .map(|(i, v)| (v * scale + (i + index) as f32 * 0.01).tanh())
        .collect()
}

fn mlp(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * 0.5 - 0.1).collect()
}

fn embed(position: usize) -> Vec<f32> {
    (0..WIDTH)
        .map(|i| ((i + position) as f32 * 0.37).sin())
        .collect()
}

/// The whole model on one rank.
#[trace_model(position = position)]
fn forward(position: usize) -> Vec<f32> {
    let mut x = embed(position);
    for layer in 0..LAYERS {
        x = block(&x, layer, 1.0);
    }
    x
}

/// One pipeline stage: `layers` of the model, from `x` (the embedding on the first stage).
#[trace_model(position = position)]
fn stage(x: Vec<f32>, layers: std::ops::Range<usize>, position: usize) -> Vec<f32> {
    layers.fold(x, |x, layer| block(&x, layer, 1.0))
}

fn one_rank(path: &Path) {
    let session = Session::builder(ModelTracerConfig::lightweight())
        .trace_file(path)
        .start()
        .unwrap();
    for position in 0..PASSES {
        forward(position);
    }
    session.finish();
}

/// The model on two threads, ranks 0 and 1 of a run, handing the hidden state on by channel.
fn two_ranks(path: &Path, run_id: &str) {
    let (to_second, from_first) = mpsc::channel::<Vec<f32>>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let session = Session::builder(ModelTracerConfig::lightweight())
                .trace_file(path)
                .rank(0, 2)
                .run(run_id)
                .start()
                .unwrap();
            for position in 0..PASSES {
                let x = stage(embed(position), 0..LAYERS / 2, position);
                to_second.send(x).unwrap();
            }
            session.finish();
        });
        scope.spawn(move || {
            let session = Session::builder(ModelTracerConfig::lightweight())
                .trace_file(path)
                .rank(1, 2)
                .run(run_id)
                .start()
                .unwrap();
            for position in 0..PASSES {
                let x = from_first.recv().unwrap();
                stage(x, LAYERS / 2..LAYERS, position);
            }
            session.finish();
        });
    });
}

fn json(args: &[&str]) -> Value {
    let output = run(args);
    assert!(output.status.code() != Some(2), "{}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output)))
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_pipeline_run_reads_as_the_same_run_on_one_rank() {
    let dir = scratch("pipeline");
    let single = dir.join("single.ndjson");
    one_rank(&single);
    let ranks = dir.join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    let pipeline = ranks.join("pipe.ndjson");
    two_ranks(&pipeline, "pipeline-test");
    assert!(ranks.join("pipe.rank0.ndjson").is_file());
    assert!(ranks.join("pipe.rank1.ndjson").is_file());

    // The run by its stem, by its directory and by its files: nothing differs, nothing is
    // unmatched, every tensor is bit-identical.
    let rank_files = [
        ranks.join("pipe.rank0.ndjson"),
        ranks.join("pipe.rank1.ndjson"),
    ];
    for other in [&pipeline, &ranks] {
        let output = run(&["diff", path_str(&single), path_str(other), "--json"]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
        let diff: Value = serde_json::from_slice(&output.stdout).unwrap();
        let matched = diff["compared"]["matched"].as_u64().unwrap();
        // Per pass and layer: input, attn_out, mlp_out, output.
        assert_eq!(matched, (PASSES * LAYERS * 4) as u64, "{diff}");
        assert_eq!(diff["compared"]["bit_identical"], matched, "{diff}");
        assert_eq!(diff["missing_count"], 0, "{diff}");
        assert_eq!(diff["extra_count"], 0, "{diff}");
        assert_eq!(diff["other"]["ranks"], 2, "{diff}");
        assert_eq!(diff["passes"].as_array().unwrap().len(), PASSES, "{diff}");
    }
    let output = run(&["diff", path_str(&rank_files[1]), path_str(&single)]);
    // Rank 1 alone as the reference: its layers match, and the single run has more.
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(
        text(&output).contains(&format!("{} only in the other", PASSES * 2 * 4)),
        "{}",
        text(&output)
    );
    assert!(
        text(&output).contains("no file for rank 0 of the run's 2 ranks"),
        "{}",
        text(&output)
    );

    // The summary of the run is the one-rank summary: passes, layers and their statistics.
    let one = json(&["summary", path_str(&single), "--json"]);
    let both = json(&["summary", path_str(&ranks), "--json"]);
    assert_eq!(
        both["summary"]["total_forwards"], one["summary"]["total_forwards"],
        "{both}"
    );
    assert_eq!(one["summary"]["total_forwards"], PASSES);
    assert_eq!(
        both["summary"]["layers_per_pass"],
        one["summary"]["layers_per_pass"]
    );
    assert_eq!(
        both["summary"]["anomalies_detected"],
        one["summary"]["anomalies_detected"]
    );
    let rows = |summary: &Value| -> Vec<(Value, Value, Value, Value)> {
        summary["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                (
                    row["layer"].clone(),
                    row["calls"].clone(),
                    row["mean_sum"].clone(),
                    row["l2_sum"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(rows(&both), rows(&one));
    assert_eq!(rows(&one).len(), LAYERS);
    assert_eq!(both["files"].as_array().unwrap().len(), 2, "{both}");

    let listed = text(&run(&[
        "list",
        path_str(&rank_files[0]),
        path_str(&rank_files[1]),
    ]));
    for expected in [
        "run pipeline-test: 2 of 2 ranks",
        &format!("passes: {PASSES} (positions 0, 1, 2)"),
        &format!("layer {}", PASSES * LAYERS),
        &format!("pass_begin {PASSES}"),
    ] {
        assert!(listed.contains(expected), "{expected:?} not in\n{listed}");
    }

    // One timeline: each rank's layers on its own track, named by its rank.
    let timeline = dir.join("timeline.json");
    let output = run(&["chrome", path_str(&ranks), "-o", path_str(&timeline)]);
    assert!(output.status.success(), "{}", text(&output));
    let timeline: Value =
        serde_json::from_str(&std::fs::read_to_string(timeline).unwrap()).unwrap();
    let events = timeline["traceEvents"].as_array().unwrap();
    let thread_names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(
        thread_names.iter().any(|n| n.starts_with("rank 0: "))
            && thread_names.iter().any(|n| n.starts_with("rank 1: ")),
        "{thread_names:?}"
    );
    let layer_tracks = |layers: std::ops::Range<usize>| -> Vec<Value> {
        let mut tids: Vec<Value> = events
            .iter()
            .filter(|e| e["cat"] == "layer")
            .filter(|e| {
                let name = e["name"].as_str().unwrap_or("");
                layers.clone().any(|layer| name == format!("layer {layer}"))
            })
            .map(|e| e["tid"].clone())
            .collect();
        tids.dedup();
        tids
    };
    let (first, second) = (
        layer_tracks(0..LAYERS / 2),
        layer_tracks(LAYERS / 2..LAYERS),
    );
    assert_eq!((first.len(), second.len()), (1, 1), "{first:?} {second:?}");
    assert_ne!(first, second);
}

/// Layer 0 split in two halves, each rank computing and recording its own; then rank 0
/// records layer 1 whole, on the gathered output of layer 0.
#[trace_model(position = position)]
fn sharded(rank: usize, position: usize, scale: f32) {
    let x = embed(position);
    let half = &x[rank * WIDTH / 2..(rank + 1) * WIDTH / 2];
    block(half, 0, scale);
    if rank == 0 {
        block(&plain_block(&x, 0, 1.0), 1, 1.0);
    }
}

fn tensor_parallel(path: &Path, run_id: &str, rank_one_scale: f32) {
    std::thread::scope(|scope| {
        for rank in 0..2 {
            scope.spawn(move || {
                let session = Session::builder(ModelTracerConfig::lightweight())
                    .trace_file(path)
                    .rank(rank, 2)
                    .run(run_id)
                    .start()
                    .unwrap();
                let scale = if rank == 1 { rank_one_scale } else { 1.0 };
                for position in 0..PASSES {
                    sharded(rank, position, scale);
                }
                session.finish();
            });
        }
    });
}

#[test]
fn shards_are_compared_rank_to_rank() {
    let dir = scratch("shards");
    let reference = dir.join("reference.ndjson");
    let other = dir.join("other.ndjson");
    tensor_parallel(&reference, "tp-reference", 1.0);
    tensor_parallel(&other, "tp-other", 1.5);
    let output = run(&["diff", path_str(&reference), path_str(&reference), "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let same: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(same["compared"]["matched"], PASSES * (2 * 4 + 4), "{same}");
    let output = run(&["diff", path_str(&reference), path_str(&other)]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        text(&output).contains("first divergence: pass 0, layer 0, attn_out (rank 1's shard)"),
        "{}",
        text(&output)
    );
    // A shard is never compared with a whole tensor; the gathered layer 1 is.
    let whole = dir.join("whole.ndjson");
    one_rank(&whole);
    let output = run(&["diff", path_str(&whole), path_str(&reference), "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let diff: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(diff["compared"]["matched"], PASSES * 4, "{diff}");
    assert_eq!(diff["compared"]["bit_identical"], PASSES * 4, "{diff}");
    let extra = diff["extra"].as_array().unwrap();
    assert!(
        extra.iter().any(|u| u["shard"] == 1) && extra.iter().any(|u| u["shard"] == 0),
        "{diff}"
    );
    assert!(
        extra
            .iter()
            .all(|u| u["layer"] == 0 && !u["shard"].is_null()),
        "{diff}"
    );
}

#[test]
fn files_that_are_not_ranks_of_one_run_are_refused() {
    let dir = scratch("not-a-run");
    let mixed = dir.join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    two_ranks(&mixed.join("a.ndjson"), "run-a");
    tensor_parallel(&mixed.join("b.ndjson"), "run-b", 1.0);
    let output = run(&["summary", path_str(&mixed)]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    let said = text(&output);
    assert!(
        said.contains("belong to 2 runs")
            && said.contains("run run-a: ")
            && said.contains("run run-b: "),
        "{said}"
    );

    let single = dir.join("single.ndjson");
    one_rank(&single);
    let output = run(&[
        "list",
        path_str(&single),
        path_str(&mixed.join("a.rank0.ndjson")),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));

    let nothing: PathBuf = dir.join("nothing.ndjson");
    let output = run(&["list", path_str(&nothing)]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(
        text(&output).contains("nothing.rank*.ndjson"),
        "{}",
        text(&output)
    );
}

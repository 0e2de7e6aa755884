//! `diff` by position: two traces of one model that computed the same tokens in other passes
//! (one pass against a prefill and decode steps; a batch against each prompt alone) are lined
//! up row by row from their row summaries, by themselves when their passes differ; a cache bug
//! is named at its position, layer and stage; traces without rows are an error that says so.

mod common;

use std::path::Path;

use model_trace::{
    trace_layer, trace_model, trace_tensor, ModelTracerConfig, Precision, Session, SessionBuilder,
    TensorRef,
};

use common::{run, scratch, text};

const WIDTH: usize = 8;

/// A model whose layers mix each row with the mean of the rows before it in the same sequence
/// (its cache), like attention; `stale` leaves a decode step's newest cached row out.
struct Model {
    cache: Vec<Vec<Vec<Vec<f32>>>>,
    stale: bool,
}

impl Model {
    fn new(stale: bool) -> Self {
        Self {
            cache: Vec::new(),
            stale,
        }
    }

    #[trace_model(position = column, tokens = ids)]
    fn forward(&mut self, ids: &[u32], batch: usize, padding: &[usize], column: usize) {
        let seq = ids.len() / batch;
        self.cache.resize(2, vec![Vec::new(); batch]);
        let mut x: Vec<f32> = ids
            .iter()
            .flat_map(|&id| (0..WIDTH).map(move |i| ((id as usize * 7 + i) as f32 * 0.3).sin()))
            .collect();
        for layer in 0..2 {
            x = self.block(layer, &x, batch, seq, padding, column);
        }
    }

    #[trace_layer(index = layer)]
    fn block(
        &mut self,
        layer: usize,
        x: &[f32],
        batch: usize,
        seq: usize,
        padding: &[usize],
        column: usize,
    ) -> Vec<f32> {
        let mut mixed = Vec::with_capacity(x.len());
        for (r, row) in x.chunks(WIDTH).enumerate() {
            let (b, c) = (r / seq, column + r % seq);
            let cache = &mut self.cache[layer][b];
            cache.truncate(c);
            cache.push(row.to_vec());
            let visible = if self.stale && seq == 1 && c > 0 {
                &cache[padding[b]..c]
            } else {
                &cache[padding[b].min(c)..]
            };
            for i in 0..WIDTH {
                let mean = visible.iter().map(|k| k[i]).sum::<f32>() / visible.len() as f32;
                mixed.push(row[i] + 0.5 * mean);
            }
        }
        trace_tensor!(
            "mix",
            &TensorRef::new(&mixed, &[batch, seq, WIDTH]).unwrap()
        );
        mixed.iter().map(|v| v.tanh()).collect()
    }
}

const IDS: [u32; 12] = [3, 14, 15, 9, 2, 6, 5, 35, 8, 97, 9, 32];

/// Writes what `run` records into `dir/name`, rows summarised when `rows`.
fn write(dir: &Path, name: &str, rows: bool, run: impl FnOnce()) -> String {
    write_with(dir, name, rows, |builder| builder, run)
}

/// [`write`], the session's builder finished by `configure`.
fn write_with(
    dir: &Path,
    name: &str,
    rows: bool,
    configure: impl FnOnce(SessionBuilder) -> SessionBuilder,
    run: impl FnOnce(),
) -> String {
    let path = dir.join(name);
    let config = ModelTracerConfig {
        row_summaries: rows,
        ..ModelTracerConfig::lightweight()
    };
    let session = configure(Session::builder(config).trace_file(&path))
        .start()
        .expect("the trace file can be created");
    run();
    session.finish();
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// IDS in one pass, and as a prefill of `prefill` and one token a pass.
fn whole_and_split(dir: &Path, stale: bool, rows: bool) -> (String, String) {
    let whole = write(dir, "whole.ndjson", rows, || {
        Model::new(false).forward(&IDS, 1, &[0], 0)
    });
    let split = write(dir, "split.ndjson", rows, || {
        let mut model = Model::new(stale);
        model.forward(&IDS[..8], 1, &[0], 0);
        for (i, id) in IDS[8..].iter().enumerate() {
            model.forward(&[*id], 1, &[0], 8 + i);
        }
    });
    (whole, split)
}

#[test]
fn a_prefill_and_decode_steps_are_lined_up_with_one_pass_by_themselves() {
    let dir = scratch("by-position-clean");
    let (whole, split) = whole_and_split(&dir, false, true);
    let output = run(&["diff", &whole, &split]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(0), "{out}");
    assert!(out.contains("by position: 5 passes of"), "{out}");
    assert!(out.contains("against 1 of"), "{out}");
    assert!(out.contains("24 row pairs compared"), "{out}");
    assert!(out.contains("no row past tolerance"), "{out}");
}

#[test]
fn a_stale_cache_row_is_named_at_its_first_decode_position() {
    let dir = scratch("by-position-stale");
    let (whole, split) = whole_and_split(&dir, true, true);
    let output = run(&["diff", &whole, &split]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains("first past tolerance: position 8 layer 0 stage mix"),
        "{out}"
    );
    let output = run(&["diff", &whole, &split, "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["mode"], "by_position");
    assert_eq!(report["first"]["place"]["position"], 8);
    assert_eq!(report["first"]["passes"], serde_json::json!([0, 1]));
}

#[test]
fn a_divergence_of_quantized_runs_notes_the_floor_their_header_states() {
    let dir = scratch("by-position-quantized");
    let note = "note: the header says the weights are quantized";
    // The header's structured precision first, then its dtype text.
    let cases = [
        (Some(Precision::quantized(["Q4_K"])), None, true),
        (None, Some("Q4_1 and Q8_0 weights, f32 activations"), true),
        (
            Some(Precision::quantized(["Q4_K"]).dequantized_to("F32")),
            Some("Q4_1 weights"),
            false,
        ),
        (None, Some("f32 weights dequantized from Q4_1"), false),
    ];
    for (at, (precision, dtype, noted)) in cases.into_iter().enumerate() {
        let header = |mut builder: SessionBuilder| {
            if let Some(precision) = precision.clone() {
                builder = builder.precision(precision);
            }
            if let Some(dtype) = dtype {
                builder = builder.dtype(dtype);
            }
            builder
        };
        let whole = write_with(&dir, &format!("whole{at}.ndjson"), true, header, || {
            Model::new(false).forward(&IDS, 1, &[0], 0)
        });
        let split = write_with(&dir, &format!("split{at}.ndjson"), true, header, || {
            let mut model = Model::new(true);
            model.forward(&IDS[..8], 1, &[0], 0);
            model.forward(&IDS[8..9], 1, &[0], 8);
        });
        let output = run(&["diff", &whole, &split]);
        let out = text(&output);
        assert_eq!(output.status.code(), Some(1), "{out}");
        assert_eq!(out.contains(note), noted, "case {at}: {out}");
    }
}

#[test]
fn each_batch_row_is_compared_with_its_prompt_alone() {
    let dir = scratch("by-position-batch");
    let prompts: [&[u32]; 2] = [&IDS[..6], &IDS[2..5]];
    let alone: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            write(&dir, &format!("alone{i}.ndjson"), true, || {
                let mut model = Model::new(false);
                model.forward(prompt, 1, &[0], 0);
                model.forward(&[40 + i as u32], 1, &[0], prompt.len());
            })
        })
        .collect();
    let batch = write(&dir, "batch.ndjson", true, || {
        let mut model = Model::new(false);
        let mut ids = prompts[0].to_vec();
        ids.extend([0, 0, 0]);
        ids.extend(prompts[1]);
        model.forward(&ids, 2, &[0, 3], 0);
        model.forward(&[40, 41], 2, &[0, 3], 6);
    });
    let output = run(&["diff", &alone[0], &alone[1], "--batch", &batch, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["mode"], "batch");
    let shifts: Vec<u64> = (report["pairings"].as_array().unwrap().iter())
        .map(|p| p["shift"].as_u64().unwrap())
        .collect();
    assert_eq!(shifts, [0, 3]);
    // (6 + 1) + (3 + 1) positions, two layers: the padding's 3 columns are left out.
    assert_eq!(report["compared"], 22);
    assert_eq!(report["bit_identical"], 22);
}

#[test]
fn traces_without_rows_are_compared_pass_by_pass_unless_asked_otherwise() {
    let dir = scratch("by-position-no-rows");
    let (whole, split) = whole_and_split(&dir, false, false);
    let output = run(&["diff", &whole, &split]);
    assert!(!text(&output).contains("by position"), "{}", text(&output));
    let output = run(&["diff", &whole, &split, "--by-position"]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(2), "{out}");
    assert!(out.contains("has no row summaries"), "{out}");
    let output = run(&["diff", &whole, &split, &whole]);
    let out = text(&output);
    assert_eq!(output.status.code(), Some(2), "{out}");
    assert!(out.contains("with --batch BATCH"), "{out}");
}

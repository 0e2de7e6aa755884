//! The `gemma3` program traced to a file, one prompt pass (`--max-tokens 1`) a run, each a
//! process of its own so that an environment variable or an injected bug is its alone:
//!
//! - what the header says the port computed in (`metadata.precision`), for `model-trace diff` to
//!   choose its tolerance by: the GGUF's types quantized, F32 dequantized from them with
//!   `--dequantize` or candle's `CANDLE_DEQUANTIZE_ALL=1`, and quantization records only where
//!   a matmul is quantized;
//! - `rms-eps@LAYER` changes that layer and none before it.
//!
//! Missing weights fail the tests: run `scripts/fetch-models` first.
#![cfg(feature = "trace")]

#[path = "../../shared/traced_run.rs"]
mod traced_run;

use std::sync::OnceLock;
use traced_run::{Modes, TracedRun};

/// One prompt pass of `gemma3` in each mode. Gemma 3 270M's Q4_K_M file: Q4_K, Q5_0, Q6_K
/// matmuls and the tied Q8_0 head, 7 matmuls in each of 18 blocks; 11 tensors a layer (input,
/// 9 stages, output).
static GEMMA3: Modes = Modes {
    program: env!("CARGO_BIN_EXE_gemma3"),
    args: &["--max-tokens", "1"],
    prompt: "The capital of France is",
    types: &["Q4_K", "Q5_0", "Q6_K", "Q8_0"],
    matmuls: 7 * 18 + 1,
    tensors: 11 * 18 + 1,
    quantized: OnceLock::new(),
    dequantized: OnceLock::new(),
};

#[test]
fn a_quantized_run_records_the_files_types_and_the_quantization_error() {
    GEMMA3.check_quantized();
}

#[test]
fn a_dequantize_run_records_f32_weights_and_no_quantization_error() {
    GEMMA3.check_dequantized();
}

#[test]
fn candle_dequantize_all_is_recorded_as_such_and_computes_what_dequantize_does() {
    GEMMA3.check_candle_dequantize_all();
}

/// Llama's RMS epsilon (1e-5) in layer 7's norms: the layers before it bit for bit the clean
/// run's, and layer 7's input too; its post-MLP norm moves, whose input (`mlp_out`) has a mean
/// square near the epsilon on some rows (its norm by 8.6% here; the tensor by 7.4% on the
/// README's 55-token prompt, dequantized).
#[test]
fn rms_eps_at_a_layer_changes_that_layer_and_none_before_it() {
    const LAYER: usize = 7;
    let clean = GEMMA3.dequantized();
    let bugged = GEMMA3.run(
        "rms-eps",
        &["--dequantize", "--inject-bug", "rms-eps@7"],
        &[],
    );
    let (before, after) = (clean.fingerprints(), bugged.fingerprints());
    assert_eq!(before.len(), after.len());
    for (clean, bugged) in before.iter().zip(&after) {
        let (_, layer, stage, _) = clean;
        if *layer < LAYER || (*layer, stage.as_str()) == (LAYER, "input") {
            assert!(clean == bugged, "layer {layer} {stage} differs");
        }
    }
    let norm = |run: &TracedRun| {
        let tensor = run
            .stage(0, LAYER, "mlp_post_norm")
            .expect("layer 7's mlp_post_norm");
        tensor.stats.l2_norm
    };
    // A lower bound on the relative L2 change: |‖b‖ − ‖a‖| ≤ ‖b − a‖.
    let moved = (norm(&bugged) - norm(clean)).abs() / norm(clean);
    eprintln!("rms-eps@7 moves layer 7's mlp_post_norm norm by {moved:.3e}");
    assert!(moved > 1e-3, "{moved}");
}

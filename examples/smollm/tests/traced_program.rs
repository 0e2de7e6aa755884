//! The `smollm` program traced to a file, one prompt pass (`--max-tokens 1`) a run, each a
//! process of its own so that an environment variable is its alone: what the header says the
//! port computed in (`metadata.precision`), for `model-trace diff` to choose its tolerance by:
//! the GGUF's types quantized, F32 dequantized from them with `--dequantize` or candle's
//! `CANDLE_DEQUANTIZE_ALL=1`, and quantization records only where a matmul is quantized.
//! Missing weights fail the tests: run `scripts/fetch-models` first.
#![cfg(feature = "trace")]

#[path = "../../shared/traced_run.rs"]
mod traced_run;

use std::sync::OnceLock;
use traced_run::Modes;

/// One prompt pass of `smollm` in each mode, everything traced. SmolLM2-135M's Q4_1 file:
/// Q4_1 matmuls and the tied Q8_0 head, 7 matmuls in each of 30 blocks; 7 tensors a layer
/// (input, 5 stages, output).
static SMOLLM: Modes = Modes {
    program: env!("CARGO_BIN_EXE_smollm"),
    args: &["--max-tokens", "1", "--trace", "full"],
    prompt: "The capital of France is",
    types: &["Q4_1", "Q8_0"],
    matmuls: 7 * 30 + 1,
    tensors: 7 * 30 + 1,
    quantized: OnceLock::new(),
    dequantized: OnceLock::new(),
};

#[test]
fn a_quantized_run_records_the_files_types_and_the_quantization_error() {
    SMOLLM.check_quantized();
}

#[test]
fn a_dequantize_run_records_f32_weights_and_no_quantization_error() {
    SMOLLM.check_dequantized();
}

#[test]
fn candle_dequantize_all_is_recorded_as_such_and_computes_what_dequantize_does() {
    SMOLLM.check_candle_dequantize_all();
}

/// `CANDLE_DEQUANTIZE_ALL_F16=1`: candle multiplies by f16 weights (and rounds the matmuls'
/// inputs to f16).
#[test]
fn candle_dequantize_all_f16_is_recorded_as_f16_weights() {
    let run = SMOLLM.run("candle-f16", &[], &[("CANDLE_DEQUANTIZE_ALL_F16", "1")]);
    run.assert_precision(
        &["F16"],
        SMOLLM.types,
        "the port, CANDLE_DEQUANTIZE_ALL_F16=1",
    );
    assert_eq!(run.quant_events(), 0);
    assert!(run.fingerprints() != SMOLLM.dequantized().fingerprints());
}

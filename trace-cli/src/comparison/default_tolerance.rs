//! The tolerance a comparison uses when the user gives none (no `--rtol`, `--atol` or
//! `--check-error-stat`): chosen from the pair of precisions the two traces' headers state
//! (`metadata.precision`; an older trace's `metadata.dtype` text as a hint), and said with its
//! reason.
//!
//! | the two headers say | criterion | atol | rtol |
//! |---|---|---|---|
//! | F32 weights on both sides, neither quantized (a port on weights dequantized to F32 against transformers' F32) | norm | [`SAME_FLOAT_ATOL`] | [`SAME_FLOAT_RTOL`] |
//! | the same, one side llama.cpp (its F32 GELU rounds through an f16 table) | norm | [`SAME_FLOAT_ATOL`] | [`LLAMA_CPP_FLOAT_RTOL`] |
//! | quantized weights on either side (not both the same types in the same implementation) | norm | [`QUANTIZED_ATOL`] | [`QUANTIZED_RTOL`] |
//! | floats of other types (F32 against BF16), other activations or KV caches (F16), F32 dequantized from other types, the same quantized weights in the same implementation: not measured, or no noise to allow | elementwise | 1e-5 | 1e-5 |
//! | nothing (a header without its precision) | elementwise | 1e-5 | 1e-5 |
//!
//! Any of the three flags given, the flags decide and nothing is chosen.

use serde::Serialize;
use trace_runtime::compare::{ErrorStat, Tolerance, Tolerances};
use trace_runtime::{Precision, TraceHeader};

use crate::precision::WeightsSaid;

/// rtol of two runs on the same F32 weights (norm criterion): what separates them is float
/// rounding. Measured (`python/benchmarks/precision_floors.py`: a 600-token prompt pass, every
/// tensor captured, the worst of any layer tensor): our dequantized ports against transformers
/// on the same GGUF's weights, SmolLM2 8.8e-6 (its logits; its layers 3.3e-6 at most), Gemma 3
/// 3.2e-6; candle-transformers' own Gemma 3 under `CANDLE_DEQUANTIZE_ALL=1` agrees with
/// transformers to 1.7e-6 wherever its bugs do not reach.
pub(crate) const SAME_FLOAT_RTOL: f64 = 1e-4;

/// rtol of two runs on the same F32 weights when one of them is llama.cpp (its writer says
/// `source: llama.cpp`): ggml's CPU GELU rounds its f32 input to f16 and reads the result from
/// a table (`GGML_GELU_FP16`, defined unconditionally in `ggml-cpu/vec.h`), a relative error
/// of up to 2⁻¹¹ on every GELU. Measured: llama.cpp on an F32 GGUF written from Gemma 3 270M's
/// against our port on the same dequantized weights, 1.5e-4 to 5.8e-4 (worst stage of a
/// layer); SmolLM2 (SiLU, computed in f32) 3.0e-5.
pub(crate) const LLAMA_CPP_FLOAT_RTOL: f64 = 1e-3;

/// atol of two runs on the same F32 weights: none. Float rounding is relative, and an atol of
/// 1e-5 (RMS) would let a tensor whose RMS is under 0.1 carry more than rtol of error: exact
/// GELU in Gemma 3's layer 14 moves `mlp_out` (RMS 0.058) by 1.7e-4 of it, which atol 1e-5
/// lets pass. Measured at atol 0: the clean dequantized SmolLM2 and Gemma 3 ports, and
/// llama.cpp F32, are named nowhere over a 600-token prompt.
pub(crate) const SAME_FLOAT_ATOL: f64 = 0.0;

/// rtol of a run on quantized weights against one on floats, or on other quantized weights
/// (norm criterion): the quantization's noise. Measured on prompt passes, the worst tensor of
/// the run: our clean Gemma 3 port (Q4_K_M) 13.1% from transformers, our SmolLM2 port (Q4_1)
/// 8.5%. Decode passes go further: see [`QUANTIZED_NOTE`].
pub(crate) const QUANTIZED_RTOL: f64 = 0.15;

/// atol of a quantized comparison: an RMS error this small passes whatever the tensor's scale
/// (near-zero tensors, where a relative error means nothing), the built-in default.
pub(crate) const QUANTIZED_ATOL: f64 = 1e-5;

/// What the quantized default does not cover (measured: our clean Gemma 3 port's one-token
/// decode passes reach 31% on one tensor).
const QUANTIZED_NOTE: &str = "decode passes can go further (31% measured on Gemma 3's \
     one-token passes): use --isolated, --floor, or runs on dequantized weights (candle: \
     CANDLE_DEQUANTIZE_ALL=1; the examples' --dequantize)";

/// Which rule set the tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToleranceRule {
    /// `--rtol`, `--atol` or `--check-error-stat` given: they decide.
    Given,
    /// Both sides on F32 weights (see [`SAME_FLOAT_RTOL`]).
    SameFloatWeights,
    /// Both sides on F32 weights, one of them llama.cpp (see [`LLAMA_CPP_FLOAT_RTOL`]).
    SameFloatWeightsLlamaCpp,
    /// Quantized weights on either side (see [`QUANTIZED_RTOL`]).
    Quantized,
    /// Precisions stated but no measured default for the pair (other float types, other
    /// activations, a KV cache of another type, F32 dequantized from other types) or no noise
    /// to allow (the same quantized weights in the same implementation): the built-in default.
    NoMeasuredDefault,
    /// A header that does not say its precision: the built-in default.
    PrecisionUnknown,
}

/// The tolerance chosen for a comparison, and why (`diff --json`: `tolerance_choice`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ToleranceChoice {
    pub(crate) rule: ToleranceRule,
    /// Why, in a sentence.
    pub(crate) reason: String,
    /// What the reference's header says (`metadata.precision`); `null` where it says nothing
    /// structured (or the tolerance was given).
    pub(crate) reference_precision: Option<Precision>,
    /// What the other trace's header says, likewise.
    pub(crate) other_precision: Option<Precision>,
    /// What the chosen tolerance does not cover; `null` where nothing needs saying.
    pub(crate) note: Option<&'static str>,
}

impl ToleranceChoice {
    /// The tolerance given on the command line.
    pub(crate) fn given() -> Self {
        Self {
            rule: ToleranceRule::Given,
            reason: "given (--rtol, --atol, --check-error-stat)".to_owned(),
            reference_precision: None,
            other_precision: None,
            note: None,
        }
    }

    /// The rule the two headers' precisions call for.
    pub(crate) fn from_headers(reference: &TraceHeader, other: &TraceHeader) -> Self {
        let sides = [WeightsSaid::of(reference), WeightsSaid::of(other)];
        let (rule, reason) = rule_for(&sides);
        let [reference, other] = sides;
        Self {
            rule,
            reason,
            reference_precision: reference.precision().cloned(),
            other_precision: other.precision().cloned(),
            note: (rule == ToleranceRule::Quantized).then_some(QUANTIZED_NOTE),
        }
    }

    /// Sets the default tolerance and criterion of `tolerances` as the rule says (the
    /// built-in default and given flags are left as they are).
    pub(crate) fn apply(&self, tolerances: &mut Tolerances) {
        let (atol, rtol) = match self.rule {
            ToleranceRule::SameFloatWeights => (SAME_FLOAT_ATOL, SAME_FLOAT_RTOL),
            ToleranceRule::SameFloatWeightsLlamaCpp => (SAME_FLOAT_ATOL, LLAMA_CPP_FLOAT_RTOL),
            ToleranceRule::Quantized => (QUANTIZED_ATOL, QUANTIZED_RTOL),
            _ => return,
        };
        tolerances.default = Tolerance { atol, rtol };
        tolerances.error_stat = ErrorStat::Norm;
    }

    /// Whether the tolerance assumes both runs computed on the same float weights.
    pub(crate) fn assumes_same_weights(&self) -> bool {
        matches!(
            self.rule,
            ToleranceRule::SameFloatWeights | ToleranceRule::SameFloatWeightsLlamaCpp
        )
    }
}

/// The rule for the two sides (the reference's, the other's), and why.
fn rule_for(sides: &[WeightsSaid; 2]) -> (ToleranceRule, String) {
    let labels = ["the reference", "the other"];
    let unsaid: Vec<&str> = (labels.iter().zip(sides))
        .filter(|(_, side)| !side.says_something())
        .map(|(label, _)| *label)
        .collect();
    if !unsaid.is_empty() {
        let whose = match unsaid.as_slice() {
            [one] => format!("{one}'s header does not say its precision"),
            _ => "the headers do not say their precision".to_owned(),
        };
        let reason = format!("{whose} (metadata.precision): the built-in default");
        return (ToleranceRule::PrecisionUnknown, reason);
    }
    if sides.iter().any(WeightsSaid::is_quantized) {
        return quantized_rule(sides, labels);
    }
    floats_rule(sides)
}

/// The rule for two sides of which at least one says its weights are quantized: the
/// quantization's noise, unless both are the same quantized weights in the same
/// implementation (two runs of one port: a refactor, a batch, another thread count), between
/// which there is none.
fn quantized_rule(sides: &[WeightsSaid; 2], labels: [&str; 2]) -> (ToleranceRule, String) {
    let [a, b] = sides;
    let same_types = a.quantized_types() == b.quantized_types();
    if a.is_quantized() && b.is_quantized() && same_types && a.source() == b.source() {
        let reason = format!(
            "the same quantized weights in the same implementation ({}; {}): no quantization \
             noise between them: the built-in default",
            a.describe(),
            b.describe()
        );
        return (ToleranceRule::NoMeasuredDefault, reason);
    }
    let quantized: Vec<String> = (labels.iter().zip(sides))
        .filter(|(_, side)| side.is_quantized())
        .map(|(label, side)| format!("{label}: {}", side.describe()))
        .collect();
    let reason = format!(
        "quantized weights ({}): the quantization's noise; measured up to 13.1% on one \
         tensor of Gemma 3's prompt pass, 8.5% of SmolLM2's",
        quantized.join("; ")
    );
    (ToleranceRule::Quantized, reason)
}

/// The rule for two sides that both say their weights are floats (or say something else
/// that is not a quantized type).
fn floats_rule(sides: &[WeightsSaid; 2]) -> (ToleranceRule, String) {
    let described = || format!("{}; {}", sides[0].describe(), sides[1].describe());
    let no_default = |pair: String| {
        let reason = format!(
            "no measured default for {pair} ({}): the built-in default; give --rtol",
            described()
        );
        (ToleranceRule::NoMeasuredDefault, reason)
    };
    let (Some(a), Some(b)) = (sides[0].float(), sides[1].float()) else {
        return no_default("these weights".to_owned());
    };
    if a != b || a != "F32" {
        return no_default(format!("{a} weights against {b}"));
    }
    let from = sides.each_ref().map(WeightsSaid::dequantized_from);
    if !from[0].is_empty() && !from[1].is_empty() && from[0] != from[1] {
        let pair = format!(
            "F32 weights dequantized from other types ({} against {}), so not the same weights",
            from[0].join(", "),
            from[1].join(", ")
        );
        return no_default(pair);
    }
    let not_f32 = |said: [Option<String>; 2]| said.into_iter().flatten().find(|t| t != "F32");
    if let Some(dtype) = not_f32(sides.each_ref().map(WeightsSaid::activations)) {
        return no_default(format!("F32 weights with {dtype} activations"));
    }
    // A KV cache of another type rounds what attention reads (measured: llama.cpp's F16 cache
    // puts SmolLM2 1e-3 from the same weights' F32 run).
    if let Some(dtype) = not_f32(sides.each_ref().map(WeightsSaid::kv_cache)) {
        return no_default(format!("F32 weights with a KV cache in {dtype}"));
    }
    if sides.iter().any(WeightsSaid::is_llama_cpp) {
        let reason = format!(
            "the same float weights, one side llama.cpp ({}): float rounding, and llama.cpp's \
             GELU rounded through an f16 table; measured up to 5.8e-4 (Gemma 3)",
            described()
        );
        return (ToleranceRule::SameFloatWeightsLlamaCpp, reason);
    }
    let reason = format!(
        "the same float weights ({}): float rounding; measured up to 8.8e-6 (SmolLM2, Gemma 3 \
         ports against transformers, 600 positions)",
        described()
    );
    (ToleranceRule::SameFloatWeights, reason)
}

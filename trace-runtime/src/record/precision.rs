//! What a run computed in: the types of its weights as the matmuls read them, of its
//! activations and of its KV cache (the header's `metadata.precision`). `model-trace diff`
//! chooses its default tolerance from the two traces' precisions: two runs on the same
//! float weights agree to float rounding, a run on quantized weights only to the quantization's
//! noise.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::QuantType;

/// The environment variable that makes candle's `QMatMul::from_arc` dequantize every quantized
/// weight to f32 (any value but empty or `0`, as candle reads it).
pub const CANDLE_DEQUANTIZE_ALL: &str = "CANDLE_DEQUANTIZE_ALL";

/// The same, to f16 (read by candle after [`CANDLE_DEQUANTIZE_ALL`], which wins).
pub const CANDLE_DEQUANTIZE_ALL_F16: &str = "CANDLE_DEQUANTIZE_ALL_F16";

/// What a run computed in. Each type is named as ggml and the GGUF format name it (`Q4_K`,
/// `Q6_K`, `F32`, `F16`, `BF16`); lower case is read the same.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Precision {
    /// The weights as the matmuls read them: the quantized types of a GGUF file's matmul
    /// weights (`["Q4_K", "Q6_K"]`), or one float type (`["F32"]`).
    pub weights: Vec<String>,
    /// Where the weights are floats dequantized from a quantized file: that file's types. Empty
    /// otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dequantized_from: Vec<String>,
    /// The activations' type (`F32`, `BF16`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations: Option<String>,
    /// The KV cache's type (`F32`, `F16`), where the run has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<String>,
    /// Who says so: `the port` (set in code), `CANDLE_DEQUANTIZE_ALL` (read by the session, as
    /// candle reads it), `transformers`, `llama.cpp`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// What a weight type is, for choosing a tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightKind {
    /// A float type: the weights are the numbers the matmuls multiply by.
    Float,
    /// A quantized type of ggml's (`Q4_K`, `IQ2_XS`, ...): the kernels may also round the
    /// activations.
    Quantized,
    /// A name that is neither (a typo, another library's type): nothing is assumed of it.
    Unknown,
}

impl Precision {
    /// Weights of the quantized `types` (as a GGUF file lists its matmul weights' types).
    pub fn quantized<S: Into<String>>(types: impl IntoIterator<Item = S>) -> Self {
        Self {
            weights: types.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Weights of one float type (`"F32"`, `"BF16"`).
    pub fn float(dtype: impl Into<String>) -> Self {
        Self {
            weights: vec![dtype.into()],
            ..Self::default()
        }
    }

    /// These weights dequantized to the float type `dtype`: `weights` becomes `[dtype]` and
    /// the types they had move to `dequantized_from`.
    #[must_use]
    pub fn dequantized_to(mut self, dtype: impl Into<String>) -> Self {
        let before = std::mem::replace(&mut self.weights, vec![dtype.into()]);
        if self.dequantized_from.is_empty() {
            self.dequantized_from = before;
        }
        self
    }

    /// With the activations' type.
    #[must_use]
    pub fn activations(mut self, dtype: impl Into<String>) -> Self {
        self.activations = Some(dtype.into());
        self
    }

    /// With the KV cache's type.
    #[must_use]
    pub fn kv_cache(mut self, dtype: impl Into<String>) -> Self {
        self.kv_cache = Some(dtype.into());
        self
    }

    /// With who says so.
    #[must_use]
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Whether a weight type is quantized (see [`weight_kind`]).
    pub fn is_quantized(&self) -> bool {
        self.weights
            .iter()
            .any(|t| weight_kind(t) == WeightKind::Quantized)
    }

    /// The one float type of the weights, by its ggml name (`"F32"`, also for `fp32` or
    /// `float32`), if they are floats of one type.
    pub fn float_weights(&self) -> Option<&'static str> {
        match self.weights.as_slice() {
            [one] => float_name(one),
            _ => None,
        }
    }

    /// What the session records when `dequantize` says what candle does with quantized
    /// weights (read from the environment by [`CandleDequantize::from_env`]): `self` (or, given
    /// nothing, weights of unknown quantized types) dequantized to candle's type, with the
    /// variable as the source.
    #[must_use]
    pub fn under_candle(self, dequantize: CandleDequantize) -> Self {
        let dtype = match dequantize {
            CandleDequantize::Off => return self,
            CandleDequantize::F32 => "F32",
            CandleDequantize::F16 => "F16",
        };
        if !self.weights.is_empty() && !self.is_quantized() {
            return self;
        }
        let source = match &self.source {
            Some(source) => format!("{source}, {}", dequantize.variable()),
            None => dequantize.variable().to_owned(),
        };
        self.dequantized_to(dtype).source(source)
    }
}

/// `Q4_K, Q6_K weights dequantized to F32; F32 activations; F16 KV cache (llama.cpp)`.
impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let weights = if self.weights.is_empty() {
            "weights of unknown type".to_owned()
        } else {
            format!("{} weights", self.weights.join(", "))
        };
        if self.dequantized_from.is_empty() {
            f.write_str(&weights)?;
        } else {
            write!(
                f,
                "{} weights dequantized to {}",
                self.dequantized_from.join(", "),
                self.weights.join(", ")
            )?;
        }
        if let Some(activations) = &self.activations {
            write!(f, "; {activations} activations")?;
        }
        if let Some(kv_cache) = &self.kv_cache {
            write!(f, "; {kv_cache} KV cache")?;
        }
        if let Some(source) = &self.source {
            write!(f, " ({source})")?;
        }
        Ok(())
    }
}

/// What `dtype` is: a float type ([`float_name`]), one of ggml's quantized types
/// ([`QuantType::ALL`] but its floats, any case: `Q4_K`, `iq2_xs`, `TQ1_0`, `MXFP4`), or
/// neither.
pub fn weight_kind(dtype: &str) -> WeightKind {
    if float_name(dtype).is_some() {
        return WeightKind::Float;
    }
    let quantized = QuantType::ALL
        .iter()
        .any(|t| t.name().eq_ignore_ascii_case(dtype));
    if quantized {
        WeightKind::Quantized
    } else {
        WeightKind::Unknown
    }
}

/// The ggml name of a float type (`F32`, `F16`, `BF16`, `F64`) under the names libraries give
/// it, any case (`f32`, `fp32`, `float32`, `float`; `fp16`, `half`, `float16`; `bfloat16`;
/// `fp64`, `double`, `float64`); `None` for anything else.
pub fn float_name(dtype: &str) -> Option<&'static str> {
    match dtype.to_ascii_uppercase().as_str() {
        "F32" | "FP32" | "FLOAT32" | "FLOAT" => Some("F32"),
        "F16" | "FP16" | "FLOAT16" | "HALF" => Some("F16"),
        "BF16" | "BFLOAT16" => Some("BF16"),
        "F64" | "FP64" | "FLOAT64" | "DOUBLE" => Some("F64"),
        _ => None,
    }
}

/// What candle's `QMatMul::from_arc` does with a quantized weight, as the environment says
/// (`CANDLE_DEQUANTIZE_ALL`, then `CANDLE_DEQUANTIZE_ALL_F16`; a variable is set when it is
/// neither empty nor `0`, as candle reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandleDequantize {
    /// Keeps it quantized.
    Off,
    /// Dequantizes it to f32.
    F32,
    /// Dequantizes it to f16.
    F16,
}

impl CandleDequantize {
    /// Reads the two variables.
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var(CANDLE_DEQUANTIZE_ALL).ok().as_deref(),
            std::env::var(CANDLE_DEQUANTIZE_ALL_F16).ok().as_deref(),
        )
    }

    /// From the variables' values (`None`: unset).
    pub fn from_vars(all: Option<&str>, all_f16: Option<&str>) -> Self {
        let set = |value: Option<&str>| value.is_some_and(|v| !v.is_empty() && v != "0");
        if set(all) {
            Self::F32
        } else if set(all_f16) {
            Self::F16
        } else {
            Self::Off
        }
    }

    /// The variable that says so (`CANDLE_DEQUANTIZE_ALL=1`); empty for [`Off`](Self::Off).
    pub fn variable(self) -> &'static str {
        match self {
            Self::Off => "",
            Self::F32 => "CANDLE_DEQUANTIZE_ALL=1",
            Self::F16 => "CANDLE_DEQUANTIZE_ALL_F16=1",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_reads_a_variable_as_set_unless_empty_or_zero() {
        assert_eq!(
            CandleDequantize::from_vars(None, None),
            CandleDequantize::Off
        );
        assert_eq!(
            CandleDequantize::from_vars(Some("0"), Some("")),
            CandleDequantize::Off
        );
        assert_eq!(
            CandleDequantize::from_vars(Some("yes"), Some("1")),
            CandleDequantize::F32
        );
        assert_eq!(
            CandleDequantize::from_vars(Some("0"), Some("1")),
            CandleDequantize::F16
        );
    }

    #[test]
    fn quantized_weights_under_candle_are_dequantized_with_the_variable_as_source() {
        let port = Precision::quantized(["Q4_K", "Q6_K"])
            .activations("F32")
            .source("the port");
        let under = port.clone().under_candle(CandleDequantize::F32);
        assert_eq!(under.weights, ["F32"]);
        assert_eq!(under.dequantized_from, ["Q4_K", "Q6_K"]);
        assert_eq!(
            under.source.as_deref(),
            Some("the port, CANDLE_DEQUANTIZE_ALL=1")
        );
        assert!(!under.is_quantized());
        assert_eq!(under.float_weights(), Some("F32"));
        assert_eq!(port.clone().under_candle(CandleDequantize::Off), port);
        // Float weights stay as they are; nothing said becomes "dequantized to F16".
        let float = Precision::float("BF16");
        assert_eq!(float.clone().under_candle(CandleDequantize::F32), float);
        let unsaid = Precision::default().under_candle(CandleDequantize::F16);
        assert_eq!(unsaid.weights, ["F16"]);
        assert!(unsaid.dequantized_from.is_empty());
    }

    #[test]
    fn quantized_and_float_types_are_told_apart_in_any_case() {
        for float in ["F32", "f16", "bf16", "float32"] {
            assert_eq!(weight_kind(float), WeightKind::Float, "{float}");
        }
        for quantized in ["Q4_K", "q8_0", "IQ2_XS", "TQ1_0", "MXFP4"] {
            assert_eq!(weight_kind(quantized), WeightKind::Quantized, "{quantized}");
        }
        // Other libraries' float names are floats; a name that is neither is not taken for a
        // quantized type (which would loosen diff's tolerance).
        for (alias, name) in [("fp32", "F32"), ("half", "F16"), ("bfloat16", "BF16")] {
            assert_eq!(weight_kind(alias), WeightKind::Float, "{alias}");
            assert_eq!(Precision::float(alias).float_weights(), Some(name));
        }
        for unknown in ["float8_e4m3fn", "int4", "Q4_K_M", ""] {
            assert_eq!(weight_kind(unknown), WeightKind::Unknown, "{unknown}");
            assert!(!Precision::float(unknown).is_quantized(), "{unknown}");
        }
        let mixed = Precision::quantized(["F32", "Q6_K"]);
        assert!(mixed.is_quantized());
        assert_eq!(mixed.float_weights(), None);
    }

    #[test]
    fn a_precision_reads_as_one_line() {
        let llama = Precision::quantized(["Q4_K", "Q6_K"])
            .activations("F32")
            .kv_cache("F16")
            .source("llama.cpp");
        assert_eq!(
            llama.to_string(),
            "Q4_K, Q6_K weights; F32 activations; F16 KV cache (llama.cpp)"
        );
        assert_eq!(
            llama.dequantized_to("F32").to_string(),
            "Q4_K, Q6_K weights dequantized to F32; F32 activations; F16 KV cache (llama.cpp)"
        );
    }
}

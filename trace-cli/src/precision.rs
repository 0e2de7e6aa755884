//! What a trace's header says its weights are: quantized, floats of one type, or not said. The
//! structured `metadata.precision` decides where there is one; an older trace without it is
//! read from its free `metadata.dtype` text (`"Q4_K, Q6_K weights, f32 activations"`, `"f32
//! weights dequantized from Q4_K"`), and what is read so says so.

use trace_runtime::{float_name, Precision, TraceHeader};

/// The kind of weights a header says a run computed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Weights {
    /// Quantized types (GGUF's `Q4_K`, `IQ2_XS`, ...), on at least one weight.
    Quantized,
    /// Floats of one type, upper case (`F32`, `BF16`): native, or dequantized from a
    /// quantized file.
    Float(String),
    /// Said, but neither quantized nor floats of one type (`["F16", "F32"]`, a type name
    /// neither ggml's nor a float's).
    Other,
    /// Not said.
    Unknown,
}

/// Where a header says what its weights are.
#[derive(Debug, Clone, PartialEq)]
enum Said {
    /// In `metadata.precision`.
    Precision(Precision),
    /// In the free text of `metadata.dtype` (an older trace).
    DtypeText(String),
    /// Nowhere.
    Nothing,
}

/// What one trace's header says of its weights and activations.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WeightsSaid {
    pub(crate) weights: Weights,
    said: Said,
}

impl WeightsSaid {
    /// Reads `header`: its `metadata.precision`, else its `metadata.dtype` text.
    pub(crate) fn of(header: &TraceHeader) -> Self {
        let metadata = &header.metadata;
        if let Some(precision) = &metadata.precision {
            return Self::of_precision(precision);
        }
        match &metadata.dtype {
            Some(text) => Self {
                weights: weights_in_text(text),
                said: Said::DtypeText(text.clone()),
            },
            None => Self {
                weights: Weights::Unknown,
                said: Said::Nothing,
            },
        }
    }

    fn of_precision(precision: &Precision) -> Self {
        let weights = if precision.is_quantized() {
            Weights::Quantized
        } else if let Some(dtype) = precision.float_weights() {
            Weights::Float(dtype.to_owned())
        } else if precision.weights.is_empty() {
            Weights::Unknown
        } else {
            Weights::Other
        };
        Self {
            weights,
            said: Said::Precision(precision.clone()),
        }
    }

    /// Whether the weights are quantized.
    pub(crate) fn is_quantized(&self) -> bool {
        self.weights == Weights::Quantized
    }

    /// The float type of the weights, if they are floats of one type.
    pub(crate) fn float(&self) -> Option<&str> {
        match &self.weights {
            Weights::Float(dtype) => Some(dtype),
            _ => None,
        }
    }

    /// The activations' type, upper case, where `metadata.precision` says.
    pub(crate) fn activations(&self) -> Option<String> {
        match &self.said {
            Said::Precision(p) => p.activations.as_deref().map(str::to_ascii_uppercase),
            _ => None,
        }
    }

    /// The KV cache's type, upper case, where `metadata.precision` says.
    pub(crate) fn kv_cache(&self) -> Option<String> {
        match &self.said {
            Said::Precision(p) => p.kv_cache.as_deref().map(str::to_ascii_uppercase),
            _ => None,
        }
    }

    /// The header's `metadata.precision`, if it has one.
    pub(crate) fn precision(&self) -> Option<&Precision> {
        match &self.said {
            Said::Precision(p) => Some(p),
            _ => None,
        }
    }

    /// The quantized types a float run's weights were dequantized from, sorted, upper case
    /// (empty where the header does not say).
    pub(crate) fn dequantized_from(&self) -> Vec<String> {
        sorted_names(self.precision().map_or(&[][..], |p| &p.dequantized_from))
    }

    /// The quantized weights' types, sorted, upper case (empty unless the header says they are
    /// quantized).
    pub(crate) fn quantized_types(&self) -> Vec<String> {
        match (self.is_quantized(), self.precision()) {
            (true, Some(p)) => sorted_names(&p.weights),
            _ => Vec::new(),
        }
    }

    /// Who the header says computed it (`the port`, `llama.cpp`), where it says.
    pub(crate) fn source(&self) -> Option<&str> {
        self.precision().and_then(|p| p.source.as_deref())
    }

    /// Whether the header says llama.cpp wrote it (`source: llama.cpp`).
    pub(crate) fn is_llama_cpp(&self) -> bool {
        self.precision()
            .and_then(|p| p.source.as_deref())
            .is_some_and(|source| source.contains("llama.cpp"))
    }

    /// Whether the header says anything of its precision (structured or in its dtype text).
    pub(crate) fn says_something(&self) -> bool {
        self.weights != Weights::Unknown
    }

    /// What the header says, for a reader: `Q4_K, Q6_K weights; F32 activations (the port)`,
    /// or the dtype text and where it was read.
    pub(crate) fn describe(&self) -> String {
        match &self.said {
            Said::Precision(p) => p.to_string(),
            Said::DtypeText(text) => format!("{text:?}, read from the header's dtype text"),
            Said::Nothing => "not said".to_owned(),
        }
    }
}

/// What the free text of `metadata.dtype` says of the weights: dequantized to a float type, a
/// quantized type named (GGUF names: `q4_1`, `Q6_K`, `iq2_xs`, `tq1_0`), or nothing.
fn weights_in_text(text: &str) -> Weights {
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    if words.contains(&"dequantized") {
        let float = words.iter().find_map(|w| float_name(w));
        return float.map_or(Weights::Unknown, |dtype| Weights::Float(dtype.to_owned()));
    }
    if words.iter().any(|w| quantized_word(w)) {
        Weights::Quantized
    } else {
        Weights::Unknown
    }
}

/// Type names upper case, sorted: one list of types however a writer spelled and ordered them.
fn sorted_names(names: &[String]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|t| t.to_ascii_uppercase()).collect();
    names.sort();
    names
}

/// Whether a word of a dtype text is a quantized GGUF type: `q`, `iq` or `tq`, a digit, then
/// more (`q4_1`, `q4_k_m`, `iq2_xs`).
fn quantized_word(word: &str) -> bool {
    let rest = ["iq", "tq", "q"]
        .iter()
        .find_map(|prefix| word.strip_prefix(prefix));
    rest.is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_texts_of_older_traces_are_read() {
        let quantized = [
            "Q4_K, Q5_0, Q6_K and Q8_0 weights, f32 activations",
            "q4_1",
            "Q4_K_M GGUF, f32 activations",
        ];
        for text in quantized {
            assert_eq!(weights_in_text(text), Weights::Quantized, "{text}");
        }
        assert_eq!(
            weights_in_text("f32 weights dequantized from Q4_K, Q5_0, Q6_K and Q8_0"),
            Weights::Float("F32".to_owned())
        );
        for unknown in ["f32", "torch.float32", "dequantized", "quick"] {
            assert_eq!(weights_in_text(unknown), Weights::Unknown, "{unknown}");
        }
    }
}

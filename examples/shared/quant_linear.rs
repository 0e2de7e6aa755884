//! A matmul on a GGUF weight, quantized or dequantized, and the precision the matmuls of a model
//! compute in (the trace header's `metadata.precision`). Shared by the GGUF examples
//! (`#[path]`); each port adds its `#[trace_quant]` sites, one a format its file holds, in an
//! `impl QuantLinear` of its own with a `forward_quantized` that dispatches to them.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Module, Result, Tensor};
use model_trace::{weight_kind, CandleDequantize, Precision, WeightKind};
use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

/// A matmul whose weight stays in its GGUF quantization, with the same matmul on the dequantized
/// weight as the reference the quantization error is measured against. Dequantized (by
/// [`dequantize`](Self::dequantize), or by candle's `QMatMul::from_arc` under
/// `CANDLE_DEQUANTIZE_ALL`), it is a plain float matmul and records no quantization error.
pub struct QuantLinear {
    name: String,
    weight: Arc<QTensor>,
    matmul: QMatMul,
    /// Filled on the first `forward_f32`, so untraced runs never pay for the f32 copy.
    dequantized: OnceLock<Tensor>,
    /// The variable that made candle's `QMatMul::from_arc` dequantize the weight on load
    /// (`CANDLE_DEQUANTIZE_ALL=1`); `None` when it kept it quantized, or after
    /// [`dequantize`](Self::dequantize).
    dequantized_by: Option<&'static str>,
}

impl QuantLinear {
    /// The matmul candle's `QMatMul::from_arc` makes of `weight`: quantized, unless
    /// `CANDLE_DEQUANTIZE_ALL` (`_F16`) made it dequantize the weight to f32 (f16).
    pub fn new(name: impl Into<String>, weight: Arc<QTensor>) -> Result<Self> {
        let matmul = QMatMul::from_arc(weight.clone())?;
        let quantized_in_file =
            weight_kind(ggml_type_name(weight.dtype())) == WeightKind::Quantized;
        let dequantized_by = match &matmul {
            QMatMul::QTensor(_) => None,
            _ if !quantized_in_file => None,
            QMatMul::Tensor(_) => Some(CandleDequantize::F32.variable()),
            QMatMul::TensorF16(_) => Some(CandleDequantize::F16.variable()),
        };
        Ok(Self {
            name: name.into(),
            weight,
            matmul,
            dequantized: OnceLock::new(),
            dequantized_by,
        })
    }

    /// `x @ Wᵀ`: `[.., in] -> [.., out]`. A quantized weight goes through the port's
    /// `#[trace_quant]` site of its format (`forward_quantized`), so that its records carry the
    /// right label; a float matmul (dequantized, or float in the file) is a plain matmul with no
    /// quantization record: against its own f32 twin it would record an error of 0 under a
    /// quantized label.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.matmul {
            QMatMul::QTensor(_) => self.forward_quantized(x),
            _ => self.kernel(x),
        }
    }

    /// The matmul as it is (quantized kernel or float), unrecorded: what the port's
    /// `#[trace_quant]` sites run.
    pub(crate) fn kernel(&self, x: &Tensor) -> Result<Tensor> {
        self.matmul.forward(x)
    }

    /// `x @ Wᵀ` against the dequantized f32 weight, same shapes as [`QuantLinear::forward`].
    pub fn forward_f32(&self, x: &Tensor) -> Result<Tensor> {
        let weight = self.dequantized_weight()?;
        x.broadcast_matmul(&weight.t()?)
    }

    /// The weight as f32 `[out, in]`, dequantized once (the matmul's own when it is f32).
    pub fn dequantized_weight(&self) -> Result<&Tensor> {
        if let QMatMul::Tensor(weight) = &self.matmul {
            return Ok(weight);
        }
        if let Some(weight) = self.dequantized.get() {
            return Ok(weight);
        }
        let weight = self.weight.dequantize(&self.weight.device())?;
        // A concurrent caller may have won the race; either copy is the same.
        Ok(self.dequantized.get_or_init(|| weight))
    }

    /// Replaces the quantized kernel by an f32 matmul on the dequantized weight (what
    /// `CANDLE_DEQUANTIZE_ALL=1` makes candle's `QMatMul::from_arc` do): the same weights, no
    /// 8-bit rounding of the activations.
    pub fn dequantize(&mut self) -> Result<()> {
        let weight = self.weight.dequantize(&self.weight.device())?;
        self.matmul = QMatMul::Tensor(weight);
        self.dequantized = OnceLock::new();
        self.dequantized_by = None;
        Ok(())
    }

    /// Whether the weight, quantized in the file, is multiplied as floats: made so by
    /// [`dequantize`](Self::dequantize) or by `CANDLE_DEQUANTIZE_ALL` (`_F16`).
    pub fn is_dequantized(&self) -> bool {
        !matches!(self.matmul, QMatMul::QTensor(_))
            && weight_kind(ggml_type_name(self.ggml_dtype())) == WeightKind::Quantized
    }

    /// The type the matmul reads the weight in, as ggml names it: the file's (`Q4_K`) for the
    /// quantized kernel, `F32` or `F16` for a float matmul.
    pub fn matmul_type(&self) -> &'static str {
        match self.matmul {
            QMatMul::QTensor(_) => ggml_type_name(self.ggml_dtype()),
            QMatMul::Tensor(_) => "F32",
            QMatMul::TensorF16(_) => "F16",
        }
    }

    /// The GGUF tensor name, e.g. `blk.3.attn_q.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The weight's type in the file.
    pub fn ggml_dtype(&self) -> GgmlDType {
        self.weight.dtype()
    }

    /// `(out_features, in_features)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        self.weight.shape().dims2()
    }
}

/// What the matmuls of `linears` multiply by, as the trace header says it
/// ([`model_trace::Precision`]): the distinct types they read (sorted), and where those are
/// floats dequantized from quantized types, the file's types as `dequantized_from`. The source
/// is `the port`, with the variable that made candle dequantize (`the port,
/// CANDLE_DEQUANTIZE_ALL=1`) where candle did: the session then leaves it as it is (it reads the
/// same variable, but finds float weights). Activations and KV cache are the caller's to add.
pub fn matmul_precision<'a>(linears: impl IntoIterator<Item = &'a QuantLinear>) -> Precision {
    let (mut stored, mut read, mut by) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for linear in linears {
        stored.insert(ggml_type_name(linear.ggml_dtype()));
        read.insert(linear.matmul_type());
        by.extend(linear.dequantized_by);
    }
    let quantized = |types: &BTreeSet<&str>| {
        types
            .iter()
            .any(|t| weight_kind(t) == WeightKind::Quantized)
    };
    let dequantized_from = if quantized(&stored) && !quantized(&read) {
        stored.iter().map(|t| (*t).to_owned()).collect()
    } else {
        Vec::new()
    };
    let source = std::iter::once("the port")
        .chain(by)
        .collect::<Vec<_>>()
        .join(", ");
    Precision {
        dequantized_from,
        ..Precision::quantized(read)
    }
    .source(source)
}

/// A ggml type as ggml and the GGUF format name it (`Q4_K`, where candle's variant is `Q4K`).
pub fn ggml_type_name(dtype: GgmlDType) -> &'static str {
    match dtype {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// The header's free-text `dtype` said as `precision` says it, without its source:
/// `Q4_K, Q8_0 weights dequantized to F32; F32 activations; F32 KV cache`.
pub fn dtype_text(precision: &Precision) -> String {
    Precision {
        source: None,
        ..precision.clone()
    }
    .to_string()
}

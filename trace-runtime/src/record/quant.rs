//! Error of a quantized computation against its full-precision reference, and ggml's formats.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::QuantType;

/// Cosine similarity above which quantization is acceptable (llama.cpp's Q4_K validation bar).
pub const QUANT_ACCEPTABLE_COSINE: f32 = 0.995;
/// Cosine similarity below which quantization is critical; between the two it is a warning.
pub const QUANT_CRITICAL_COSINE: f32 = 0.99;
/// Magnitude at which `snr_db` saturates. Identical outputs have no noise (an infinite SNR) and
/// JSON has no infinity, so they record `+SNR_DB_CAP`; a zero reference with nonzero error
/// records `-SNR_DB_CAP`. 300 dB is far beyond what f32 data can measure (one ulp of error on
/// every element is about 144 dB), so no real measurement is clipped.
pub const SNR_DB_CAP: f32 = 300.0;

/// `compute` was given a quantized output and a reference of different lengths: the reference
/// function does not compute the same thing, so no error figure would mean anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantLengthMismatch {
    /// Site of the comparison.
    pub site: String,
    /// Length of the quantized output.
    pub quantized_len: usize,
    /// Length of the reference output.
    pub reference_len: usize,
}

impl fmt::Display for QuantLengthMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "quantization error at `{}`: the quantized output has {} values but the reference has {}",
            self.site, self.quantized_len, self.reference_len
        )
    }
}

impl std::error::Error for QuantLengthMismatch {}

/// Error of one quantized output against its full-precision reference.
///
/// Pairs where either value is NaN or ±Inf are left out of the figures and counted in
/// `non_finite`; any such pair makes the trace critical. All figures are finite, so the record
/// always serializes to JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantizationErrorTrace {
    /// Where in the model (a name of the user's choosing: `"blk.3.attn_q"`, `"q_proj"`).
    pub site: String,
    /// Layer of the site.
    pub layer_idx: usize,
    /// Format of the quantized computation.
    pub quant_type: QuantType,
    /// Finite pairs compared.
    pub num_elements: usize,
    /// Pairs left out because a value was NaN or ±Inf.
    pub non_finite: usize,
    /// Mean squared error.
    pub mse: f32,
    /// Largest absolute difference.
    pub max_abs_error: f32,
    /// `q·r / (‖q‖‖r‖)`; 1 when both are all-zero, 0 when exactly one is.
    pub cosine_similarity: f32,
    /// `10·log10(Σr² / Σ(q−r)²)`, clamped to `±SNR_DB_CAP` (see there for the zero cases).
    pub snr_db: f32,
}

impl QuantizationErrorTrace {
    /// Compares `quantized` with `reference` in one pass (f64 accumulators).
    ///
    /// # Errors
    ///
    /// [`QuantLengthMismatch`] when the two slices differ in length.
    pub fn compute(
        site: impl Into<String>,
        layer_idx: usize,
        quantized: &[f32],
        reference: &[f32],
        quant_type: QuantType,
    ) -> Result<Self, QuantLengthMismatch> {
        let site = site.into();
        if quantized.len() != reference.len() {
            return Err(QuantLengthMismatch {
                site,
                quantized_len: quantized.len(),
                reference_len: reference.len(),
            });
        }
        let mut n = 0usize;
        let mut non_finite = 0usize;
        let (mut err_sq, mut max_abs, mut dot, mut q_sq, mut r_sq) =
            (0.0f64, 0.0f64, 0.0, 0.0, 0.0);
        for (&q, &r) in quantized.iter().zip(reference) {
            if !(q.is_finite() && r.is_finite()) {
                non_finite += 1;
                continue;
            }
            n += 1;
            let (q, r) = (f64::from(q), f64::from(r));
            let d = q - r;
            err_sq += d * d;
            max_abs = max_abs.max(d.abs());
            dot += q * r;
            q_sq += q * q;
            r_sq += r * r;
        }
        #[allow(clippy::cast_precision_loss)]
        let mse = if n == 0 { 0.0 } else { err_sq / n as f64 };
        let cosine = match (q_sq > 0.0, r_sq > 0.0) {
            (false, false) => 1.0,
            (true, true) => (dot / (q_sq.sqrt() * r_sq.sqrt())).clamp(-1.0, 1.0),
            _ => 0.0,
        };
        let cap = f64::from(SNR_DB_CAP);
        let snr = if err_sq == 0.0 {
            cap
        } else if r_sq == 0.0 {
            -cap
        } else {
            (10.0 * (r_sq / err_sq).log10()).clamp(-cap, cap)
        };
        Ok(Self {
            site,
            layer_idx,
            quant_type,
            num_elements: n,
            non_finite,
            mse: saturate(mse),
            max_abs_error: saturate(max_abs),
            cosine_similarity: saturate(cosine),
            snr_db: saturate(snr),
        })
    }

    /// `cosine_similarity > QUANT_ACCEPTABLE_COSINE` and no non-finite pair.
    pub fn is_acceptable(&self) -> bool {
        self.non_finite == 0 && self.cosine_similarity > QUANT_ACCEPTABLE_COSINE
    }

    /// `QUANT_CRITICAL_COSINE <= cosine_similarity <= QUANT_ACCEPTABLE_COSINE` and no non-finite pair.
    pub fn is_warning(&self) -> bool {
        self.non_finite == 0
            && (QUANT_CRITICAL_COSINE..=QUANT_ACCEPTABLE_COSINE).contains(&self.cosine_similarity)
    }

    /// `cosine_similarity < QUANT_CRITICAL_COSINE`, or a non-finite pair. Exactly one of
    /// acceptable / warning / critical holds for every trace.
    pub fn is_critical(&self) -> bool {
        !self.is_acceptable() && !self.is_warning()
    }
}

/// f64 → f32 without turning a huge value into Inf (which JSON cannot hold).
#[allow(clippy::cast_possible_truncation)]
fn saturate(x: f64) -> f32 {
    x.clamp(-f64::from(f32::MAX), f64::from(f32::MAX)) as f32
}

/// Quantization error of every traced site in one forward pass (`position` is `None` for
/// records made outside a pass).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelQuantizationError {
    /// Position of the forward pass, if the records were made inside one.
    pub position: Option<usize>,
    /// Traces in recording order.
    pub traces: Vec<QuantizationErrorTrace>,
}

impl ModelQuantizationError {
    /// An empty set for the pass at `position`.
    pub fn for_position(position: usize) -> Self {
        Self {
            position: Some(position),
            traces: Vec::new(),
        }
    }

    /// Appends one site's error.
    pub fn add_error(&mut self, trace: QuantizationErrorTrace) {
        self.traces.push(trace);
    }

    /// Sites in the warning band.
    pub fn warning_count(&self) -> usize {
        self.traces.iter().filter(|t| t.is_warning()).count()
    }

    /// Critical sites.
    pub fn critical_count(&self) -> usize {
        self.traces.iter().filter(|t| t.is_critical()).count()
    }

    /// The site with the lowest cosine similarity; a site with non-finite values counts as worst.
    pub fn worst(&self) -> Option<&QuantizationErrorTrace> {
        self.traces.iter().min_by(|a, b| {
            (b.non_finite > 0)
                .cmp(&(a.non_finite > 0))
                .then(a.cosine_similarity.total_cmp(&b.cosine_similarity))
        })
    }

    /// Mean cosine similarity over the sites, `None` when there are none.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    pub fn mean_cosine(&self) -> Option<f32> {
        if self.traces.is_empty() {
            return None;
        }
        let sum: f64 = self
            .traces
            .iter()
            .map(|t| f64::from(t.cosine_similarity))
            .sum();
        Some((sum / self.traces.len() as f64) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_example_and_bands() {
        let reference = [1.0, 2.0, 3.0, 4.0];
        let quantized = [1.02, 1.98, 3.05, 3.95];
        let t = QuantizationErrorTrace::compute("qkv", 5, &quantized, &reference, QuantType::Q4_K)
            .unwrap();
        let want_mse = (0.02f64.powi(2) * 2.0 + 0.05f64.powi(2) * 2.0) / 4.0;
        assert!((f64::from(t.mse) - want_mse).abs() < 1e-7);
        assert!((t.max_abs_error - 0.05).abs() < 1e-6);
        assert!(t.cosine_similarity > 0.999 && t.is_acceptable());
        let want_snr = 10.0 * (30.0f64 / (want_mse * 4.0)).log10();
        assert!((f64::from(t.snr_db) - want_snr).abs() < 1e-3);
        assert_eq!((t.num_elements, t.non_finite, t.layer_idx), (4, 0, 5));

        let exact = QuantizationErrorTrace::compute("x", 0, &reference, &reference, QuantType::F32)
            .unwrap();
        assert_eq!(
            (exact.snr_db, exact.mse, exact.cosine_similarity),
            (SNR_DB_CAP, 0.0, 1.0)
        );
        let zero_ref =
            QuantizationErrorTrace::compute("x", 0, &[1.0], &[0.0], QuantType::F32).unwrap();
        assert_eq!(
            (zero_ref.snr_db, zero_ref.cosine_similarity),
            (-SNR_DB_CAP, 0.0)
        );
        assert!(zero_ref.is_critical());

        // cos(θ) bands: build vectors with a chosen angle
        let band = |cos: f32| {
            let sin = (1.0 - cos * cos).sqrt();
            QuantizationErrorTrace::compute("b", 0, &[cos, sin], &[1.0, 0.0], QuantType::Q2_K)
                .unwrap()
        };
        let (ok, warn, crit) = (band(0.999), band(0.993), band(0.98));
        assert!(ok.is_acceptable() && !ok.is_warning() && !ok.is_critical());
        assert!(!warn.is_acceptable() && warn.is_warning() && !warn.is_critical());
        assert!(!crit.is_acceptable() && !crit.is_warning() && crit.is_critical());
    }

    #[test]
    fn mismatch_is_an_error_and_non_finite_is_critical() {
        let err = QuantizationErrorTrace::compute("site", 1, &[1.0], &[1.0, 2.0], QuantType::Q8_0)
            .unwrap_err();
        assert_eq!((err.quantized_len, err.reference_len), (1, 2));
        assert!(err.to_string().contains("`site`"));

        let t = QuantizationErrorTrace::compute(
            "nan",
            0,
            &[f32::NAN, 2.0, 3.0],
            &[1.0, 2.0, f32::INFINITY],
            QuantType::Q8_0,
        )
        .unwrap();
        assert_eq!((t.num_elements, t.non_finite), (1, 2));
        assert!(t.is_critical());
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            serde_json::from_str::<QuantizationErrorTrace>(&json).unwrap(),
            t
        );

        let huge =
            QuantizationErrorTrace::compute("big", 0, &[f32::MAX], &[-f32::MAX], QuantType::F16)
                .unwrap();
        assert!(huge.mse.is_finite() && huge.max_abs_error.is_finite());
    }

    #[test]
    fn model_error_counts_and_worst() {
        let mut model = ModelQuantizationError::for_position(4);
        assert_eq!((model.worst(), model.mean_cosine()), (None, None));
        let mk = |site: &str, q: &[f32]| {
            QuantizationErrorTrace::compute(site, 0, q, &[1.0, 0.0], QuantType::Q4_0).unwrap()
        };
        model.add_error(mk("good", &[1.0, 0.01]));
        model.add_error(mk("warn", &[1.0, 0.12]));
        model.add_error(mk("bad", &[1.0, 0.5]));
        assert_eq!((model.warning_count(), model.critical_count()), (1, 1));
        assert_eq!(model.worst().map(|t| t.site.as_str()), Some("bad"));
        model.add_error(
            QuantizationErrorTrace::compute(
                "nan",
                0,
                &[f32::NAN, 1.0],
                &[1.0, 1.0],
                QuantType::Q4_0,
            )
            .unwrap(),
        );
        assert_eq!(model.worst().map(|t| t.site.as_str()), Some("nan"));
        assert!(model.mean_cosine().is_some_and(|c| c > 0.9 && c < 1.0));
    }
}

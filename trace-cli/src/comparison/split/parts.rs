//! One tensor's error split into its parts, from the three runs' values (exact) or from their
//! sketches (an estimate: the sketch is linear, `sketch(a) − sketch(b) = sketch(a − b)` up to
//! its rounding to f32, so the sketches' differences are the sketches of the differences).

use trace_runtime::Sketch;

/// The L2 norms of the three differences of one tensor and of the reference's values, in the
/// same units (the values', or the sketches' `√8` times them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Parts {
    /// `‖PORT_Q − REF‖`.
    pub(super) total: f64,
    /// `‖PORT_Q − PORT‖`.
    pub(super) quantization: f64,
    /// `‖PORT − REF‖`.
    pub(super) logic: f64,
    /// `‖REF‖`.
    pub(super) reference: f64,
    /// The largest `|quantization + logic − total|` of an element (or a sketch component):
    /// the identity's residual, zero but for rounding.
    pub(super) residual: f64,
    /// Elements left out because a value of one of the runs is NaN or infinite.
    pub(super) non_finite: usize,
}

impl Parts {
    /// From the values of the reference, the port and the quantized port (of one length).
    pub(super) fn from_values(reference: &[f32], port: &[f32], quantized: &[f32]) -> Self {
        let mut sums = Sums::default();
        for ((&r, &p), &q) in reference.iter().zip(port).zip(quantized) {
            if r.is_finite() && p.is_finite() && q.is_finite() {
                sums.add(f64::from(r), f64::from(p), f64::from(q));
            } else {
                sums.non_finite += 1;
            }
        }
        sums.parts(1.0)
    }

    /// From the three sketches, `reference_l2` the reference's recorded L2 norm: each norm is
    /// the sketch difference's over `√8`, whose expectation is the values' (each ±1
    /// projection keeps the squared norm in expectation).
    pub(super) fn from_sketches(
        reference: &Sketch,
        port: &Sketch,
        quantized: &Sketch,
        reference_l2: f64,
    ) -> Self {
        let mut sums = Sums::default();
        for ((&r, &p), &q) in reference.0.iter().zip(&port.0).zip(&quantized.0) {
            sums.add(f64::from(r), f64::from(p), f64::from(q));
        }
        #[allow(clippy::cast_precision_loss)]
        let scale = (reference.0.len() as f64).sqrt();
        Self {
            reference: reference_l2,
            ..sums.parts(scale)
        }
    }

    /// `part / ‖REF‖`; `None` where the reference is all zeros.
    pub(super) fn relative(&self, part: f64) -> Option<f64> {
        (self.reference > 0.0).then(|| part / self.reference)
    }
}

/// Sums of squares of the three differences and of the reference, in f64.
#[derive(Debug, Default)]
struct Sums {
    total: f64,
    quantization: f64,
    logic: f64,
    reference: f64,
    residual: f64,
    non_finite: usize,
}

impl Sums {
    fn add(&mut self, r: f64, p: f64, q: f64) {
        let (total, quantization, logic) = (q - r, q - p, p - r);
        self.total += total * total;
        self.quantization += quantization * quantization;
        self.logic += logic * logic;
        self.reference += r * r;
        self.residual = self.residual.max((quantization + logic - total).abs());
    }

    /// The norms, each divided by `scale`.
    fn parts(&self, scale: f64) -> Parts {
        Parts {
            total: self.total.sqrt() / scale,
            quantization: self.quantization.sqrt() / scale,
            logic: self.logic.sqrt() / scale,
            reference: self.reference.sqrt() / scale,
            residual: self.residual / scale,
            non_finite: self.non_finite,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_of_known_differences_are_their_norms() {
        let reference = [3.0f32, 4.0, 0.0, 0.0];
        let port = [3.0f32, 4.0, 0.5, 0.0];
        let quantized = [3.0f32, 4.0, 0.5, -1.0];
        let parts = Parts::from_values(&reference, &port, &quantized);
        assert_eq!(parts.reference, 5.0);
        assert_eq!(parts.logic, 0.5);
        assert_eq!(parts.quantization, 1.0);
        assert_eq!(parts.total, 1.25f64.sqrt());
        assert_eq!(parts.residual, 0.0);
        assert_eq!(parts.relative(parts.logic), Some(0.1));
    }

    #[test]
    fn non_finite_elements_are_left_out_and_counted() {
        let parts = Parts::from_values(&[1.0, f32::NAN], &[1.0, 2.0], &[2.0, 2.0]);
        assert_eq!(parts.non_finite, 1);
        assert_eq!(parts.quantization, 1.0);
        assert_eq!(parts.relative(0.5), Some(0.5));
        assert_eq!(
            Parts::from_values(&[0.0], &[1.0], &[1.0]).relative(1.0),
            None
        );
    }
}

//! Whether one tensor is a normalisation of another up to a per-channel weight (and bias):
//! the norm identities of the stage check.
//!
//! `Y ≈ norm(X)` holds when `Y` is close to `w ⊙ n(X) (+ b)` for some per-channel `w` (and
//! `b`), `n` normalising each row (the last dimension) of `X` by RMS or as LayerNorm does. The
//! weights are not recorded in a trace, so they are fitted by least squares over the rows, one
//! channel at a time, and what is left of `Y` is the error. The norm's epsilon is not recorded
//! either: each of [`EPSILONS`] is tried (a stream whose mean square is within two orders of
//! the model's epsilon is misfit by a few tenths of a percent without it), as the Python
//! writer's check does.

/// The epsilons tried: none, and the two that transformers' families use (1e-6: Llama, Gemma,
/// Qwen; 1e-5: OLMo 2, Mistral, LayerNorm's default).
pub(super) const EPSILONS: [f64; 3] = [0.0, 1e-6, 1e-5];

/// How a row is normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Normalisation {
    /// `x / sqrt(mean(x²) + ε)` (RMSNorm), then `w ⊙ n`.
    Rms,
    /// `(x − mean(x)) / sqrt(var(x) + ε)` (LayerNorm, population variance), then `w ⊙ n + b`.
    Layer,
}

/// `‖Y − fit‖₂ / ‖Y‖₂` of the best of the two normalisations with each of [`EPSILONS`], `y` and `x` being `rows ×
/// channels` row-major (equal lengths, a multiple of `channels`; `x` finite, in `f64` as sums
/// of stages are): the per-channel weight (and bias) fitted by least squares over the rows.
/// Non-finite values of `y` count as 0, as in the sketch.
pub(super) fn fit_error(y: &[f32], x: &[f64], channels: usize) -> f64 {
    let fits = [Normalisation::Rms, Normalisation::Layer]
        .into_iter()
        .flat_map(|how| EPSILONS.map(|epsilon| (how, epsilon)));
    fits.map(|(how, epsilon)| fit_error_with(y, x, channels, how, epsilon))
        .fold(f64::INFINITY, f64::min)
}

/// [`fit_error`] with one normalisation and one epsilon.
pub(super) fn fit_error_with(
    y: &[f32],
    x: &[f64],
    channels: usize,
    how: Normalisation,
    epsilon: f64,
) -> f64 {
    debug_assert_eq!(y.len(), x.len());
    let rows = y.len().checked_div(channels).unwrap_or(0);
    if rows == 0 {
        return 0.0;
    }
    // First pass: per channel, the sums a least-squares line needs.
    let mut sums = vec![ChannelSums::default(); channels];
    let mut normalised = vec![0.0f64; channels];
    for row in 0..rows {
        let span = row * channels..(row + 1) * channels;
        normalise(&x[span.clone()], how, epsilon, &mut normalised);
        for ((s, &n), &y) in sums.iter_mut().zip(&normalised).zip(&y[span]) {
            s.add(n, finite(y));
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let count = rows as f64;
    let lines: Vec<(f64, f64)> = sums
        .iter()
        .map(|s| s.line(count, how == Normalisation::Layer))
        .collect();
    // Second pass: what the fitted lines leave of Y (summed directly, not as Σy² − fitted²,
    // which cancels when the fit is close).
    let (mut residual, mut total) = (0.0f64, 0.0f64);
    for row in 0..rows {
        let span = row * channels..(row + 1) * channels;
        normalise(&x[span.clone()], how, epsilon, &mut normalised);
        for ((&(w, b), &n), &y) in lines.iter().zip(&normalised).zip(&y[span]) {
            let y = finite(y);
            let d = y - (w * n + b);
            residual += d * d;
            total += y * y;
        }
    }
    relative(residual.sqrt(), total.sqrt())
}

/// A value as the sketch sees it: non-finite ones are 0.
pub(super) fn finite(v: f32) -> f64 {
    if v.is_finite() {
        f64::from(v)
    } else {
        0.0
    }
}

/// `difference / reference`, 0 when both are 0 and infinite when only the reference is.
pub(super) fn relative(difference: f64, reference: f64) -> f64 {
    if difference == 0.0 {
        0.0
    } else if reference > 0.0 {
        difference / reference
    } else {
        f64::INFINITY
    }
}

/// One row of `x` normalised into `out` (a row of zeros stays zeros).
fn normalise(x: &[f64], how: Normalisation, epsilon: f64, out: &mut [f64]) {
    #[allow(clippy::cast_precision_loss)]
    let len = x.len() as f64;
    let mean = match how {
        Normalisation::Rms => 0.0,
        Normalisation::Layer => x.iter().sum::<f64>() / len,
    };
    let square = x.iter().map(|&v| (v - mean).powi(2)).sum::<f64>() / len + epsilon;
    let scale = if square > 0.0 {
        1.0 / square.sqrt()
    } else {
        0.0
    };
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - mean) * scale;
    }
}

/// Sums over the rows of one channel: `n` the normalised input, `y` the recorded output.
#[derive(Debug, Clone, Copy, Default)]
struct ChannelSums {
    n: f64,
    y: f64,
    nn: f64,
    ny: f64,
}

impl ChannelSums {
    fn add(&mut self, n: f64, y: f64) {
        self.n += n;
        self.y += y;
        self.nn += n * n;
        self.ny += n * y;
    }

    /// The least-squares `(w, b)` of `y ≈ w·n + b` over `count` rows (`b = 0` without a bias).
    fn line(&self, count: f64, with_bias: bool) -> (f64, f64) {
        if !with_bias {
            let w = if self.nn > 0.0 {
                self.ny / self.nn
            } else {
                0.0
            };
            return (w, 0.0);
        }
        let (mean_n, mean_y) = (self.n / count, self.y / count);
        let var = self.nn / count - mean_n * mean_n;
        let cov = self.ny / count - mean_n * mean_y;
        let w = if var > 1e-12 * (self.nn / count) && var > 0.0 {
            cov / var
        } else {
            0.0
        };
        (w, mean_y - w * mean_n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wide(x: &[f32]) -> Vec<f64> {
        x.iter().map(|&v| f64::from(v)).collect()
    }

    /// Rows of a deterministic pseudo-random signal.
    fn signal(rows: usize, channels: usize, seed: f32) -> Vec<f32> {
        (0..rows * channels)
            .map(|i| ((i as f32 + seed) * 0.7311).sin() * 2.0 + ((i % channels) as f32 * 0.1))
            .collect()
    }

    #[test]
    fn an_rms_norm_with_any_weight_fits_exactly() {
        let (rows, channels) = (6, 16);
        let x = signal(rows, channels, 1.0);
        let weight: Vec<f32> = (0..channels).map(|c| 0.5 + c as f32 * 0.25).collect();
        let y: Vec<f32> = x
            .chunks(channels)
            .flat_map(|row| {
                let rms = (row.iter().map(|v| v * v).sum::<f32>() / channels as f32).sqrt();
                row.iter().zip(&weight).map(move |(v, w)| v / rms * w)
            })
            .collect();
        assert!(fit_error_with(&y, &wide(&x), channels, Normalisation::Rms, 0.0) < 1e-6);
        assert!(fit_error(&y, &wide(&x), channels) < 1e-6);
    }

    #[test]
    fn a_layer_norm_with_weight_and_bias_fits_exactly() {
        let (rows, channels) = (5, 12);
        let x = signal(rows, channels, 3.0);
        let y: Vec<f32> = x
            .chunks(channels)
            .flat_map(|row| {
                let n = channels as f32;
                let mean = row.iter().sum::<f32>() / n;
                let std = (row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n).sqrt();
                row.iter()
                    .enumerate()
                    .map(move |(c, v)| (v - mean) / std * (1.0 + c as f32 * 0.1) - 0.3)
            })
            .collect();
        assert!(fit_error(&y, &wide(&x), channels) < 1e-6);
        // RMS alone cannot fit a centred, biased output.
        assert!(fit_error_with(&y, &wide(&x), channels, Normalisation::Rms, 0.0) > 0.05);
    }

    #[test]
    fn a_norm_with_an_epsilon_fits_a_stream_of_its_scale() {
        // A stream whose mean square (~2.5e-5) is near the norm's epsilon (1e-5).
        let (rows, channels) = (6, 16);
        let x: Vec<f32> = signal(rows, channels, 2.0)
            .iter()
            .map(|v| v * 3e-3)
            .collect();
        let y: Vec<f32> = x
            .chunks(channels)
            .flat_map(|row| {
                let ms = row.iter().map(|v| v * v).sum::<f32>() / channels as f32;
                row.iter().map(move |v| v / (ms + 1e-5).sqrt())
            })
            .collect();
        let without = fit_error_with(&y, &wide(&x), channels, Normalisation::Rms, 0.0);
        assert!(without > 0.01, "{without}");
        assert!(fit_error(&y, &wide(&x), channels) < 1e-6);
    }

    #[test]
    fn a_tensor_that_is_no_norm_of_the_other_does_not_fit() {
        let (rows, channels) = (8, 32);
        let x = signal(rows, channels, 0.0);
        let y = signal(rows, channels, 100.0);
        assert!(
            fit_error(&y, &wide(&x), channels) > 0.3,
            "{}",
            fit_error(&y, &wide(&x), channels)
        );
        // Nor does the input itself (rows of different scales), as a residual stream is not.
        let scaled: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1.0 + (i / channels) as f32))
            .collect();
        assert!(fit_error(&scaled, &wide(&x), channels) > 0.05);
    }
}

//! `#[trace_quant]` compares the function's own output (the quantized one) with what its
//! `reference` returns, in that direction. Cosine, MSE, max error and the counts are symmetric
//! in the two, so only the SNR, `10·log10(Σr² / Σ(q−r)²)` against the *reference's* power, can
//! tell a swap: the data here makes the two directions differ by more than 6 dB.
//!
//! Sessions are built with `Session::builder`, which reads no environment variable.

use std::cell::Cell;

use model_trace::{trace_quant, ModelTracerConfig, Session};

thread_local! {
    /// Calls of the reference on this thread (tests run on threads of their own).
    static REFERENCE_CALLS: Cell<usize> = const { Cell::new(0) };
}

struct Scaled {
    weight: Vec<f32>,
    /// The quantized kernel's output is the reference's times this.
    scale: f32,
}

impl Scaled {
    fn exact(&self, x: &[f32]) -> Vec<f32> {
        REFERENCE_CALLS.with(|calls| calls.set(calls.get() + 1));
        x.iter().zip(&self.weight).map(|(a, w)| a * w).collect()
    }

    #[trace_quant(reference = Self::exact, quant = Q4_1, name = "blk.0.scaled")]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(&self.weight)
            .map(|(a, w)| a * w * self.scale)
            .collect()
    }
}

/// `10·log10(Σ power² / Σ(a−b)²)` in f64.
#[cfg(feature = "enabled")]
fn snr_db(power_of: &[f32], other: &[f32]) -> f64 {
    let signal: f64 = power_of.iter().map(|&v| f64::from(v).powi(2)).sum();
    let noise: f64 = power_of
        .iter()
        .zip(other)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    10.0 * (signal / noise).log10()
}

fn session() -> Session {
    Session::builder(ModelTracerConfig::full())
        .start()
        .expect("an in-memory session cannot fail to start")
}

#[cfg(feature = "enabled")]
#[test]
fn snr_is_measured_against_the_references_power() {
    let x = [1.0, -2.0, 0.5, 3.0, -0.25, 1.5];
    // scale 0.5: q = r/2, so Σr²/Σ(q−r)² = 4 (6.02 dB) but Σq²/Σ(q−r)² = 1 (0 dB);
    // scale 3: q = 3r, so Σr²/Σ(q−r)² = 1/4 (−6.02 dB) but Σq²/Σ(q−r)² = 9/4 (3.52 dB).
    for (scale, expected_db) in [(0.5_f32, 6.0206_f64), (3.0, -6.0206)] {
        let layer = Scaled {
            weight: vec![0.3, -0.7, 0.05, 1.2, 0.9, -0.4],
            scale,
        };
        let reference = layer.exact(&x);
        let quantized_untraced = layer.forward(&x);
        let right = snr_db(&reference, &quantized_untraced);
        let swapped = snr_db(&quantized_untraced, &reference);
        assert!((right - expected_db).abs() < 1e-3, "{right} dB");
        assert!(
            (right - swapped).abs() > 6.0,
            "the data must tell the directions apart"
        );

        let session = session();
        REFERENCE_CALLS.with(|calls| calls.set(0));
        let quantized = layer.forward(&x);
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            quantized, quantized_untraced,
            "the function returns its own output, not the reference's"
        );
        assert_eq!(REFERENCE_CALLS.with(Cell::get), 1);

        let traces: Vec<_> = tracer
            .quant_traces()
            .iter()
            .flat_map(|pass| &pass.traces)
            .collect();
        assert_eq!(traces.len(), 1);
        let trace = traces[0];
        assert_eq!(trace.site, "blk.0.scaled");
        assert_eq!(trace.quant_type, model_trace::QuantType::Q4_1);
        assert_eq!(trace.num_elements, x.len());
        let snr = f64::from(trace.snr_db);
        assert!(
            (snr - right).abs() < 1e-3,
            "scale {scale}: SNR {snr} dB, expected {right} dB against the reference's power \
             ({swapped} dB would be the output's power: reference and output swapped)"
        );
    }
}

#[cfg(not(feature = "enabled"))]
#[test]
fn compiled_out_the_reference_is_never_called() {
    let layer = Scaled {
        weight: vec![0.3, -0.7],
        scale: 0.5,
    };
    let session = session();
    REFERENCE_CALLS.with(|calls| calls.set(0));
    let quantized = layer.forward(&[1.0, 1.0]);
    let (tracer, errors) = session.finish_with_errors();
    assert_eq!(quantized, [0.15, -0.35]);
    assert_eq!(REFERENCE_CALLS.with(Cell::get), 0);
    assert!(tracer.quant_traces().is_empty() && errors.is_empty());
}

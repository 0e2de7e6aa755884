//! `#[trace_quant]`: `reference` gets the same arguments (`self` included) before the body;
//! what the body takes by value (as burn's tensors are), a clone of it.
#![deny(warnings)]

use model_trace::{trace_quant, ModelTracerConfig, QuantType, Session};

struct Linear {
    weight: Vec<f32>,
}

impl Linear {
    fn forward_f32(&self, x: &[f32]) -> Vec<f32> {
        x.iter().zip(&self.weight).map(|(a, b)| a * b).collect()
    }

    #[trace_quant(reference = Self::forward_f32, quant = Q4_1, name = "linear")]
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        self.forward_f32(x)
            .iter()
            .map(|v| (v * 4.0).round() / 4.0)
            .collect()
    }

    #[trace_quant(reference = Linear::forward_f32, quant = QuantType::Q8_0)]
    fn forward_checked(&self, x: &[f32]) -> Result<Vec<f32>, String> {
        Ok(self.forward_f32(x))
    }
}

/// Takes itself and its input by value, as a burn block takes its tensors.
#[derive(Clone)]
struct Scale {
    factor: f32,
}

impl Scale {
    fn apply_f32(self, x: Vec<f32>, _times: u8) -> Vec<f32> {
        x.into_iter().map(|v| v * self.factor).collect()
    }

    #[trace_quant(reference = Self::apply_f32, quant = Q8_0)]
    fn apply(self, x: Vec<f32>, times: u8) -> Vec<f32> {
        let rounded: Vec<f32> = x.into_iter().map(|v| (v * 2.0).round() / 2.0).collect();
        self.apply_f32(rounded, times)
    }
}

fn main() {
    let linear = Linear {
        weight: vec![0.3, 0.7],
    };
    let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
    assert_eq!(linear.forward(&[1.0, 1.0]), vec![0.25, 0.75]);
    assert!(linear.forward_checked(&[1.0, 1.0]).is_ok());
    assert_eq!(Scale { factor: 2.0 }.apply(vec![0.3], 1), vec![1.0]);
    let tracer = session.finish();
    if !model_trace::tracepoints().is_empty() {
        let traces = &tracer.quant_traces()[0].traces;
        assert_eq!(traces[0].site, "linear");
        assert_eq!(traces[0].quant_type, QuantType::Q4_1);
        assert!(traces[0].cosine_similarity < 1.0);
        assert_eq!(traces[1].quant_type, QuantType::Q8_0);
        assert_eq!(traces[1].cosine_similarity, 1.0);
        assert_eq!(traces[2].quant_type, QuantType::Q8_0);
        assert!(traces[2].max_abs_error > 0.3);
    }
}

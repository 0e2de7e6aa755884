//! What the CLI prints from a finished trace beyond the tracer's own summary.

use model_trace::{ModelTracer, QuantType};
use std::fmt;

/// Quantization error of one kind of quantized matmul (one `#[trace_quant]` site name, e.g.
/// `q4_1_matmul`), over every call it made in a session.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantSiteFigures {
    pub site: String,
    pub quant_type: QuantType,
    /// Calls compared (matmuls times forward passes).
    pub calls: usize,
    pub mean_cosine: f32,
    pub min_cosine: f32,
    /// Layer and forward-pass position of the call with `min_cosine`.
    pub worst_layer: usize,
    pub worst_position: Option<usize>,
    /// Lowest signal-to-noise ratio of any call, in dB.
    pub min_snr_db: f32,
}

/// One entry per site name, in the order the sites were first recorded.
pub fn quant_figures(tracer: &ModelTracer) -> Vec<QuantSiteFigures> {
    let mut figures: Vec<(QuantSiteFigures, f64)> = Vec::new();
    for pass in tracer.quant_traces() {
        for trace in &pass.traces {
            let entry = match figures.iter().position(|(f, _)| f.site == trace.site) {
                Some(i) => &mut figures[i],
                None => {
                    figures.push((
                        QuantSiteFigures {
                            site: trace.site.clone(),
                            quant_type: trace.quant_type,
                            calls: 0,
                            mean_cosine: 0.0,
                            min_cosine: f32::INFINITY,
                            worst_layer: trace.layer_idx,
                            worst_position: pass.position,
                            min_snr_db: f32::INFINITY,
                        },
                        0.0,
                    ));
                    let last = figures.len() - 1;
                    &mut figures[last]
                }
            };
            let (site, cosine_sum) = entry;
            site.calls += 1;
            *cosine_sum += f64::from(trace.cosine_similarity);
            if trace.cosine_similarity < site.min_cosine {
                site.min_cosine = trace.cosine_similarity;
                site.worst_layer = trace.layer_idx;
                site.worst_position = pass.position;
            }
            site.min_snr_db = site.min_snr_db.min(trace.snr_db);
        }
    }
    figures
        .into_iter()
        .map(|(mut site, cosine_sum)| {
            site.mean_cosine = (cosine_sum / site.calls as f64) as f32;
            site
        })
        .collect()
}

impl fmt::Display for QuantSiteFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {} calls, cosine mean {:.6} min {:.6} (layer {}",
            self.site,
            self.quant_type,
            self.calls,
            self.mean_cosine,
            self.min_cosine,
            self.worst_layer
        )?;
        if let Some(position) = self.worst_position {
            write!(f, ", position {position}")?;
        }
        write!(f, "), SNR min {:.1} dB", self.min_snr_db)
    }
}

//! `model-trace summary FILE`: the tracer's summary, as the run that wrote the file would have
//! printed it, and a table of the layers' outputs and times.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use trace_runtime::{Event, ModelTracer};

use crate::load::{self, InputError};
use crate::style::Colors;
use crate::Outcome;

/// One layer index over every pass.
#[derive(Debug, Default)]
struct LayerRow {
    calls: usize,
    mean_sum: f64,
    std_sum: f64,
    l2_sum: f64,
    max_abs: f32,
    non_finite: usize,
    duration_ns: u64,
}

pub(crate) fn run(path: &Path, colors: &Colors) -> Result<Outcome, InputError> {
    let mut tracer: Option<ModelTracer> = None;
    let mut layers: BTreeMap<usize, LayerRow> = BTreeMap::new();
    let (header, notes) = load::read(path, |header, event| {
        if let Event::Layer(layer) = &event {
            let row = layers.entry(layer.layer).or_default();
            row.calls += 1;
            row.duration_ns += layer.duration_ns;
            if let Some(output) = layer.stage("output") {
                let s = output.tensor.stats;
                row.mean_sum += f64::from(s.mean);
                row.std_sum += f64::from(s.std);
                row.l2_sum += f64::from(s.l2_norm);
                row.max_abs = row.max_abs.max(s.min.abs()).max(s.max.abs());
                row.non_finite += s.nan_count + s.inf_count;
            }
        }
        tracer
            .get_or_insert_with(|| ModelTracer::new(header.config.clone()))
            .accept(&event);
    })?;
    let tracer = tracer.unwrap_or_else(|| ModelTracer::new(header.config.clone()));
    let mut out = String::new();
    crate::list::describe_header(&mut out, path, &header, notes.bytes, colors)
        .map_err(|e| e.to_string())?;
    let _ = writeln!(out, "{}", tracer.summary());
    if !layers.is_empty() {
        let _ = writeln!(
            out,
            "\n{}",
            colors.bold("layer  calls  output mean    output std   max |x|      l2 norm      NaN/Inf  ms per call")
        );
        for (layer, row) in &layers {
            #[allow(clippy::cast_precision_loss)]
            let n = row.calls.max(1) as f64;
            let non_finite = if row.non_finite > 0 {
                colors.bad(&format!("{:>7}", row.non_finite))
            } else {
                format!("{:>7}", 0)
            };
            #[allow(clippy::cast_precision_loss)]
            let ms = row.duration_ns as f64 / n / 1e6;
            let _ = writeln!(
                out,
                "{layer:>5}  {:>5}  {:>+12.5e}  {:>11.5e}  {:>11.5e}  {:>11.5e}  {non_finite}  {ms:>11.3}",
                row.calls,
                row.mean_sum / n,
                row.std_sum / n,
                row.max_abs,
                row.l2_sum / n,
            );
        }
        let _ = writeln!(out, "{}", colors.dim("(output statistics averaged over the passes; max |x| is the largest over them; times include tracing's own work)"));
    }
    if let Some(cut) = &notes.truncated {
        let _ = writeln!(out, "{}", colors.warn(&format!("cut short: {cut}")));
    }
    print!("{out}");
    Ok(Outcome::Ok)
}

//! `model-trace summary FILE...`: the tracer's summary, as the run that wrote the file would have
//! printed it (with what the attention heads do), a table of the layers' outputs, times and
//! heads, and with routers each layer's expert load and narrowest choices.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use trace_runtime::{
    AttentionAnalysis, Event, ModelTracer, ModelTracerSummary, Specialization, TraceHeader,
};

use crate::command::Outcome;
use crate::header::describe_header;
use crate::input::{self, InputError, TraceRun};
use crate::router_load::{self, LayerLoad, RouterTally};
use crate::style::Colors;

/// One layer index over every pass.
#[derive(Debug, Default, Serialize)]
struct LayerRow {
    layer: usize,
    calls: usize,
    mean_sum: f64,
    std_sum: f64,
    l2_sum: f64,
    max_abs: f32,
    non_finite: usize,
    duration_ns: u64,
    /// Mean milliseconds per call.
    ms_per_call: f64,
    /// Its heads by specialization.
    heads: BTreeMap<Specialization, usize>,
}

/// What `summary --json` prints.
#[derive(Debug, Serialize)]
struct SummaryReport<'a> {
    /// The path given (a file, a directory, or a run's stem).
    file: &'a str,
    /// A run's rank files, in rank order.
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<Vec<&'a Path>>,
    header: &'a TraceHeader,
    summary: ModelTracerSummary,
    layers: Vec<LayerRow>,
    /// Per layer with routers: each expert's load, the imbalance, the narrowest margins, the
    /// tokens not routed to the top-k of their own scores; absent without router calls.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    routers: Vec<LayerLoad>,
    truncated: Option<&'a str>,
}

pub(crate) fn run(paths: &[PathBuf], json: bool, colors: &Colors) -> Result<Outcome, InputError> {
    let run = TraceRun::open(paths)?;
    run.warn_missing_ranks();
    let header = run.header();
    // The summary covers every record; keeping them would grow with the passes.
    let mut tracer = ModelTracer::summary_only(header.config.clone());
    let mut layers: BTreeMap<usize, LayerRow> = BTreeMap::new();
    let mut routers = RouterTally::default();
    let notes = input::read(&run, |_, event| {
        if let Event::Router(call) = &event {
            routers.accept(call);
        }
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
        tracer.accept(&event);
    })?;
    let mut summary = tracer.summary();
    // Said of a session's tracer: where its records went. Here they are in the file read.
    summary.summary_only = false;
    for (&layer, row) in &mut layers {
        row.layer = layer;
        #[allow(clippy::cast_precision_loss)]
        let n = row.calls.max(1) as f64;
        row.mean_sum /= n;
        row.std_sum /= n;
        row.l2_sum /= n;
        #[allow(clippy::cast_precision_loss)]
        let ms = row.duration_ns as f64 / n / 1e6;
        row.ms_per_call = ms;
        row.heads = heads_of(&summary.attention, layer);
    }
    if json {
        let truncated = notes.truncation();
        let report = SummaryReport {
            file: &run.label,
            files: run
                .is_ranked()
                .then(|| run.files.iter().map(|f| &*f.path).collect()),
            header,
            summary,
            layers: layers.into_values().collect(),
            routers: routers.layers(),
            truncated: truncated.as_deref(),
        };
        crate::output::emit_json(&report)?;
        return Ok(Outcome::Ok);
    }
    let mut out = String::new();
    describe_header(&mut out, &run, notes.bytes, colors).map_err(|e| e.to_string())?;
    let _ = writeln!(out, "{summary}");
    if !layers.is_empty() {
        let _ = writeln!(
            out,
            "\n{}",
            colors.bold("layer  calls  output mean    output std   max |x|      l2 norm      NaN/Inf  ms per call  heads")
        );
        for (layer, row) in &layers {
            let non_finite = if row.non_finite > 0 {
                colors.bad(&format!("{:>7}", row.non_finite))
            } else {
                format!("{:>7}", 0)
            };
            let _ = writeln!(
                out,
                "{layer:>5}  {:>5}  {:>+12.5e}  {:>11.5e}  {:>11.5e}  {:>11.5e}  {non_finite}  {:>11.3}  {}",
                row.calls,
                row.mean_sum,
                row.std_sum,
                row.max_abs,
                row.l2_sum,
                row.ms_per_call,
                describe_heads(&row.heads),
            );
        }
        let _ = writeln!(out, "{}", colors.dim("(output statistics averaged over the passes; max |x| is the largest over them; times include tracing's own work; heads by specialization, see the attention lines above)"));
    }
    if !routers.is_empty() {
        router_load::summary_text(&mut out, &routers.layers(), colors);
    }
    for cut in &notes.truncated {
        let _ = writeln!(out, "{}", colors.warn(&format!("cut short: {cut}")));
    }
    crate::output::emit(&out)?;
    Ok(Outcome::Ok)
}

/// A layer's heads by specialization.
fn heads_of(analysis: &AttentionAnalysis, layer: usize) -> BTreeMap<Specialization, usize> {
    let mut heads = BTreeMap::new();
    for head in analysis.heads.iter().filter(|h| h.layer == layer) {
        *heads.entry(head.specialization).or_default() += 1;
    }
    heads
}

/// `7 sink, 2 mixed`: the commonest first.
fn describe_heads(heads: &BTreeMap<Specialization, usize>) -> String {
    let mut counted: Vec<(&Specialization, &usize)> = heads.iter().collect();
    counted.sort_by_key(|&(s, n)| (std::cmp::Reverse(*n), *s));
    counted
        .iter()
        .map(|(s, n)| format!("{n} {}", s.short_name()))
        .collect::<Vec<_>>()
        .join(", ")
}

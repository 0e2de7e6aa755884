//! `model-trace report FILE... [--against REF] -o report.html`: one self-contained HTML page
//! (styles, script and data inlined; no network needed to view it) with plots of what the trace
//! holds: each stage's statistics through the layers, the layer outputs through the passes, what
//! the attention heads do, the logit evolution, the experts' load, quantization error, KV-cache
//! use, time, and with `--against` the error against a reference layer by layer (and the
//! routing, in `diff`'s text).

mod collect;

use std::io::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::args::ReportArgs;
use crate::command::Outcome;
use crate::comparison::split::{LayerSplit, PassSplit};
use crate::comparison::tokens::TokenVerdict;
use crate::comparison::{ComparedTraces, Floor, TensorJudgement, TraceComparison};
use crate::input::{self, InputError, TraceRun};
use crate::style::Colors;

const PAGE: &str = include_str!("report/page.html");
const CSS: &str = include_str!("report/page.css");
const JS: &str = include_str!("report/page.js");

/// The comparison with a reference, as the page shows it.
#[derive(Debug, Serialize)]
pub(crate) struct DiffData {
    reference: String,
    /// `diff`'s text output.
    text: String,
    first: Option<FirstDivergence>,
    /// The first pass where the two runs chose different next tokens, and the verdict.
    first_token: Option<FirstToken>,
    /// The pass of the per-layer curves.
    curve_pass: usize,
    /// Tensor names with a curve: the stages, then `attention` and `logits`.
    stages: Vec<String>,
    /// `[stage][layer]`: `difference / allowed` in `curve_pass` (null where not compared).
    ratios: Vec<Vec<Option<f64>>>,
    passes: Vec<PassRatio>,
    /// With `--floor`: the floor's error and this trace's, layer by layer.
    floor: Option<FloorData>,
    /// With `--quantized`: the error split, layer by layer.
    split: Option<SplitData>,
}

/// The error split of `curve_pass`, per layer its largest total, largest quantization part and
/// largest logic part, each of its own stage (`[layer]`, null where a layer has none split).
#[derive(Debug, Serialize)]
struct SplitData {
    /// The quantized run.
    quantized: String,
    /// The stage with the largest total.
    stages: Vec<Option<String>>,
    /// The largest `‖QUANTIZED − REF‖ / ‖REF‖`.
    total: Vec<Option<f64>>,
    /// The largest `‖QUANTIZED − THIS‖ / ‖REF‖`.
    quantization: Vec<Option<f64>>,
    /// The largest `‖THIS − REF‖ / ‖REF‖`.
    logic: Vec<Option<f64>>,
    /// The stage with the largest logic part.
    logic_stages: Vec<Option<String>>,
    /// The worst relative error of the layer's quantization records.
    quant_records: Vec<Option<f64>>,
    /// Whether every layer's parts are exact (else some are estimated from sketches).
    exact: bool,
}

/// The errors against the reference of a floor and of the trace, in `curve_pass`.
#[derive(Debug, Serialize)]
struct FloorData {
    /// The floor's trace.
    path: String,
    /// How many times the floor's error the trace may have.
    factor: f64,
    /// `[stage][layer]`, stages as `DiffData::stages`: the floor's error, the smallest rtol at
    /// which it is close to the reference (null where it has none).
    floor_rtols: Vec<Vec<Option<f64>>>,
    /// `[stage][layer]`: this trace's error, likewise (null where not compared, or where no
    /// rtol is enough).
    rtols: Vec<Vec<Option<f64>>>,
    /// `[stage][layer]`: the rtol the trace was allowed, the larger of the given one and
    /// `factor` times the floor's error.
    allowed_rtols: Vec<Vec<Option<f64>>>,
}

#[derive(Debug, Serialize)]
struct FirstDivergence {
    pass: usize,
    layer: usize,
    stage: String,
}

/// `diff`'s first token divergence, as the page shows it.
#[derive(Debug, Serialize)]
struct FirstToken {
    pass: usize,
    /// Where the runs part and what each chose (`diff`'s line).
    headline: String,
    /// `near_tie`, `divergence` or `unknown`.
    verdict: TokenVerdict,
    decisive_layer: Option<usize>,
}

#[derive(Debug, Serialize)]
struct PassRatio {
    pass: usize,
    worst_ratio: f64,
    diverged: usize,
}

/// A shape mismatch's infinite ratio, drawn at the top of the log scale.
const INFINITE_RATIO: f64 = 1e12;

pub(crate) fn run(args: &ReportArgs) -> Result<Outcome, InputError> {
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.files[0].with_extension("html"));
    let run = TraceRun::open(&args.files)?;
    run.warn_missing_ranks();
    let mut collector = collect::Collector::new(run.header());
    let mut events = 0usize;
    let notes = input::read(&run, |_, event| {
        events += 1;
        collector.accept(event);
    })?;
    if events == 0 {
        return Err(format!(
            "{}: no events after the header: nothing to report",
            run.label
        ));
    }
    let mut data = collector.finish(run.label.clone(), notes.bytes, notes.truncation());
    let mut outcome = Outcome::Ok;
    if let Some(reference) = &args.against {
        let against = match &args.files[..] {
            [one] => one,
            _ => {
                return Err(
                    "--against compares with one trace: give one file, directory or run".to_owned(),
                )
            }
        };
        let traces = ComparedTraces {
            reference,
            other: against,
            floor: args.floor.floor.as_deref().map(|path| Floor {
                path,
                factor: args.floor.floor_factor,
            }),
            quantized: args.split.quantized.as_deref(),
        };
        let comparison = TraceComparison::read(traces, args.compare.settings()?, args.pass)?;
        comparison.warn_unused_overrides();
        comparison.warn_stage_check();
        if comparison.diverged() {
            outcome = Outcome::Diverged;
        }
        let mut diff = diff_data(reference, &comparison);
        diff.split = args
            .split
            .quantized
            .as_deref()
            .map(|quantized| split_data(quantized, comparison.table_split()));
        data.diff = Some(diff);
    }
    let html = page(&data)?;
    crate::output::write_file(&output, |out| out.write_all(html.as_bytes()))?;
    let mut said = format!(
        "wrote {} ({}): {} passes, {} layers",
        output.display(),
        crate::output::file_size(html.len() as u64),
        data.passes.len(),
        data.layers
    );
    if let Some(diff) = &data.diff {
        match &diff.first {
            Some(f) => said.push_str(&format!(
                "; first divergence from {}: pass {}, layer {}, {}",
                diff.reference, f.pass, f.layer, f.stage
            )),
            None => said.push_str(&format!("; no divergence from {}", diff.reference)),
        }
    }
    said.push('\n');
    crate::output::emit(&said)?;
    Ok(outcome)
}

fn diff_data(reference: &Path, comparison: &TraceComparison) -> DiffData {
    let report = comparison.report();
    let curve_pass = report.table_pass;
    let pairs = comparison.table_pairs();
    let mut stages: Vec<String> = Vec::new();
    for judged in pairs {
        if !stages.contains(&judged.pair.name) {
            stages.push(judged.pair.name.clone());
        }
    }
    // `[stage][layer]` of one value of each compared tensor.
    let curves = |value: &dyn Fn(&TensorJudgement) -> Option<f64>| {
        let mut curves: Vec<Vec<Option<f64>>> = vec![Vec::new(); stages.len()];
        for judged in pairs {
            let at = stages.iter().position(|s| *s == judged.pair.name);
            let row = &mut curves[at.unwrap_or(0)];
            if row.len() <= judged.pair.layer {
                row.resize(judged.pair.layer + 1, None);
            }
            row[judged.pair.layer] = value(judged);
        }
        curves
    };
    let ratios = curves(&|judged| {
        let ratio = judged.pair.worst_ratio();
        Some(if ratio.is_finite() {
            ratio
        } else {
            INFINITE_RATIO
        })
    });
    let floor = comparison.floor().map(|(path, factor)| FloorData {
        path: path.to_owned(),
        factor,
        floor_rtols: curves(&|judged| judged.floor_rtol),
        rtols: curves(&|judged| judged.pair.least_rtol),
        allowed_rtols: curves(&|judged| judged.allowed_rtol),
    });
    DiffData {
        reference: reference.display().to_string(),
        text: report.text(&Colors::new(Some(false))),
        first: report.first_divergence.as_ref().map(|f| FirstDivergence {
            pass: f.pass,
            layer: f.layer,
            stage: f.stage.to_owned(),
        }),
        first_token: report.first_token_divergence.map(|t| FirstToken {
            pass: t.pass,
            headline: t.headline(),
            verdict: t.verdict,
            decisive_layer: t.decisive_layer,
        }),
        curve_pass,
        stages,
        ratios,
        passes: report
            .passes
            .iter()
            .map(|p| PassRatio {
                pass: p.pass,
                worst_ratio: p.worst_ratio.min(INFINITE_RATIO),
                diverged: p.diverged,
            })
            .collect(),
        floor,
        split: None,
    }
}

/// The split's per-layer curves.
fn split_data(quantized: &Path, split: &PassSplit) -> SplitData {
    let layers = split.layers();
    let count = layers.last().map_or(0, |row| row.layer + 1);
    let curve = |value: &dyn Fn(&LayerSplit<'_>) -> Option<f64>| {
        let mut curve = vec![None; count];
        for row in &layers {
            curve[row.layer] = value(row);
        }
        curve
    };
    let stages = |stage: &dyn for<'r> Fn(&'r LayerSplit<'_>) -> &'r str| {
        let mut stages = vec![None; count];
        for row in &layers {
            stages[row.layer] = Some(stage(row).to_owned());
        }
        stages
    };
    SplitData {
        quantized: quantized.display().to_string(),
        stages: stages(&|row| row.stage),
        total: curve(&|row| row.total),
        quantization: curve(&|row| row.worst_quantization),
        logic: curve(&|row| row.worst_logic),
        logic_stages: stages(&|row| row.worst_logic_stage),
        quant_records: curve(&|row| row.quant_records.map(|q| q.worst_relative_error)),
        exact: layers.iter().all(|row| row.exact),
    }
}

/// The page: the template with the styles, the script and the data (as JSON that cannot close
/// its `<script>` element) filled in.
fn page(data: &collect::ReportData) -> Result<String, InputError> {
    let json = serde_json::to_string(data).map_err(|e| format!("the report's data: {e}"))?;
    // `</` inside a script element would end it; `<\/` is the same JSON string.
    let json = json.replace("</", "<\\/");
    let generator = format!("model-trace {}", env!("CARGO_PKG_VERSION"));
    Ok(PAGE
        .replace("{{TITLE}}", &escape_html(&data.title))
        .replace("{{GENERATOR}}", &generator)
        .replace("{{CSS}}", CSS)
        .replace("{{JS}}", JS)
        .replace("{{DATA}}", &json))
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

//! The command line: each subcommand's arguments as clap parses them, and the comparison
//! options they stand for (`diff`, `report --against`).

use std::ffi::OsStr;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgGroup, Args, Command as ClapCommand, Parser, Subcommand, ValueEnum};
use trace_runtime::compare::by_position::DEFAULT_ROW_RTOL;
use trace_runtime::compare::{
    CompareOptions, ErrorStat, NameMap, Tolerances, DEFAULT_ERROR_QUANTILE,
};

use crate::comparison::default_tolerance::ToleranceChoice;
use crate::comparison::CompareSettings;
use crate::input::InputError;

/// Read model-trace trace files: what one holds, its summary, whether its stages mean what
/// their names say, where it diverges from a reference, a page of plots, or a timeline for
/// Perfetto.
#[derive(Debug, Parser)]
#[command(name = "model-trace", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// Colour: auto (when the output is a terminal and NO_COLOR is unset), always or never.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub(crate) color: ColorChoice,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ColorChoice {
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// `Some` when colour is forced on or off, `None` for auto.
    pub(crate) fn forced(self) -> Option<bool> {
        match self {
            Self::Auto => None,
            Self::Always => Some(true),
            Self::Never => Some(false),
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The header, tracepoints, passes and events of a trace.
    List {
        /// The trace file; or the rank files of one run, several files, a directory of them
        /// or the path the run was asked to write (`trace.ndjson` for `trace.rank0.ndjson`,
        /// ...), merged pass by pass.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// The tracer's summary (anomalies, what the attention heads do, KV cache, quantization)
    /// and a per-layer table of the layers' outputs, times and heads.
    Summary {
        /// The trace file, or the rank files of one run (as for `list`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the summary as JSON on stdout (header, tracer summary with the attention
        /// analysis, per-layer table).
        #[arg(long)]
        json: bool,
    },
    /// Check that each layer's stages obey the identities their names promise (`resid_mid =
    /// input + attention branch`, `output = resid_mid + MLP branch`, a norm stage a norm of
    /// the stage before it): on the captured values where the stages were captured, through
    /// the sketches elsewhere. Exit 0: every identity checked holds; 1: one fails (a stage
    /// recorded on the wrong line, or a map of a family that means something else).
    Check {
        /// The trace file, or the rank files of one run (as for `list`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the result as JSON on stdout (per identity the counts and the largest errors,
        /// the failures).
        #[arg(long)]
        json: bool,
    },
    /// Compare a trace with a reference: the first divergence in execution order, what differs
    /// there and by how much, the error layer by layer, and the first pass where the two runs
    /// chose different next tokens (a near-tie or a divergence). With no --atol, --rtol or
    /// --check-error-stat, the tolerance is chosen from the two headers' precisions
    /// (metadata.precision) and the output says which and why: the same F32 weights, norm at
    /// rtol 1e-4; quantized weights on either side, norm at rtol 0.15; else elementwise 1e-5.
    /// Exit 0: nothing diverged; 1: a tensor diverged or a routing layer is flagged (a token
    /// routed differently past the logit error, weights or the router's own logits off).
    Diff(DiffArgs),
    /// One self-contained HTML page of plots: each stage through the layers, the outputs
    /// through the passes, the attention heads, logit evolution, quantization error, KV cache,
    /// time, and with --against the error against a reference layer by layer.
    Report(ReportArgs),
    /// A timeline in the Chrome trace event format, for Perfetto (ui.perfetto.dev) or
    /// chrome://tracing: passes and layers as nested spans per thread, anomalies as instants.
    Chrome {
        /// Trace files, or directories of them, or the path a run of several ranks was asked
        /// to write; every session is on one timeline, ranks and threads as tracks of their
        /// processes.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The JSON file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
}

/// Options of `diff`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The reference trace (for example written by PyTorch through the Python package): a
    /// file, or the ranks of a run (a directory of its files, or the path it was asked to
    /// write: `trace.ndjson` for `trace.rank0.ndjson`, ...), merged pass by pass.
    pub(crate) reference: PathBuf,
    /// The trace compared with it (a file or a run, likewise). With --batch, REFERENCE and
    /// OTHER are the batch's prompts each run alone, one a row, in the batch's row order.
    #[arg(required_unless_present = "batch")]
    pub(crate) other: Vec<PathBuf>,
    #[command(flatten)]
    pub(crate) compare: CompareArgs,
    #[command(flatten)]
    pub(crate) split: SplitArgs,
    /// Pair the traces' layer tensors row by row at each token's position (sequence, position,
    /// layer, stage) instead of pass by pass: for two runs of one model that computed the same
    /// tokens in other passes (one prefill against a prefill and decode steps, chunks against
    /// the whole). Needs traces recorded with row summaries (the examples' --rows); chosen by
    /// itself when both traces have them and their passes differ.
    #[arg(long, conflicts_with_all = ["isolated", "floor", "quantized"])]
    pub(crate) by_position: bool,
    /// A batch's trace (left-padded prompts decoded together), compared row by row with each
    /// prompt's run alone (REFERENCE, OTHER...), by position, padding left out. Needs row
    /// summaries, as --by-position.
    #[arg(
        long,
        value_name = "BATCH",
        conflicts_with_all = ["isolated", "floor", "quantized"]
    )]
    pub(crate) batch: Option<PathBuf>,
    /// The largest relative L2 error of a row (estimated from the rows' sketches) in a
    /// comparison by position or of a batch.
    #[arg(
        long,
        value_name = "RTOL",
        default_value_t = DEFAULT_ROW_RTOL,
        value_parser = row_tolerance
    )]
    pub(crate) row_rtol: f64,
    /// The pass whose per-layer table is shown (default: the first divergence's, else the
    /// one with the largest error).
    #[arg(long)]
    pub(crate) pass: Option<usize>,
    /// The port run again with every layer fed the reference's captured input
    /// (`MODEL_TRACE_ISOLATE=REFERENCE`): shows each layer's error inherited from the layers
    /// before it (OTHER) beside its own (ISOLATED), names the first layer whose own error
    /// leaves the tolerance, and exits 1 only if one does (or a routing layer is flagged).
    #[arg(long, value_name = "ISOLATED")]
    pub(crate) isolated: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) floor: FloorArgs,
    /// Write the result as JSON on stdout instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Options of `report`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("floored").arg("floor").requires("against")))]
#[command(group(ArgGroup::new("split").arg("quantized").requires("against")))]
pub(crate) struct ReportArgs {
    /// The trace file, or the rank files of one run (as for `list`).
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// A reference trace to compare with (as `diff REF FILE` would).
    #[arg(long, value_name = "REF")]
    pub(crate) against: Option<PathBuf>,
    /// The page to write (default: the first FILE with the extension .html).
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) compare: CompareArgs,
    #[command(flatten)]
    pub(crate) split: SplitArgs,
    /// With --against, the pass of the per-layer error curve (default: the first divergence's,
    /// else the one with the largest error).
    #[arg(long)]
    pub(crate) pass: Option<usize>,
    #[command(flatten)]
    pub(crate) floor: FloorArgs,
}

/// A second implementation's trace that sets the tolerances (`diff`, `report --against`).
#[derive(Debug, Args)]
pub(crate) struct FloorArgs {
    /// A second implementation's trace of the same model and input, trusted (for example
    /// llama.cpp's, against a reference from transformers), that sets the tolerance tensor by
    /// tensor: the floor's error is the smallest rtol at which FLOOR is close to the reference
    /// (with the same atol and --check-error-stat), and the compared trace is judged with the
    /// larger of the given rtol and --floor-factor times that. Where a trace is compared with
    /// the reference by summaries (one side not captured, or --summaries-only), its error is
    /// the smallest rtol at which every summary is within the bound that rtol implies (marked
    /// ≈: a lower bound on the captures' under elementwise and norm, an estimate under the
    /// others). A tensor FLOOR lacks, has in another shape, or is close at no rtol keeps the
    /// given rtol, and a warning names it. `diff --isolated` judges the isolated run by the
    /// same tolerances; `report` needs --against and plots the floor's error beside the
    /// trace's, layer by layer.
    #[arg(long, value_name = "FLOOR")]
    pub(crate) floor: Option<PathBuf>,
    /// With --floor, how many times the floor's error the compared trace may have (a number
    /// above 0).
    #[arg(
        long,
        value_name = "K",
        requires = "floor",
        allow_negative_numbers = true,
        default_value_t = DEFAULT_FLOOR_FACTOR,
        value_parser = floor_factor
    )]
    pub(crate) floor_factor: f64,
}

/// The error of a quantized port split into the quantization's part and the logic's (`diff`,
/// `report --against`).
#[derive(Debug, Args)]
pub(crate) struct SplitArgs {
    /// The compared trace's program again, on its quantized weights (OTHER is then the port on
    /// the weights REFERENCE uses, dequantized: candle's CANDLE_DEQUANTIZE_ALL=1, the examples'
    /// --dequantize). Per layer of the table's pass, its stage with the largest total error
    /// (QUANTIZED against REFERENCE) split into the quantization's part (QUANTIZED against
    /// OTHER) and the logic's (OTHER against REFERENCE), each ‖·‖/‖REFERENCE‖, the larger
    /// named, beside the layer's quantization records where QUANTIZED has some; the identity
    /// total = quantization + logic is checked on the values. Exact where all three captured
    /// the tensor, else estimated from the sketches (≈). The verdict stays OTHER's against
    /// REFERENCE (the logic, at the tight tolerance); a warning where QUANTIZED's header does
    /// not say it is quantized or OTHER's that it is not. `report` plots the three per layer.
    #[arg(long, value_name = "QUANTIZED")]
    pub(crate) quantized: Option<PathBuf>,
}

/// `--floor-factor`'s default.
const DEFAULT_FLOOR_FACTOR: f64 = 2.0;

/// `--floor-factor K`: a finite number above 0.
fn floor_factor(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(k) if k.is_finite() && k > 0.0 => Ok(k),
        _ => Err("must be a finite number above 0".to_owned()),
    }
}

/// How two traces are compared (`diff`, `report --against`).
///
/// Given none of --atol, --rtol and --check-error-stat, the comparison chooses its tolerance
/// from the two headers' precisions (`metadata.precision`) and says which and why: the same
/// F32 weights on both sides, the norm criterion at rtol 1e-4 (float rounding); quantized
/// weights on either side, the norm criterion at rtol 0.15 (the quantization's noise); anything
/// else (F32 against BF16, a header that does not say), elementwise at 1e-5. Any of the three
/// given, the flags decide (the others at that built-in default).
#[derive(Debug, Args)]
pub(crate) struct CompareArgs {
    /// Absolute tolerance, `VALUE` or `NAME:VALUE` for the tensors whose full name
    /// (`layer.3.mlp_out`, `layer.30.logits`) matches the glob NAME; repeatable, the last
    /// matching override wins; an override that matches no tensor of either trace is a
    /// warning. Default: chosen from the headers' precisions (0 for the same F32 weights on both
    /// sides, else 1e-5); with --rtol or --check-error-stat given, 1e-5 unless this sets it.
    #[arg(long, value_name = "[NAME:]VALUE")]
    atol: Vec<String>,
    /// Relative tolerance (times the reference's magnitude), like --atol. Default: chosen from
    /// the headers' precisions (1e-4 for the same F32 weights on both sides, 1e-3 when one of
    /// them is llama.cpp, 0.15 with quantized weights on either, else 1e-5); with --atol or
    /// --check-error-stat given, 1e-5 unless this sets it.
    #[arg(long, value_name = "[NAME:]VALUE")]
    rtol: Vec<String>,
    /// Which statistic of the error decides (for captured tensors; summaries are checked
    /// against the bounds it implies): `STAT`, or `NAME:STAT` for the tensors whose full name
    /// matches the glob NAME, like --atol. Default: chosen from the headers' precisions (norm
    /// for the same F32 weights or quantized ones, else elementwise); with --atol or --rtol
    /// given, elementwise unless this sets it.
    #[arg(long, value_name = "[NAME:]STAT", value_parser = ErrorStatArgument)]
    check_error_stat: Vec<String>,
    /// The quantile for `--check-error-stat quantile`.
    #[arg(long, default_value_t = DEFAULT_ERROR_QUANTILE)]
    error_quantile: f64,
    /// Rename tensors before matching: a preset (`llama`, `bert`: transformers' module names as
    /// the Python package records them with names="modules" or as converted debugger traces
    /// have them) or a file of `FROM = TO` lines (`{i}` stands for a layer index); repeatable.
    #[arg(long, value_name = "PRESET|FILE")]
    map: Vec<String>,
    /// Compare summaries even where both tensors were captured in full.
    #[arg(long)]
    summaries_only: bool,
}

impl CompareArgs {
    /// The runtime's comparison options (reading `--map` files), and the tolerance decided
    /// where --atol, --rtol or --check-error-stat is given (else it is chosen from the
    /// traces' headers).
    pub(crate) fn settings(&self) -> Result<CompareSettings, InputError> {
        let given =
            !(self.atol.is_empty() && self.rtol.is_empty() && self.check_error_stat.is_empty());
        Ok(CompareSettings {
            options: self.options()?,
            choice: given.then(ToleranceChoice::given),
        })
    }

    /// The runtime's comparison options (reading `--map` files), the tolerances as given.
    fn options(&self) -> Result<CompareOptions, InputError> {
        let mut options = CompareOptions {
            use_captures: !self.summaries_only,
            ..CompareOptions::default()
        };
        for atol in &self.atol {
            options
                .tolerances
                .add_atol(atol)
                .map_err(|e| e.to_string())?;
        }
        for rtol in &self.rtol {
            options
                .tolerances
                .add_rtol(rtol)
                .map_err(|e| e.to_string())?;
        }
        for stat in &self.check_error_stat {
            options
                .tolerances
                .add_error_stat(stat)
                .map_err(|e| e.to_string())?;
        }
        self.set_quantile(&mut options.tolerances)?;
        let mut names = NameMap::identity();
        for map in &self.map {
            let rules = match NameMap::preset(map) {
                Some(preset) => preset,
                None => {
                    let text = std::fs::read_to_string(map).map_err(|e| {
                        format!(
                            "--map {map}: not a preset ({}) and not a readable file: {e}",
                            NameMap::PRESETS.join(", ")
                        )
                    })?;
                    NameMap::parse(&text).map_err(|e| format!("--map {map}: {e}"))?
                }
            };
            names = names.then(rules);
        }
        options.names = names;
        Ok(options)
    }

    /// Gives every `quantile` statistic, the default's and the overrides', `--error-quantile`.
    fn set_quantile(&self, tolerances: &mut Tolerances) -> Result<(), InputError> {
        let overrides = tolerances.error_stat_overrides.iter_mut();
        let stats = std::iter::once(&mut tolerances.error_stat).chain(overrides.map(|(_, s)| s));
        for stat in stats {
            if let ErrorStat::Quantile(q) = stat {
                if !(0.0..=1.0).contains(&self.error_quantile) {
                    return Err(format!(
                        "--error-quantile must be in [0, 1], not {}",
                        self.error_quantile
                    ));
                }
                *q = self.error_quantile;
            }
        }
        Ok(())
    }
}

/// `--check-error-stat [NAME:]STAT`, checked as [`Tolerances::add_error_stat`] reads it; the
/// statistics, for `--help` and completions, are [`ErrorStat::ALL`]'s.
#[derive(Debug, Clone, Copy)]
struct ErrorStatArgument;

impl TypedValueParser for ErrorStatArgument {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &ClapCommand,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        let text = value.to_string_lossy();
        let checked = Tolerances::default().add_error_stat(&text);
        checked.map(|()| text.clone().into_owned()).map_err(|_| {
            let mut error = clap::Error::new(ErrorKind::InvalidValue).with_cmd(cmd);
            let arg = arg.map_or_else(|| "--check-error-stat".to_owned(), ToString::to_string);
            let names = ErrorStat::ALL.iter().map(|s| s.name().to_owned()).collect();
            error.insert(ContextKind::InvalidArg, ContextValue::String(arg));
            error.insert(
                ContextKind::InvalidValue,
                ContextValue::String(text.into_owned()),
            );
            error.insert(ContextKind::ValidValue, ContextValue::Strings(names));
            error
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(ErrorStat::ALL.into_iter().map(|stat| {
            PossibleValue::new(stat.name()).help(stat.description())
        })))
    }
}

/// `--row-rtol`: a number of at least 0 (a NaN would let every row pass).
fn row_tolerance(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rtol) if rtol >= 0.0 => Ok(rtol),
        _ => Err(format!("`{text}` is not a number of at least 0")),
    }
}

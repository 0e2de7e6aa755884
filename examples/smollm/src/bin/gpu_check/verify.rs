//! `gpu_check verify`: what model-trace records of tensors on the device, against what it
//! records of the same tensors on the CPU.
//!
//! Each case is built on the CPU (values drawn or chosen, converted there to its element type),
//! copied to the device, and the same view (transposed, narrowed, broadcast) taken on both
//! sides. Both are recorded through the public API, as the input of a `#[trace_layer]` whose
//! index is the case's number, into a sink of ours ([`Collect`]) that keeps the layer events:
//!
//! * with `DigestPolicy::Off`, for the statistics: a device tensor's are reduced on the device
//!   (`TraceTensor::stats`), a CPU tensor's on the host;
//! * with `DigestPolicy::Always`, for the digests: fingerprint, sketch and samples of the
//!   values read back from the device.
//!
//! Counts (elements, NaN, ±Inf) and min/max must be exact (as numbers: −0 equals +0); mean,
//! std and l2 norm within the relative tolerances below (both sides sum in `f64`, from a shift
//! near the mean, in different orders, and round to `f32`); fingerprint, sketch and samples bit
//! for bit. A side that was not
//! recorded (model-trace could not read it) fails its case; a case that candle cannot make on
//! the device (CUDA may refuse to allocate an empty tensor: the empty views of non-empty
//! tensors are cases of their own) is skipped, with candle's error, and counted apart. With
//! `--device cpu` both sides are the CPU: the plumbing is exercised, the comparison is
//! trivial.

use std::borrow::Cow;
use std::sync::mpsc;

use candle_core::{DType, Device, Tensor};
use model_trace::{
    trace_layer, trace_model, DigestPolicy, Event, ModelTracerConfig, Session, SinkError, Stage,
    TensorStats, TensorSummary, TraceSink,
};
use serde_json::json;

use crate::args::VerifyArgs;
use crate::device;
use crate::model::Draws;
use crate::{write_json, Failure};

/// `|mean − mean_cpu| ≤ MEAN_RTOL · rms_cpu`, the root mean square of the finite values
/// (`l2 / √finite`): relative to the values' size, so that a mean near zero is not judged
/// against zero. Two roundings to `f32` apart, what two exact reductions rounded differently give.
const MEAN_RTOL: f64 = 2.5e-7;
/// `|std − std_cpu| ≤ STD_RTOL · max(std_cpu, ε·|mean_cpu|)`, ε = `f32::EPSILON`: no spread
/// below the values' own rounding is asked for.
const STD_RTOL: f64 = 2.5e-7;
/// `|l2 − l2_cpu| ≤ L2_RTOL · l2_cpu`.
const L2_RTOL: f64 = 2.5e-7;

/// How a case's tensor is seen: the whole base tensor or a view of it.
#[derive(Debug, Clone)]
enum View {
    Whole,
    /// The last two dimensions swapped.
    Transposed,
    /// `len` entries of dimension `dim` from `start`.
    Narrowed {
        dim: usize,
        start: usize,
        len: usize,
    },
    /// Broadcast to this shape (stride 0 along the broadcast dimensions).
    Broadcast(Vec<usize>),
}

impl View {
    fn apply(&self, base: Tensor) -> candle_core::Result<Tensor> {
        match self {
            Self::Whole => Ok(base),
            Self::Transposed => base.t(),
            Self::Narrowed { dim, start, len } => base.narrow(*dim, *start, *len),
            Self::Broadcast(shape) => base.broadcast_as(shape.as_slice()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Whole => "whole".into(),
            Self::Transposed => "transposed".into(),
            Self::Narrowed { dim, start, len } => {
                format!("narrowed dim {dim} {start}..{}", start + len)
            }
            Self::Broadcast(shape) => format!("broadcast to {shape:?}"),
        }
    }
}

/// One tensor to compare: base values in a shape, the element type, the view.
struct Case {
    name: &'static str,
    dtype: DType,
    shape: Vec<usize>,
    values: Vec<f32>,
    view: View,
}

impl Case {
    fn new(name: &'static str, dtype: DType, shape: &[usize], values: Vec<f32>) -> Self {
        Self {
            name,
            dtype,
            shape: shape.to_vec(),
            values,
            view: View::Whole,
        }
    }

    fn view(self, view: View) -> Self {
        Self { view, ..self }
    }

    /// The case's tensor on `device`: converted on the CPU, then copied, then viewed.
    fn build(&self, device: &Device) -> candle_core::Result<Tensor> {
        let base = Tensor::from_vec(self.values.clone(), self.shape.as_slice(), &Device::Cpu)?
            .to_dtype(self.dtype)?
            .to_device(device)?;
        self.view.apply(base)
    }
}

/// `n` values uniform in ±`scale`, drawn from `stream`.
fn random(n: usize, stream: u64, scale: f32) -> Vec<f32> {
    let mut draws = Draws::new(0x7e57, stream);
    (0..n).map(|_| scale * draws.symmetric()).collect()
}

/// `random` with NaN and ±Inf among the values.
fn with_specials(n: usize, stream: u64) -> Vec<f32> {
    let mut values = random(n, stream, 3.0);
    for (i, special) in [(3, f32::NAN), (7, f32::INFINITY), (11, f32::NEG_INFINITY)] {
        values[i] = special;
    }
    values[n - 1] = f32::NAN;
    values
}

fn cases() -> Vec<Case> {
    use DType::{BF16, F16, F32};
    const MILLION: usize = 1 << 20;
    let ramp: Vec<f32> = (0..32).map(|i| i as f32 * 0.25 - 2.0).collect();
    let offset: Vec<f32> = random(4096, 3, 0.01).iter().map(|v| 1000.0 + v).collect();
    vec![
        Case::new("ramp", F32, &[4, 8], ramp.clone()),
        Case::new("random", F32, &[64, 576], random(64 * 576, 1, 3.0)),
        Case::new("mean 1000, spread 0.01", F32, &[4096], offset),
        Case::new("NaN and ±Inf", F32, &[1000], with_specials(1000, 4)),
        Case::new("all NaN", F32, &[16], vec![f32::NAN; 16]),
        Case::new(
            "only ±Inf",
            F32,
            &[8],
            [f32::INFINITY, f32::NEG_INFINITY].repeat(4),
        ),
        Case::new("empty", F32, &[0], Vec::new()),
        Case::new("empty rows", F32, &[4, 0], Vec::new()),
        Case::new("ramp", F32, &[4, 8], ramp).view(View::Narrowed {
            dim: 1,
            start: 3,
            len: 0,
        }),
        Case::new("scalar", F32, &[], vec![-2.5]),
        Case::new("subnormal", F32, &[256], random(256, 5, 1e-39)),
        Case::new("1M", F32, &[1024, 1024], random(MILLION, 6, 2.0)),
        Case::new("random", F32, &[48, 64], random(48 * 64, 7, 1.0)).view(View::Transposed),
        Case::new("NaN and ±Inf", F32, &[32, 40], with_specials(32 * 40, 8)).view(View::Transposed),
        Case::new("random", F32, &[32, 100], random(3200, 9, 1.0)).view(View::Narrowed {
            dim: 1,
            start: 10,
            len: 40,
        }),
        Case::new("random", F32, &[1, 64], random(64, 10, 1.0)).view(View::Broadcast(vec![16, 64])),
        Case::new("random", F16, &[64, 576], random(64 * 576, 11, 3.0)),
        Case::new("NaN and ±Inf", F16, &[1000], with_specials(1000, 12)),
        Case::new("1M", F16, &[1024, 1024], random(MILLION, 13, 2.0)),
        Case::new("random", F16, &[48, 64], random(48 * 64, 14, 1.0)).view(View::Transposed),
        Case::new("random", F16, &[1, 64], random(64, 15, 1.0)).view(View::Broadcast(vec![16, 64])),
        Case::new("random", BF16, &[64, 576], random(64 * 576, 16, 3.0)),
        Case::new("NaN and ±Inf", BF16, &[1000], with_specials(1000, 17)),
        Case::new("1M", BF16, &[1024, 1024], random(MILLION, 18, 2.0)),
        Case::new("random", BF16, &[32, 100], random(3200, 19, 1.0)).view(View::Narrowed {
            dim: 1,
            start: 10,
            len: 40,
        }),
    ]
}

/// Records each tensor as the input of the layer whose index is its place in `tensors`, in one
/// forward pass.
#[trace_model(name = "verify")]
fn record_all(tensors: &[Option<Tensor>]) {
    for (index, tensor) in tensors.iter().enumerate() {
        if let Some(tensor) = tensor {
            probe(tensor, index);
        }
    }
}

/// One case: `#[trace_layer]` records its first tensor argument as the layer's input.
#[trace_layer(index = index)]
fn probe(tensor: &Tensor, index: usize) {
    let _ = (tensor, index);
}

/// A sink that hands the session's layer and error events over a channel.
struct Collect(mpsc::Sender<Event>);

impl TraceSink for Collect {
    fn name(&self) -> Cow<'_, str> {
        "gpu_check verify".into()
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        if matches!(event, Event::Layer(_) | Event::Error(_)) {
            self.0.send(event.clone())?;
        }
        Ok(())
    }

    fn wants_digests(&self) -> bool {
        true
    }
}

/// What was recorded of each tensor (by index), or why nothing was.
fn record(
    tensors: &[Option<Tensor>],
    digests: DigestPolicy,
) -> Result<Vec<Result<TensorSummary, String>>, Failure> {
    let (sender, receiver) = mpsc::channel();
    let config = ModelTracerConfig {
        digests,
        ..ModelTracerConfig::lightweight()
    };
    let session = Session::builder(config)
        .sink(Collect(sender))
        .start()
        .map_err(|e| Failure::Setup(format!("the session does not start: {e}")))?;
    record_all(tensors);
    let (_, errors) = session.finish_with_errors();
    let mut recorded: Vec<Result<TensorSummary, String>> = tensors
        .iter()
        .map(|tensor| match tensor {
            None => Err("not built".to_owned()),
            Some(_) if errors.is_empty() => Err("no record".to_owned()),
            Some(_) => Err(format!(
                "no record; session errors: {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        })
        .collect();
    for event in receiver.try_iter() {
        match event {
            Event::Layer(layer) => {
                let input = layer.stage(Stage::Input.as_str()).map(|s| s.tensor.clone());
                if let (Some(slot), Some(input)) = (recorded.get_mut(layer.layer), input) {
                    *slot = Ok(input);
                }
            }
            Event::Error(error) => {
                if let Some(Err(reason)) = error.layer.and_then(|i| recorded.get_mut(i)) {
                    *reason = format!("not recorded: {}", error.message);
                }
            }
            _ => {}
        }
    }
    Ok(recorded)
}

/// One comparison of a case.
#[derive(Debug, Clone, Copy)]
struct Checks {
    counts: bool,
    min_max: bool,
    mean_rel: f64,
    std_rel: f64,
    l2_rel: f64,
    fingerprint: bool,
    sketch: bool,
    samples: bool,
}

impl Checks {
    fn compare(
        cpu: &TensorStats,
        device: &TensorStats,
        cpu_digest: &TensorSummary,
        device_digest: &TensorSummary,
    ) -> Self {
        let same = |a: f32, b: f32| a == b || (a.is_nan() && b.is_nan());
        let relative = |a: f32, b: f32, scale: f64| {
            if same(a, b) {
                0.0
            } else {
                (f64::from(a) - f64::from(b)).abs() / scale.max(f64::from(f32::MIN_POSITIVE))
            }
        };
        let (mean, std) = (f64::from(cpu.mean), f64::from(cpu.std));
        let rms = f64::from(cpu.l2_norm) / (cpu.finite_count().max(1) as f64).sqrt();
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        // Samples as the trace file keeps them: every NaN is one (`"NaN"`), whatever its bits.
        let samples = |values: &[f32]| {
            values
                .iter()
                .map(|&v| model_trace::canonical_bits(v))
                .collect::<Vec<_>>()
        };
        Self {
            counts: (cpu.count, cpu.nan_count, cpu.inf_count)
                == (device.count, device.nan_count, device.inf_count),
            min_max: same(cpu.min, device.min) && same(cpu.max, device.max),
            mean_rel: relative(device.mean, cpu.mean, rms),
            std_rel: relative(
                device.std,
                cpu.std,
                std.max(f64::from(f32::EPSILON) * mean.abs()),
            ),
            l2_rel: relative(device.l2_norm, cpu.l2_norm, f64::from(cpu.l2_norm)),
            fingerprint: cpu_digest.fingerprint.is_some()
                && cpu_digest.fingerprint == device_digest.fingerprint,
            sketch: match (&cpu_digest.sketch, &device_digest.sketch) {
                (Some(a), Some(b)) => bits(&a.0) == bits(&b.0),
                _ => false,
            },
            samples: samples(&cpu_digest.head) == samples(&device_digest.head)
                && samples(&cpu_digest.tail) == samples(&device_digest.tail),
        }
    }

    fn statistics_pass(&self) -> bool {
        self.counts
            && self.min_max
            && self.mean_rel <= MEAN_RTOL
            && self.std_rel <= STD_RTOL
            && self.l2_rel <= L2_RTOL
    }

    fn digest_pass(&self) -> bool {
        self.fingerprint && self.sketch && self.samples
    }
}

/// What became of a case.
enum Outcome {
    /// Both sides were recorded and compared.
    Compared(Checks),
    /// Candle cannot make the tensor on the device (an empty one, on CUDA), so there is
    /// nothing of model-trace's to check.
    Skipped(String),
    /// A side was not recorded: model-trace failed to read it.
    Unrecorded(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    Skip,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::Skip => "skip",
        }
    }
}

/// A case and its outcome.
struct Row<'a> {
    case: &'a Case,
    /// The viewed tensor's shape.
    shape: Vec<usize>,
    cpu: Option<TensorStats>,
    device: Option<TensorStats>,
    outcome: Outcome,
}

impl Row<'_> {
    fn verdict(&self) -> Verdict {
        match &self.outcome {
            Outcome::Compared(c) if c.statistics_pass() && c.digest_pass() => Verdict::Pass,
            Outcome::Compared(_) | Outcome::Unrecorded(_) => Verdict::Fail,
            Outcome::Skipped(_) => Verdict::Skip,
        }
    }
}

pub fn run(args: &VerifyArgs) -> Result<(), Failure> {
    crate::require_tracing("verify")?;
    let opened = device::open(args.device)?;
    let cases = cases();
    let cpu: Vec<Option<Tensor>> = cases
        .iter()
        .map(|case| case.build(&Device::Cpu).map(Some))
        .collect::<candle_core::Result<_>>()?;
    let mut build_errors = vec![None; cases.len()];
    let device: Vec<Option<Tensor>> = cases
        .iter()
        .zip(&mut build_errors)
        .map(|(case, error)| match case.build(&opened.device) {
            Ok(tensor) => Some(tensor),
            Err(e) => {
                *error = Some(format!("cannot build it on {}: {e}", opened.name));
                None
            }
        })
        .collect();
    opened.device.synchronize()?;
    let cpu_stats = record(&cpu, DigestPolicy::Off)?;
    let device_stats = record(&device, DigestPolicy::Off)?;
    let cpu_digests = record(&cpu, DigestPolicy::Always)?;
    let device_digests = record(&device, DigestPolicy::Always)?;
    let rows: Vec<Row<'_>> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let shape = cpu[i].as_ref().map_or_else(Vec::new, |t| t.dims().to_vec());
            let outcome = match (&build_errors[i], &cpu_stats[i], &device_stats[i]) {
                (Some(error), ..) => Outcome::Skipped(error.clone()),
                (None, Ok(c), Ok(d)) => match (&cpu_digests[i], &device_digests[i]) {
                    (Ok(cd), Ok(dd)) => {
                        Outcome::Compared(Checks::compare(&c.stats, &d.stats, cd, dd))
                    }
                    (Err(e), _) => Outcome::Unrecorded(format!("cpu, digests: {e}")),
                    (_, Err(e)) => Outcome::Unrecorded(format!("{}, digests: {e}", opened.name)),
                },
                (None, Err(e), _) => Outcome::Unrecorded(format!("cpu: {e}")),
                (None, _, Err(e)) => Outcome::Unrecorded(format!("{}: {e}", opened.name)),
            };
            Row {
                case,
                shape,
                cpu: cpu_stats[i].as_ref().ok().map(|s| s.stats),
                device: device_stats[i].as_ref().ok().map(|s| s.stats),
                outcome,
            }
        })
        .collect();
    print_table(&rows, opened.name);
    if let Some(path) = &args.json {
        write_json(path, &to_json(&rows, opened.name))?;
    }
    let count = |verdict| rows.iter().filter(|row| row.verdict() == verdict).count();
    let (passed, failed, skipped) = (
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Skip),
    );
    let skipped_note = if skipped > 0 {
        format!(
            "; {skipped} skipped: candle cannot make them on {}",
            opened.name
        )
    } else {
        String::new()
    };
    if passed == 0 && failed == 0 {
        Err(Failure::Setup(format!(
            "no case could be built on {}",
            opened.name
        )))
    } else if failed == 0 {
        println!("verify: all {passed} cases compared match{skipped_note}");
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "{failed} of {} cases differ between the CPU and {}{skipped_note}",
            passed + failed,
            opened.name
        )))
    }
}

fn mark(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "DIFF"
    }
}

/// A relative error, marked when it is over its tolerance.
fn relative_cell(error: f64, tolerance: f64) -> String {
    let value = if error == 0.0 {
        "0".to_owned()
    } else {
        format!("{error:.1e}")
    };
    if error <= tolerance {
        value
    } else {
        format!("{value} DIFF")
    }
}

fn print_table(rows: &[Row<'_>], device: &str) {
    println!(
        "gpu_check verify: cpu against {device}; counts and min/max exact; relative errors: \
         mean within {MEAN_RTOL:e} of rms, std within {STD_RTOL:e} of max(std, \
         ε·|mean|), l2 norm within {L2_RTOL:e}; fingerprint, sketch and samples bit for bit (every NaN sample as one)\n"
    );
    println!(
        "| # | case | dtype | view | shape | counts | min/max | mean | std | l2 | fingerprint | \
         sketch | samples | result |\n|---:|---|---|---|---|---|---|---:|---:|---:|---|---|---|---|"
    );
    for (i, row) in rows.iter().enumerate() {
        let case = row.case;
        let head = format!(
            "| {i} | {} | {} | {} | {:?} |",
            case.name,
            case.dtype.as_str(),
            case.view.describe(),
            row.shape
        );
        match &row.outcome {
            Outcome::Compared(c) => println!(
                "{head} {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                mark(c.counts),
                mark(c.min_max),
                relative_cell(c.mean_rel, MEAN_RTOL),
                relative_cell(c.std_rel, STD_RTOL),
                relative_cell(c.l2_rel, L2_RTOL),
                mark(c.fingerprint),
                mark(c.sketch),
                mark(c.samples),
                row.verdict().as_str()
            ),
            Outcome::Skipped(reason) | Outcome::Unrecorded(reason) => println!(
                "{head} {reason} | | | | | | | | {} |",
                row.verdict().as_str()
            ),
        }
    }
    for (i, row) in rows.iter().enumerate() {
        let failed = row.verdict() == Verdict::Fail;
        if let (true, Some(cpu), Some(dev)) = (failed, &row.cpu, &row.device) {
            println!("\n#{i} cpu:    {cpu:?}\n#{i} {device}: {dev:?}");
        }
    }
}

fn to_json(rows: &[Row<'_>], device: &str) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let checks = match &row.outcome {
                Outcome::Compared(c) => json!({
                    "counts": c.counts,
                    "min_max": c.min_max,
                    "mean_rel_err": c.mean_rel,
                    "std_rel_err": c.std_rel,
                    "l2_rel_err": c.l2_rel,
                    "fingerprint": c.fingerprint,
                    "sketch": c.sketch,
                    "samples": c.samples,
                }),
                Outcome::Skipped(reason) => json!({ "skipped": reason }),
                Outcome::Unrecorded(error) => json!({ "error": error }),
            };
            json!({
                "case": row.case.name,
                "dtype": row.case.dtype.as_str(),
                "view": row.case.view.describe(),
                "shape": row.shape,
                "cpu": row.cpu,
                "device": row.device,
                "checks": checks,
                "result": row.verdict().as_str().to_lowercase(),
            })
        })
        .collect();
    json!({
        "command": "verify",
        "device": device,
        "tolerances": {
            "mean_rtol": MEAN_RTOL,
            "std_rtol": STD_RTOL,
            "l2_rtol": L2_RTOL,
        },
        "cases": cases,
        "pass": rows.iter().all(|row| row.verdict() != Verdict::Fail),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(values: &[f32]) -> TensorSummary {
        TensorSummary::of_values(vec![values.len()], "f32", values)
    }

    #[test]
    fn identical_records_pass() {
        let values = random(1000, 1, 2.0);
        let s = summary(&values);
        let checks = Checks::compare(&s.stats, &s.stats, &s, &s);
        assert!(
            checks.statistics_pass() && checks.digest_pass(),
            "{checks:?}"
        );
    }

    #[test]
    fn statistics_are_judged_by_their_tolerances() {
        let s = summary(&random(1000, 2, 2.0));
        let judge = |device: TensorStats| Checks::compare(&s.stats, &device, &s, &s);
        let scale = s.stats.l2_norm / (s.stats.count as f32).sqrt();
        let close = TensorStats {
            mean: s.stats.mean + 0.5 * MEAN_RTOL as f32 * scale,
            std: s.stats.std * (1.0 + 0.5 * STD_RTOL as f32),
            ..s.stats
        };
        assert!(judge(close).statistics_pass());
        let mean_off = TensorStats {
            mean: s.stats.mean + 4.0 * MEAN_RTOL as f32 * scale,
            ..s.stats
        };
        assert!(!judge(mean_off).statistics_pass());
        let nan_counted = TensorStats {
            nan_count: 1,
            ..s.stats
        };
        assert!(!judge(nan_counted).counts);
        let min_off = TensorStats {
            min: f32::from_bits(s.stats.min.to_bits() + 1),
            ..s.stats
        };
        assert!(!judge(min_off).min_max);
    }

    #[test]
    fn digests_must_be_bit_identical() {
        let values = with_specials(100, 3);
        let cpu = summary(&values);
        // A NaN with another payload is the same NaN (the GPU widens f16 NaN to 0x7fffffff):
        // the same digest.
        let nan = values.iter().position(|v| v.is_nan()).unwrap();
        let mut other_nan = values.clone();
        other_nan[nan] = f32::from_bits(0x7fff_ffff);
        let device = summary(&other_nan);
        let checks = Checks::compare(&cpu.stats, &device.stats, &cpu, &device);
        assert!(checks.statistics_pass() && checks.digest_pass());
        // A finite value one ulp off: equal as statistics, not as bits.
        let mut ulp_off = values.clone();
        ulp_off[1] = f32::from_bits(ulp_off[1].to_bits() + 1);
        assert!(ulp_off[1].is_finite());
        let device = summary(&ulp_off);
        let checks = Checks::compare(&cpu.stats, &device.stats, &cpu, &device);
        assert!(checks.statistics_pass());
        assert!(!checks.fingerprint && !checks.samples && !checks.digest_pass());
        let undigested = TensorSummary::from_stats(vec![100], "f32", cpu.stats);
        assert!(!Checks::compare(&cpu.stats, &cpu.stats, &cpu, &undigested).digest_pass());
    }

    #[test]
    fn unbuildable_cases_are_skipped_and_unrecorded_ones_fail() {
        let cases = cases();
        let row = |outcome| Row {
            case: &cases[0],
            shape: Vec::new(),
            cpu: None,
            device: None,
            outcome,
        };
        let s = summary(&[1.0, 2.0]);
        let mut off = Checks::compare(&s.stats, &s.stats, &s, &s);
        assert_eq!(row(Outcome::Compared(off)).verdict(), Verdict::Pass);
        off.sketch = false;
        assert_eq!(row(Outcome::Compared(off)).verdict(), Verdict::Fail);
        assert_eq!(
            row(Outcome::Skipped("empty".into())).verdict(),
            Verdict::Skip
        );
        assert_eq!(
            row(Outcome::Unrecorded("read".into())).verdict(),
            Verdict::Fail
        );
    }

    #[test]
    fn views_take_the_shapes_they_say() {
        for case in cases() {
            let tensor = case.build(&Device::Cpu).unwrap();
            let expected = match &case.view {
                View::Whole => case.shape.clone(),
                View::Transposed => case.shape.iter().rev().copied().collect(),
                View::Narrowed { dim, len, .. } => {
                    let mut shape = case.shape.clone();
                    shape[*dim] = *len;
                    shape
                }
                View::Broadcast(shape) => shape.clone(),
            };
            assert_eq!(
                tensor.dims(),
                expected,
                "{} {}",
                case.name,
                case.view.describe()
            );
            assert_eq!(tensor.dtype(), case.dtype);
            if !matches!(case.view, View::Whole) && tensor.elem_count() > 0 {
                assert!(!tensor.is_contiguous(), "{} is a strided view", case.name);
            }
        }
    }
}

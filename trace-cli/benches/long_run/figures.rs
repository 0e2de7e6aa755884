//! What the run measured: the table, the targets, the JSON.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::measure::{Measured, Subject};
use crate::traces::Traces;
use crate::usage::mebibytes;
use crate::{BenchError, Settings, DIFF_RSS_TARGET_BYTES, DIFF_THROUGHPUT_TARGET};

/// What the run measured, as printed and as `--json` writes it.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    passes: usize,
    rounds: usize,
    binary: PathBuf,
    diverge_at: Option<usize>,
    traces: TraceFigures,
    /// `None` when the traces were reused.
    generation: Option<GenerationFigures>,
    /// In [`Subject::ALL`] order.
    commands: Vec<CommandFigures>,
    targets: Targets,
}

#[derive(Debug, Serialize)]
struct TraceFigures {
    a: PathBuf,
    a_bytes: u64,
    b: PathBuf,
    b_bytes: u64,
    /// `|A| / passes`.
    bytes_per_pass: f64,
}

#[derive(Debug, Serialize)]
struct GenerationFigures {
    /// A and B written at once, on two threads.
    wall_seconds: f64,
    /// User and system time of both threads.
    cpu_seconds: f64,
    a_seconds: f64,
    b_seconds: f64,
    /// Passes per second of one trace (A's, on its thread).
    passes_per_second: f64,
    /// Bytes per second of one trace (A's, on its thread).
    bytes_per_second: f64,
}

#[derive(Debug, Serialize)]
struct CommandFigures {
    command: &'static str,
    /// Each round's wall time.
    seconds: Vec<f64>,
    median_seconds: f64,
    /// Each round's user and system time.
    cpu_seconds: Vec<f64>,
    median_cpu_seconds: f64,
    /// Bytes of trace read (`|A|`, or `|A| + |B|` for diff) over the median time.
    bytes_per_second: f64,
    /// The largest of the rounds' peak resident sets.
    peak_rss_bytes: u64,
}

/// Issue 19's two targets for `diff`.
#[derive(Debug, Serialize)]
struct Targets {
    /// `peak RSS(diff) ≤ 256 MiB`, in bytes.
    diff_peak_rss: Target,
    /// `(|A| + |B|) / t_diff ≥ 0.8 · |A| / t_list(A)`, in bytes per second.
    diff_throughput: Target,
}

#[derive(Debug, Serialize)]
struct Target {
    value: f64,
    bound: f64,
    met: bool,
}

impl Figures {
    pub(crate) fn new(
        settings: &Settings,
        traces: &Traces,
        measured: &Measured,
    ) -> Result<Self, BenchError> {
        let a_bytes = Traces::size(&traces.reference)?;
        let b_bytes = Traces::size(&traces.perturbed)?;
        #[allow(clippy::cast_precision_loss)]
        let (a, both, passes) = (
            a_bytes as f64,
            (a_bytes + b_bytes) as f64,
            settings.passes as f64,
        );
        let commands: Vec<CommandFigures> = measured
            .samples
            .iter()
            .map(|(subject, samples)| {
                let read = if *subject == Subject::Diff { both } else { a };
                let seconds = |time: fn(&crate::measure::Sample) -> Duration| -> Vec<f64> {
                    samples.iter().map(|s| time(s).as_secs_f64()).collect()
                };
                let (wall, cpu) = (seconds(|s| s.wall), seconds(|s| s.cpu));
                CommandFigures {
                    command: subject.label(),
                    median_seconds: median(&wall),
                    bytes_per_second: read / median(&wall),
                    seconds: wall,
                    median_cpu_seconds: median(&cpu),
                    cpu_seconds: cpu,
                    peak_rss_bytes: samples.iter().map(|s| s.peak_rss_bytes).max().unwrap_or(0),
                }
            })
            .collect();
        let targets = Targets::new(&commands);
        Ok(Self {
            passes: settings.passes,
            rounds: settings.rounds,
            binary: settings.binary.clone(),
            diverge_at: settings.diverge_at,
            traces: TraceFigures {
                a: traces.reference.clone(),
                a_bytes,
                b: traces.perturbed.clone(),
                b_bytes,
                bytes_per_pass: a / passes,
            },
            generation: traces.generation.map(|generation| {
                let a_seconds = generation.reference.as_secs_f64();
                GenerationFigures {
                    wall_seconds: generation.wall.as_secs_f64(),
                    cpu_seconds: generation.cpu.as_secs_f64(),
                    a_seconds,
                    b_seconds: generation.perturbed.as_secs_f64(),
                    passes_per_second: passes / a_seconds,
                    bytes_per_second: a / a_seconds,
                }
            }),
            commands,
            targets,
        })
    }

    pub(crate) fn write_json(&self, path: &Path) -> Result<(), BenchError> {
        let file = File::create(path).map_err(BenchError::io("create", path))?;
        serde_json::to_writer_pretty(io::BufWriter::new(file), self)
            .map_err(|error| BenchError::io("write", path)(error.into()))
    }

    fn command(&self, subject: Subject) -> Option<&CommandFigures> {
        self.commands.iter().find(|c| c.command == subject.label())
    }
}

impl Targets {
    fn new(commands: &[CommandFigures]) -> Self {
        let find = |subject: Subject| commands.iter().find(|c| c.command == subject.label());
        let list_throughput = find(Subject::List).map_or(f64::NAN, |list| list.bytes_per_second);
        let diff = find(Subject::Diff);
        #[allow(clippy::cast_precision_loss)]
        let (rss, rss_bound) = (
            diff.map_or(f64::NAN, |diff| diff.peak_rss_bytes as f64),
            DIFF_RSS_TARGET_BYTES as f64,
        );
        let throughput = diff.map_or(f64::NAN, |diff| diff.bytes_per_second);
        let throughput_bound = DIFF_THROUGHPUT_TARGET * list_throughput;
        Self {
            diff_peak_rss: Target {
                value: rss,
                bound: rss_bound,
                met: rss <= rss_bound,
            },
            diff_throughput: Target {
                value: throughput,
                bound: throughput_bound,
                met: throughput >= throughput_bound,
            },
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `bytes` in GB, MB or kB, with three or four significant digits.
fn size(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.1} kB", b / 1e3),
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "PASS"
    } else {
        "MISS"
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let diverging = match self.diverge_at {
            Some(pass) => format!(", B diverging at pass {pass}"),
            None => String::new(),
        };
        writeln!(
            f,
            "model-trace on two full traces of {} passes of a synthetic SmolLM2-135M \
             decode{diverging}",
            self.passes
        )?;
        writeln!(f, "binary: {}", self.binary.display())?;
        write!(f, "{}", self.traces)?;
        match &self.generation {
            Some(generation) => write!(f, "{generation}")?,
            None => writeln!(f, "traces reused from an earlier run")?,
        }
        writeln!(
            f,
            "\n{:<10} {:>12} {:>10} {:>8} {:>12}   ({} round{}, page cache warm)",
            "command",
            "median time",
            "CPU time",
            "MB/s",
            "peak RSS",
            self.rounds,
            if self.rounds == 1 { "" } else { "s" }
        )?;
        for command in &self.commands {
            writeln!(
                f,
                "{:<10} {:>10.2} s {:>8.2} s {:>8.0} {:>8.1} MiB",
                command.command,
                command.median_seconds,
                command.median_cpu_seconds,
                command.bytes_per_second / 1e6,
                mebibytes(command.peak_rss_bytes)
            )?;
        }
        let (rss, throughput) = (&self.targets.diff_peak_rss, &self.targets.diff_throughput);
        let list = self.command(Subject::List);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let (rss_value, rss_bound) = (rss.value as u64, rss.bound as u64);
        writeln!(f, "\ntargets (issue 19):")?;
        writeln!(
            f,
            "  peak RSS(diff) <= {:.0} MiB: {:.1} MiB  {}",
            mebibytes(rss_bound),
            mebibytes(rss_value),
            verdict(rss.met)
        )?;
        writeln!(
            f,
            "  (|A|+|B|)/t_diff >= 0.8·|A|/t_list(A): {:.0} MB/s against 0.8 x {:.0} = {:.0} MB/s  \
             {}",
            throughput.value / 1e6,
            list.map_or(f64::NAN, |list| list.bytes_per_second / 1e6),
            throughput.bound / 1e6,
            verdict(throughput.met)
        )
    }
}

impl fmt::Display for TraceFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[allow(clippy::cast_precision_loss)]
        let (a_bytes, b_bytes) = (self.a_bytes as f64, self.b_bytes as f64);
        writeln!(
            f,
            "A: {} ({}), B: {} ({}); {} per pass",
            self.a.display(),
            size(a_bytes),
            self.b.display(),
            size(b_bytes),
            size(self.bytes_per_pass)
        )
    }
}

impl fmt::Display for GenerationFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "generated in {:.1} s (CPU {:.1} s), A and B at once on two threads; A alone {:.1} s: \
             {:.0} passes/s, {:.1} MB/s",
            self.wall_seconds,
            self.cpu_seconds,
            self.a_seconds,
            self.passes_per_second,
            self.bytes_per_second / 1e6
        )
    }
}

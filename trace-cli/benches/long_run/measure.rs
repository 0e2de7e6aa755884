//! Running the commands: wall time, CPU time and peak resident set of each child process.

use std::ffi::OsString;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::traces::Traces;
use crate::usage::{cpu_time, mebibytes, peak_rss_bytes, wait_with_usage};
use crate::{BenchError, Settings};

/// One command of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subject {
    List,
    Summary,
    Report,
    Diff,
}

impl Subject {
    pub(crate) const ALL: [Self; 4] = [Self::List, Self::Summary, Self::Report, Self::Diff];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::List => "list A",
            Self::Summary => "summary A",
            Self::Report => "report A",
            Self::Diff => "diff A B",
        }
    }

    fn arguments(self, traces: &Traces) -> Vec<OsString> {
        let a = traces.reference.as_os_str().to_owned();
        match self {
            Self::List => vec!["list".into(), a],
            Self::Summary => vec!["summary".into(), a],
            Self::Report => vec![
                "report".into(),
                a,
                "-o".into(),
                traces.report.as_os_str().to_owned(),
            ],
            Self::Diff => vec!["diff".into(), a, traces.perturbed.as_os_str().to_owned()],
        }
    }

    /// Where the command's stderr goes, in the traces' directory.
    fn stderr_file(self) -> &'static str {
        match self {
            Self::List => "list.stderr",
            Self::Summary => "summary.stderr",
            Self::Report => "report.stderr",
            Self::Diff => "diff.stderr",
        }
    }

    /// The exit status that says the command did what was measured.
    fn expected_status(self, settings: &Settings) -> i32 {
        match (self, settings.diverge_at) {
            (Self::Diff, Some(_)) => 1,
            _ => 0,
        }
    }
}

/// One run of a command: how long it took and its peak resident set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) wall: Duration,
    /// User and system time, all its threads together.
    pub(crate) cpu: Duration,
    pub(crate) peak_rss_bytes: u64,
}

/// Every sample of every command, in [`Subject::ALL`] order.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) samples: Vec<(Subject, Vec<Sample>)>,
}

/// Runs each command `rounds` times, interleaved.
pub(crate) fn measure(settings: &Settings, traces: &Traces) -> Result<Measured, BenchError> {
    let mut samples: Vec<(Subject, Vec<Sample>)> = Subject::ALL
        .iter()
        .map(|&subject| (subject, Vec::new()))
        .collect();
    for round in 1..=settings.rounds {
        for (subject, samples) in &mut samples {
            let stderr = traces.dir.join(subject.stderr_file());
            let sample = run_child(settings, traces, *subject, &stderr)?;
            eprintln!(
                "long_run: round {round}/{}: {:<9}  {:>8.2} s  (CPU {:>7.2} s)  {:>8.1} MiB",
                settings.rounds,
                subject.label(),
                sample.wall.as_secs_f64(),
                sample.cpu.as_secs_f64(),
                mebibytes(sample.peak_rss_bytes)
            );
            samples.push(sample);
        }
    }
    // Every command did what was measured: their stderr files hold nothing to keep (after a
    // failure, the failed command's stays for its error).
    for subject in Subject::ALL {
        let _ = std::fs::remove_file(traces.dir.join(subject.stderr_file()));
    }
    Ok(Measured { samples })
}

/// Runs one command, stdout to /dev/null and stderr to `stderr`, and checks its exit status.
fn run_child(
    settings: &Settings,
    traces: &Traces,
    subject: Subject,
    stderr: &Path,
) -> Result<Sample, BenchError> {
    let stderr_file = File::create(stderr).map_err(BenchError::io("create", stderr))?;
    let arguments = subject.arguments(traces);
    let started = Instant::now();
    let child = Command::new(&settings.binary)
        .args(&arguments)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr_file)
        .spawn()
        .map_err(BenchError::io("run", &settings.binary))?;
    let (status, usage) =
        wait_with_usage(child.id()).map_err(BenchError::io("wait for", &settings.binary))?;
    let wall = started.elapsed();
    let expected = subject.expected_status(settings);
    if status.code() != Some(expected) {
        let command = std::iter::once(settings.binary.as_os_str())
            .chain(arguments.iter().map(OsString::as_os_str))
            .map(|part| part.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        return Err(BenchError::Command {
            command,
            status,
            expected,
            stderr: stderr.to_path_buf(),
            stderr_tail: tail(stderr),
        });
    }
    Ok(Sample {
        wall,
        cpu: cpu_time(&usage),
        peak_rss_bytes: peak_rss_bytes(&usage),
    })
}

/// The last lines of a command's stderr, for an error message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let shown = &lines[lines.len().saturating_sub(20)..];
    if shown.is_empty() {
        return "  (nothing)".into();
    }
    shown.iter().map(|line| format!("  {line}\n")).collect()
}

//! Decode speed of SmolLM2 untraced and traced at each level, measured in one run.
//!
//! `cargo run --release -p smollm --bin bench_decode -- [--rounds N] [--tokens N] [--instructions]`
//!
//! Builds the `smollm` CLI twice in release (without and with `--features trace`), copies both
//! binaries aside, then runs interleaved rounds of five configurations, each a fresh process
//! that decodes `--tokens` tokens and reports its median ms/token:
//!
//! 1. untraced build;
//! 2. traced build, `--trace off` (no session: the cost of annotations that find none);
//! 3. traced build, `--trace lightweight`;
//! 4. traced build, `--trace full-noquant`;
//! 5. traced build, `--trace full`.
//!
//! Interleaving spreads drifts of the machine's load over all configurations; the order within
//! a round rotates so none always runs first. The table reports the median over rounds of each
//! run's median and the overhead against the untraced build, and next to it the fastest single
//! step seen: load only ever adds time, so on a shared machine the fastest step is the steadier
//! comparison. Rayon runs one thread
//! (`RAYON_NUM_THREADS=1`) unless the variable is already set: thread scheduling noise would
//! otherwise swamp percent-level differences.
//!
//! With `--instructions` it counts instead of timing: each configuration runs once under
//! `valgrind --tool=cachegrind --cache-sim=no` decoding 2 tokens and once decoding `--tokens`, and
//! the difference of the two instruction totals divided by the difference in decode steps is the
//! count per decode token, with loading and prefill cancelled out. The count repeats to tens of
//! parts per million whatever else the machine runs, so it settles sub-percent differences that
//! wall-clock time on a shared machine cannot. Valgrind hides AVX-512 from the program, so the
//! statistics kernels run their AVX2 versions there: the counted overhead slightly overstates
//! the native one.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str =
    "usage: bench_decode [--rounds N] [--tokens N] [--prompt TEXT] [--instructions]";

struct Args {
    rounds: usize,
    tokens: usize,
    prompt: String,
    /// Count instructions under cachegrind instead of timing.
    instructions: bool,
}

struct Config {
    label: &'static str,
    traced_build: bool,
    trace: Option<&'static str>,
}

const CONFIGS: [Config; 5] = [
    Config {
        label: "untraced build",
        traced_build: false,
        trace: None,
    },
    Config {
        label: "traced build, no session (`--trace off`)",
        traced_build: true,
        trace: Some("off"),
    },
    Config {
        label: "traced, lightweight",
        traced_build: true,
        trace: Some("lightweight"),
    },
    Config {
        label: "traced, full without quantization",
        traced_build: true,
        trace: Some("full-noquant"),
    },
    Config {
        label: "traced, full",
        traced_build: true,
        trace: Some("full"),
    },
];

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("error: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        rounds: 3,
        tokens: 24,
        prompt: "The capital of France is".to_owned(),
        instructions: false,
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => parsed.rounds = parse_count(&flag, &value()?)?,
            "--tokens" => parsed.tokens = parse_count(&flag, &value()?)?,
            "--prompt" => parsed.prompt = value()?,
            "--instructions" => parsed.instructions = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.tokens < 2 {
        return Err("--tokens must be at least 2: the first token comes from the prefill".into());
    }
    if parsed.instructions && parsed.tokens < 3 {
        return Err(
            "--instructions needs --tokens of at least 3: it subtracts a 2-token run".into(),
        );
    }
    Ok(parsed)
}

fn parse_count(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} takes a positive number, not {value:?}")),
    }
}

fn run(args: &Args) -> Result<(), String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let bench_dir = target_dir.join("bench_decode");
    std::fs::create_dir_all(&bench_dir)
        .map_err(|e| format!("cannot create {}: {e}", bench_dir.display()))?;
    let untraced = build(
        &workspace,
        &target_dir,
        false,
        &bench_dir.join("smollm-untraced"),
    )?;
    let traced = build(
        &workspace,
        &target_dir,
        true,
        &bench_dir.join("smollm-traced"),
    )?;

    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "1".to_owned());
    if args.instructions {
        return count_instructions(&untraced, &traced, args, &threads);
    }
    eprintln!(
        "{} rounds x {} configurations, {} tokens each, RAYON_NUM_THREADS={threads}",
        args.rounds,
        CONFIGS.len(),
        args.tokens
    );
    let mut samples: Vec<Vec<DecodeLine>> = vec![Vec::new(); CONFIGS.len()];
    for round in 0..args.rounds {
        for k in 0..CONFIGS.len() {
            let index = (round + k) % CONFIGS.len();
            let config = &CONFIGS[index];
            let binary = if config.traced_build {
                &traced
            } else {
                &untraced
            };
            let time = decode_time(binary, config, args, &threads)?;
            eprintln!(
                "round {round}: {:<42} {:8.1} ms/token (fastest step {:.1} ms)",
                config.label, time.median_ms, time.fastest_ms
            );
            samples[index].push(time);
        }
    }

    let medians: Vec<f64> = samples
        .iter()
        .map(|runs| median(&runs.iter().map(|t| t.median_ms).collect::<Vec<_>>()))
        .collect();
    let fastest: Vec<f64> = samples
        .iter()
        .map(|runs| {
            runs.iter()
                .map(|t| t.fastest_ms)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let (base_median, base_fastest) = (medians[0], fastest[0]);
    println!(
        "\n| configuration | median ms/token | vs untraced | fastest step ms | vs untraced | \
         per-run medians |\n|---|---:|---:|---:|---:|---|"
    );
    for (i, config) in CONFIGS.iter().enumerate() {
        let runs: Vec<String> = samples[i]
            .iter()
            .map(|t| format!("{:.1}", t.median_ms))
            .collect();
        println!(
            "| {} | {:.1} | {:+.1}% | {:.1} | {:+.1}% | {} |",
            config.label,
            medians[i],
            (medians[i] / base_median - 1.0) * 100.0,
            fastest[i],
            (fastest[i] / base_fastest - 1.0) * 100.0,
            runs.join(", ")
        );
    }
    Ok(())
}

/// One cachegrind run per configuration and token count; prints the count per decode token.
fn count_instructions(
    untraced: &Path,
    traced: &Path,
    args: &Args,
    threads: &str,
) -> Result<(), String> {
    eprintln!(
        "{} configurations under cachegrind, 2 and {} tokens each, RAYON_NUM_THREADS={threads}",
        CONFIGS.len(),
        args.tokens
    );
    let mut per_token = Vec::with_capacity(CONFIGS.len());
    for config in &CONFIGS {
        let binary = if config.traced_build {
            traced
        } else {
            untraced
        };
        let short = counted_run(binary, config, &args.prompt, 2, threads)?;
        let long = counted_run(binary, config, &args.prompt, args.tokens, threads)?;
        if long.decode_steps <= short.decode_steps {
            return Err(format!(
                "{}: {} tokens gave no more decode steps than 2 (end of text reached?); \
                 try another --prompt",
                config.label, args.tokens
            ));
        }
        let count = long.instructions.saturating_sub(short.instructions) as f64
            / (long.decode_steps - short.decode_steps) as f64;
        eprintln!(
            "{:<42} {:>14.0} instructions per decode token",
            config.label, count
        );
        per_token.push(count);
    }
    let base = per_token[0];
    println!("\n| configuration | instructions per decode token | vs untraced |\n|---|---:|---:|");
    for (config, count) in CONFIGS.iter().zip(&per_token) {
        println!(
            "| {} | {:.0} | {:+.3}% |",
            config.label,
            count,
            (count / base - 1.0) * 100.0
        );
    }
    Ok(())
}

struct CountedRun {
    instructions: u64,
    decode_steps: usize,
}

/// `valgrind --tool=cachegrind --cache-sim=no BINARY --max-tokens TOKENS ...`: the program's
/// total instruction count and how many decode steps it ran.
fn counted_run(
    binary: &Path,
    config: &Config,
    prompt: &str,
    tokens: usize,
    threads: &str,
) -> Result<CountedRun, String> {
    let mut command = Command::new("valgrind");
    command
        .args([
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
        ])
        .arg(binary);
    let (decode, stderr) = run_smollm(command, config, prompt, tokens, threads).map_err(|e| {
        format!("{e}\n(--instructions needs valgrind: Debian's package `valgrind`)")
    })?;
    // Cachegrind's summary line: `==123== I   refs:      6,470,750,376`.
    let instructions = stderr
        .lines()
        .find_map(|line| {
            let (_, count) = line.split_once("I   refs:")?;
            count.trim().replace(',', "").parse().ok()
        })
        .ok_or_else(|| format!("no `I refs` line in cachegrind's output:\n{stderr}"))?;
    Ok(CountedRun {
        instructions,
        decode_steps: decode.steps,
    })
}

/// `cargo build --release -p smollm --bin smollm [--features trace]`, the binary copied to `copy`
/// so the other build does not overwrite it.
fn build(
    workspace: &Path,
    target_dir: &Path,
    traced: bool,
    copy: &Path,
) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .env("CARGO_TARGET_DIR", target_dir)
        .args(["build", "--release", "-p", "smollm", "--bin", "smollm"]);
    if traced {
        command.args(["--features", "trace"]);
    }
    eprintln!("building: {command:?}");
    let status = command
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed ({status})"));
    }
    let built = target_dir
        .join("release")
        .join(format!("smollm{}", std::env::consts::EXE_SUFFIX));
    std::fs::copy(&built, copy)
        .map_err(|e| format!("cannot copy {} to {}: {e}", built.display(), copy.display()))?;
    Ok(copy.to_owned())
}

/// The CLI's summary line:
/// `decode: 131.4 ms/token (median of 23 steps, fastest 120.2 ms; prefill ...)`.
#[derive(Debug, Clone, Copy)]
struct DecodeLine {
    median_ms: f64,
    steps: usize,
    fastest_ms: f64,
}

impl DecodeLine {
    fn find(stdout: &str) -> Option<Self> {
        stdout.lines().find_map(|line| {
            let (median, rest) = line.strip_prefix("decode: ")?.split_once(" ms/token")?;
            let (steps, rest) = rest.strip_prefix(" (median of ")?.split_once(" steps")?;
            let (_, fastest) = rest.split_once("fastest ")?;
            Some(Self {
                median_ms: median.parse().ok()?,
                steps: steps.parse().ok()?,
                fastest_ms: fastest.split_once(" ms")?.0.parse().ok()?,
            })
        })
    }
}

/// One fresh process of the CLI timing its own decode steps.
fn decode_time(
    binary: &Path,
    config: &Config,
    args: &Args,
    threads: &str,
) -> Result<DecodeLine, String> {
    run_smollm(
        Command::new(binary),
        config,
        &args.prompt,
        args.tokens,
        threads,
    )
    .map(|(decode, _)| decode)
}

/// Finishes `command` (the CLI, or a wrapper with the CLI as its last argument so far) with the
/// configuration's arguments, runs it, and returns its `decode:` line and its stderr.
fn run_smollm(
    mut command: Command,
    config: &Config,
    prompt: &str,
    tokens: usize,
    threads: &str,
) -> Result<(DecodeLine, String), String> {
    command
        .env("RAYON_NUM_THREADS", threads)
        .env_remove("MODEL_TRACE")
        .args(["--max-tokens", &tokens.to_string()]);
    if let Some(trace) = config.trace {
        command.args(["--trace", trace]);
    }
    command.arg(prompt);
    let program = command.get_program().to_string_lossy().into_owned();
    let output = command
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Err(format!(
            "{program} ({}) failed: {}\n{stderr}",
            config.label, output.status
        ));
    }
    let decode = DecodeLine::find(&stdout).ok_or_else(|| {
        format!(
            "no `decode: N ms/token (median of N steps, fastest N ms` line in the output of {}:\n{stdout}",
            config.label
        )
    })?;
    Ok((decode, stderr))
}

/// Median; the mean of the middle two for an even count.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

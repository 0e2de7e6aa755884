//! Decode speed of SmolLM2 untraced and traced at each level, measured in one run.
//!
//! `cargo run --release -p smollm --bin bench_decode -- [--rounds N] [--tokens N]
//! [--instructions | --memory [--cli]]`
//!
//! Builds the `smollm` package twice in release (without and with `--features trace`), copies
//! both builds' binaries aside, and compares seven configurations:
//!
//! 1. untraced build;
//! 2. traced build, `--trace off` (no session: the cost of annotations that find none);
//! 3. traced build, `--trace lightweight`;
//! 4. the same, writing a trace file (`MODEL_TRACE_OUT`);
//! 5. traced build, `--trace full-noquant`;
//! 6. the same, writing a trace file;
//! 7. traced build, `--trace full`.
//!
//! The trace files go to `target/bench_decode/` (one per configuration, replaced each run).
//!
//! Timed (the default), the configurations run in lockstep: each round starts one
//! `decode_worker` process per configuration, each prefills the prompt, then the workers take
//! turns at single decode steps, `--tokens` steps each, the order rotating from step to step.
//! On a shared machine the speed drifts by tens of percent over seconds, far more than the
//! differences measured here; steps of different configurations a fraction of a second apart
//! see the same drift, so the ratio of each step's time to the untraced step of the same turn
//! cancels it. The table gives, per configuration, the median over all turns of that ratio with
//! a 95% confidence interval, and the median step time. The interval comes from a bootstrap over
//! rounds, not turns: the turns of one round share their worker processes (each with its own
//! memory layout and placement), so a round's ratios can sit together away from another
//! round's, and treating them as independent would give an interval far too narrow. Each
//! resample draws whole rounds with replacement and takes the median of their ratios; the
//! interval is the 2.5th to 97.5th percentile of those medians. It needs at least 2 rounds and
//! is rough below about 10 (the default is 10 rounds of 24 steps). Every configuration must
//! choose the same tokens as the untraced build, or the benchmark fails. Rayon runs one thread
//! (`RAYON_NUM_THREADS=1`) unless the variable is already set: with two workers' threads
//! competing for the cores, scheduling would dominate.
//!
//! `--profile dev` builds in Cargo's dev profile instead of release: quick to build, for checking
//! that the benchmark still runs (`scripts/test` runs `--rounds 1 --tokens 2 --profile dev`); its
//! figures mean nothing.
//!
//! With `--memory` it measures peak memory instead: each configuration's worker decodes 200
//! and then 1,000 tokens under `/usr/bin/time -v`, and the table gives the peak resident set
//! size, its overhead over the untraced build at the same length, and how much that overhead
//! grew from 200 to 1,000 tokens (the model's own KV cache grows ~45 KiB a token in every
//! configuration and cancels in the overhead). `--tokens N` replaces the two lengths by N / 5
//! (at least 1) and N; `--rounds N` runs each measurement N times (default 1) and takes the
//! median.
//!
//! `--memory --cli` measures the user's path instead of the worker: the `smollm` CLI itself,
//! `smollm --max-tokens N --ignore-eos PROMPT` from the untraced build against
//! `smollm --max-tokens N --ignore-eos --trace full-noquant --trace-out F PROMPT` from the traced
//! build, both generating exactly N tokens (N = 200 and 1,000, or as `--tokens` sets them), each
//! under `/usr/bin/time -v`, whose maximum resident set size is the child's own `ru_maxrss` as
//! `wait4` reports it. Each run repeats `--rounds` times (default 3) and the table gives the
//! medians, the traced build's excess over the untraced at each length, the growth of that
//! excess from the shorter to the longer run, and the size of the trace file. The CLI also
//! finishes the session and prints its summary before it exits, which the worker never does.
//!
//! With `--instructions` it counts instead of timing: each configuration's CLI runs once under
//! `valgrind --tool=cachegrind --cache-sim=no` decoding 2 tokens and once decoding `--tokens`, and
//! the difference of the two instruction totals divided by the difference in decode steps is the
//! count per decode token, with loading and prefill cancelled out. The count repeats to tens of
//! parts per million whatever else the machine runs. Valgrind hides AVX-512 from the program, so
//! the statistics kernels run at most their AVX2 versions there.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};

const USAGE: &str = "usage: bench_decode [--rounds N] [--tokens N] [--prompt TEXT] \
                     [--profile release|dev] [--instructions | --memory [--cli]]";

/// Bootstrap resamples of the rounds behind each interval.
const RESAMPLES: usize = 4000;

/// The longer decode length of the `--memory` runs when `--tokens` does not set it; the shorter
/// is a fifth of it.
const MEMORY_TOKENS: usize = 1000;

/// The trace level of the traced run in `--memory --cli`.
const CLI_TRACE: &str = "full-noquant";

struct Args {
    /// Rounds of the timed benchmark; repetitions of each `--memory` measurement.
    rounds: usize,
    /// Decode steps per round (timed), of the longer run (`--instructions`, `--memory`).
    tokens: usize,
    prompt: String,
    /// Cargo profile of the builds measured.
    profile: String,
    /// Count instructions under cachegrind instead of timing.
    instructions: bool,
    /// Measure peak memory instead of timing.
    memory: bool,
    /// With `memory`: measure the `smollm` CLI, not the worker.
    cli: bool,
}

struct Config {
    label: &'static str,
    traced_build: bool,
    trace: Option<&'static str>,
    /// Writes a trace file, through `MODEL_TRACE_OUT`.
    trace_file: bool,
}

const CONFIGS: [Config; 7] = [
    Config {
        label: "untraced build",
        traced_build: false,
        trace: None,
        trace_file: false,
    },
    Config {
        label: "traced build, no session (`--trace off`)",
        traced_build: true,
        trace: Some("off"),
        trace_file: false,
    },
    Config {
        label: "traced, lightweight",
        traced_build: true,
        trace: Some("lightweight"),
        trace_file: false,
    },
    Config {
        label: "traced, lightweight, trace file",
        traced_build: true,
        trace: Some("lightweight"),
        trace_file: true,
    },
    Config {
        label: "traced, full without quantization",
        traced_build: true,
        trace: Some("full-noquant"),
        trace_file: false,
    },
    Config {
        label: "traced, full without quantization, trace file",
        traced_build: true,
        trace: Some("full-noquant"),
        trace_file: true,
    },
    Config {
        label: "traced, full",
        traced_build: true,
        trace: Some("full"),
        trace_file: false,
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
    let (mut rounds, mut tokens) = (None, None);
    let mut parsed = Args {
        rounds: 0,
        tokens: 0,
        prompt: "The capital of France is".to_owned(),
        profile: "release".to_owned(),
        instructions: false,
        memory: false,
        cli: false,
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => rounds = Some(parse_count(&flag, &value()?)?),
            "--tokens" => tokens = Some(parse_count(&flag, &value()?)?),
            "--prompt" => parsed.prompt = value()?,
            "--profile" => parsed.profile = value()?,
            "--instructions" => parsed.instructions = true,
            "--memory" => parsed.memory = true,
            "--cli" => parsed.cli = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if parsed.instructions && parsed.memory {
        return Err("--instructions and --memory are two different benchmarks: pick one".into());
    }
    if parsed.cli && !parsed.memory {
        return Err("--cli goes with --memory".into());
    }
    parsed.rounds = rounds.unwrap_or(match (parsed.memory, parsed.cli) {
        (true, true) => 3,
        (true, false) => 1,
        (false, _) => 10,
    });
    parsed.tokens = tokens.unwrap_or(if parsed.memory { MEMORY_TOKENS } else { 24 });
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
    let untraced = build(&workspace, &target_dir, &bench_dir, &args.profile, false)?;
    let traced = build(&workspace, &target_dir, &bench_dir, &args.profile, true)?;
    let builds = [untraced, traced];
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "1".to_owned());
    if args.instructions {
        count_instructions(&builds, args, &threads)
    } else if args.memory && args.cli {
        measure_cli_memory(&builds, args, &threads)
    } else if args.memory {
        measure_memory(&builds, args, &threads)
    } else {
        time_in_lockstep(&builds, args, &threads)
    }
}

/// Step times in milliseconds, `[configuration][turn]`; turn `t` of every configuration ran
/// within one rotation of the workers.
type StepTimes = Vec<Vec<f64>>;

/// The timed benchmark: `--rounds` rounds of workers taking turns at `--tokens` decode steps.
fn time_in_lockstep(builds: &[Build; 2], args: &Args, threads: &str) -> Result<(), String> {
    eprintln!(
        "{} rounds of {} decode steps, the {} configurations in lockstep, RAYON_NUM_THREADS={threads}",
        args.rounds,
        args.tokens,
        CONFIGS.len()
    );
    let mut times: StepTimes = vec![Vec::new(); CONFIGS.len()];
    for round in 0..args.rounds {
        let mut workers = CONFIGS
            .iter()
            .map(|config| {
                Worker::spawn(
                    &builds[usize::from(config.traced_build)],
                    config,
                    args,
                    threads,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        for step in 0..args.tokens {
            let mut chosen = [0u32; CONFIGS.len()];
            for k in 0..CONFIGS.len() {
                let index = (round + step + k) % CONFIGS.len();
                let (ms, token) = workers[index].step()?;
                times[index].push(ms);
                chosen[index] = token;
            }
            if let Some(i) = chosen.iter().position(|&token| token != chosen[0]) {
                return Err(format!(
                    "round {round}, step {step}: {} chose token {} where the untraced build chose {}",
                    CONFIGS[i].label, chosen[i], chosen[0]
                ));
            }
        }
        for worker in workers {
            worker.finish()?;
        }
        let medians: Vec<String> = times
            .iter()
            .map(|t| format!("{:.1}", median(&t[t.len() - args.tokens..])))
            .collect();
        eprintln!("round {round}: median ms/step {}", medians.join(" / "));
    }
    print_ratio_table(&times, args.tokens);
    Ok(())
}

/// The table of step-time ratios; `times[config]` holds `tokens` turns per round, round after
/// round.
fn print_ratio_table(times: &StepTimes, tokens: usize) {
    let untraced = &times[0];
    let rounds = untraced.len() / tokens;
    println!(
        "\n| configuration | median ms/token | step time vs untraced (median) | 95% CI |\n\
         |---|---:|---:|---:|"
    );
    for (config, steps) in CONFIGS.iter().zip(times) {
        let ratios: Vec<f64> = steps.iter().zip(untraced).map(|(t, u)| t / u).collect();
        let by_round: Vec<&[f64]> = ratios.chunks(tokens).collect();
        let percent = |ratio: f64| (ratio - 1.0) * 100.0;
        let interval = match round_bootstrap_interval(&by_round, RESAMPLES) {
            Some((low, high)) => format!("{:+.2}% .. {:+.2}%", percent(low), percent(high)),
            None => "n/a (1 round)".to_owned(),
        };
        println!(
            "| {} | {:.1} | {:+.2}% | {interval} |",
            config.label,
            median(steps),
            percent(median(&ratios)),
        );
    }
    let rough = if rounds < 10 {
        "; with fewer than 10 rounds it is rough"
    } else {
        ""
    };
    println!(
        "({rounds} round(s) of {tokens} turns per configuration. The turns of a round share its \
         processes and are not independent, so the 95% interval resamples whole rounds: a \
         bootstrap of {RESAMPLES} resamples over the rounds, which needs 2 rounds or more{rough}.)"
    );
}

/// A 95% interval of the median of all values, from a bootstrap over `rounds`: each resample
/// draws as many rounds as there are, with replacement, and takes the median of their values
/// pooled; the interval runs from the 2.5th to the 97.5th percentile of those medians. `None`
/// with fewer than 2 rounds, where nothing varies. The draws are seeded, so a table repeats.
fn round_bootstrap_interval(rounds: &[&[f64]], resamples: usize) -> Option<(f64, f64)> {
    if rounds.len() < 2 || resamples == 0 {
        return None;
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut draw = || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut pooled = Vec::new();
    let mut medians: Vec<f64> = (0..resamples)
        .map(|_| {
            pooled.clear();
            for _ in 0..rounds.len() {
                let pick = (draw() % rounds.len() as u64) as usize;
                pooled.extend_from_slice(rounds[pick]);
            }
            median(&pooled)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    let at = |q: f64| medians[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    Some((at(0.025), at(0.975)))
}

/// The environment of a configuration's process: one Rayon thread setting, no filter from the
/// caller's environment, and a trace file (in `bench_dir`, named after the configuration) only
/// where the configuration writes one.
fn configure(command: &mut Command, config: &Config, threads: &str, bench_dir: &Path) {
    clean_env(command, threads);
    if config.trace_file {
        let index = CONFIGS
            .iter()
            .position(|c| c.label == config.label)
            .unwrap_or(0);
        command.env(
            "MODEL_TRACE_OUT",
            bench_dir.join(format!("config-{index}.ndjson")),
        );
    }
}

/// The benchmark's Rayon thread setting and none of the caller's model-trace variables.
fn clean_env(command: &mut Command, threads: &str) {
    command
        .env("RAYON_NUM_THREADS", threads)
        .env_remove("MODEL_TRACE")
        .env_remove("MODEL_TRACE_CAPTURE")
        .env_remove("MODEL_TRACE_OUT");
}

/// A `decode_worker` process, prefilled and waiting for steps.
struct Worker {
    label: &'static str,
    child: Child,
    requests: ChildStdin,
    replies: BufReader<ChildStdout>,
}

impl Worker {
    /// Starts the worker of `config` from `build` and waits until it has prefilled the prompt.
    fn spawn(build: &Build, config: &Config, args: &Args, threads: &str) -> Result<Self, String> {
        let mut command = Command::new(&build.worker);
        configure(&mut command, config, threads, &build.dir);
        command.stdin(Stdio::piped()).stdout(Stdio::piped());
        if let Some(trace) = config.trace {
            command.args(["--trace", trace]);
        }
        command.arg(&args.prompt);
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", build.worker.display()))?;
        let (Some(requests), Some(replies)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!(
                "{}: the worker's pipes were not set up",
                config.label
            ));
        };
        let mut worker = Worker {
            label: config.label,
            child,
            requests,
            replies: BufReader::new(replies),
        };
        let line = worker.read_line()?;
        if line != "ready" {
            return Err(format!(
                "{}: the worker said {line:?}, not ready",
                config.label
            ));
        }
        Ok(worker)
    }

    /// One decode step: its time in milliseconds and the token chosen.
    fn step(&mut self) -> Result<(f64, u32), String> {
        writeln!(self.requests)
            .and_then(|()| self.requests.flush())
            .map_err(|e| format!("{}: the worker stopped taking steps: {e}", self.label))?;
        let line = self.read_line()?;
        let parsed = line.split_once(' ').and_then(|(nanos, token)| {
            Some((nanos.parse::<u64>().ok()? as f64 / 1e6, token.parse().ok()?))
        });
        parsed.ok_or_else(|| format!("{}: the worker answered {line:?}", self.label))
    }

    fn read_line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.replies.read_line(&mut line) {
            Ok(0) => Err(format!(
                "{}: the worker exited early (its error is above)",
                self.label
            )),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e) => Err(format!("{}: cannot read the worker: {e}", self.label)),
        }
    }

    /// Closes the worker's input, which ends it, and checks that it exited cleanly.
    fn finish(self) -> Result<(), String> {
        let Worker {
            label,
            mut child,
            requests,
            ..
        } = self;
        drop(requests);
        match child.wait() {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("{label}: the worker failed ({status})")),
            Err(e) => Err(format!("{label}: cannot wait for the worker: {e}")),
        }
    }
}

/// One cachegrind run per configuration and token count; prints the count per decode token.
fn count_instructions(builds: &[Build; 2], args: &Args, threads: &str) -> Result<(), String> {
    eprintln!(
        "{} configurations under cachegrind, 2 and {} tokens each, RAYON_NUM_THREADS={threads}",
        CONFIGS.len(),
        args.tokens
    );
    let mut per_token = Vec::with_capacity(CONFIGS.len());
    for config in &CONFIGS {
        let build = &builds[usize::from(config.traced_build)];
        let (binary, dir) = (&build.cli, &build.dir);
        let short = counted_run(binary, config, &args.prompt, 2, threads, dir)?;
        let long = counted_run(binary, config, &args.prompt, args.tokens, threads, dir)?;
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

/// The shorter and the longer decode length of the `--memory` runs: a fifth of `--tokens` (at
/// least 1) and `--tokens`.
fn memory_lengths(tokens: usize) -> [usize; 2] {
    [(tokens / 5).max(1), tokens]
}

/// Peak RSS of each configuration's worker decoding each of `memory_lengths`, the median of
/// `--rounds` runs.
fn measure_memory(builds: &[Build; 2], args: &Args, threads: &str) -> Result<(), String> {
    let lengths = memory_lengths(args.tokens);
    eprintln!(
        "{} configurations under /usr/bin/time -v, {lengths:?} decode tokens each, {} run(s) \
         each, RAYON_NUM_THREADS={threads}",
        CONFIGS.len(),
        args.rounds
    );
    let mut peaks = Vec::with_capacity(CONFIGS.len());
    for config in &CONFIGS {
        let build = &builds[usize::from(config.traced_build)];
        let mut row = Vec::new();
        for tokens in lengths {
            let mut runs = Vec::with_capacity(args.rounds);
            for _ in 0..args.rounds {
                let kib = peak_rss_kib(build, config, args, threads, tokens)?;
                eprintln!("{:<46} {tokens:>5} tokens: {kib} KiB", config.label);
                runs.push(kib as f64 / 1024.0);
            }
            row.push(median(&runs));
        }
        peaks.push(row);
    }
    let base = &peaks[0];
    println!(
        "\n| configuration | peak RSS at {} / {} tokens (MiB) | overhead vs untraced (MiB) | overhead growth {}→{} (MiB) |\n|---|---:|---:|---:|",
        lengths[0], lengths[1], lengths[0], lengths[1]
    );
    for (config, row) in CONFIGS.iter().zip(&peaks) {
        let overhead: Vec<f64> = row.iter().zip(base).map(|(p, b)| p - b).collect();
        println!(
            "| {} | {:.1} / {:.1} | {:+.1} / {:+.1} | {:+.1} |",
            config.label,
            row[0],
            row[1],
            overhead[0],
            overhead[1],
            overhead[1] - overhead[0]
        );
    }
    if args.rounds > 1 {
        println!("(medians of {} runs each)", args.rounds);
    }
    Ok(())
}

/// The worker of `config` decoding `tokens` steps under `/usr/bin/time -v`: its peak RSS in KiB.
fn peak_rss_kib(
    build: &Build,
    config: &Config,
    args: &Args,
    threads: &str,
    tokens: usize,
) -> Result<u64, String> {
    let mut command = Command::new("/usr/bin/time");
    command.arg("-v").arg(&build.worker);
    configure(&mut command, config, threads, &build.dir);
    if let Some(trace) = config.trace {
        command.args(["--trace", trace]);
    }
    command
        .arg(&args.prompt)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(no_time)?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all("\n".repeat(tokens).as_bytes())
            .map_err(|e| format!("{}: cannot feed the worker: {e}", config.label))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| format!("{}: {e}", config.label))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}\n{stderr}",
            config.label, output.status
        ));
    }
    max_rss_kib(&stderr)
}

fn no_time(e: std::io::Error) -> String {
    format!("cannot run /usr/bin/time (Debian's package `time`): {e}")
}

/// The peak RSS in KiB from the report of `/usr/bin/time -v` (GNU time's `ru_maxrss` of the
/// child it waited for).
fn max_rss_kib(stderr: &str) -> Result<u64, String> {
    stderr
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("Maximum resident set size (kbytes):")?
                .trim()
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("no peak RSS in /usr/bin/time's output:\n{stderr}"))
}

/// One `--memory --cli` run: the CLI's peak RSS and, traced, the size of its trace file.
struct CliRun {
    kib: u64,
    trace_bytes: Option<u64>,
}

/// `--memory --cli`: the `smollm` CLI of each build generating each of `memory_lengths`, the
/// traced one at `CLI_TRACE` with `--trace-out`; medians of `--rounds` runs.
fn measure_cli_memory(builds: &[Build; 2], args: &Args, threads: &str) -> Result<(), String> {
    let lengths = memory_lengths(args.tokens);
    eprintln!(
        "the smollm CLI untraced and at --trace {CLI_TRACE} with --trace-out, under \
         /usr/bin/time -v, {lengths:?} tokens (--ignore-eos), {} round(s), \
         RAYON_NUM_THREADS={threads}",
        args.rounds
    );
    // `[build][length]`: peak RSS in MiB, one entry per round.
    let mut peaks = [[(); 2].map(|()| Vec::new()), [(); 2].map(|()| Vec::new())];
    let mut trace_bytes = [0u64; 2];
    for round in 0..args.rounds {
        for (length, &tokens) in lengths.iter().enumerate() {
            for (traced, build) in builds.iter().enumerate() {
                let run = cli_peak_rss(build, traced == 1, args, threads, tokens)?;
                eprintln!(
                    "round {round}: {:<9} {tokens:>5} tokens: {} KiB{}",
                    if traced == 1 { "traced" } else { "untraced" },
                    run.kib,
                    run.trace_bytes
                        .map_or(String::new(), |b| format!(", trace file {b} bytes"))
                );
                peaks[traced][length].push(run.kib as f64 / 1024.0);
                if let Some(bytes) = run.trace_bytes {
                    trace_bytes[length] = bytes;
                }
            }
        }
    }
    let [untraced, traced] = peaks.map(|runs| runs.map(|r| median(&r)));
    println!(
        "\n| tokens | untraced (MiB) | traced, {CLI_TRACE}, --trace-out (MiB) | traced − untraced \
         (MiB) | trace file (MB) |\n|---:|---:|---:|---:|---:|"
    );
    for (length, tokens) in lengths.iter().enumerate() {
        println!(
            "| {tokens} | {:.1} | {:.1} | {:+.1} | {:.1} |",
            untraced[length],
            traced[length],
            traced[length] - untraced[length],
            trace_bytes[length] as f64 / 1e6
        );
    }
    let excess = |length: usize| traced[length] - untraced[length];
    println!(
        "growth of traced − untraced from {} to {} tokens: {:+.1} MiB \
         (medians of {} run(s) each; peak RSS is GNU time's maximum resident set size)",
        lengths[0],
        lengths[1],
        excess(1) - excess(0),
        args.rounds
    );
    Ok(())
}

/// `/usr/bin/time -v smollm --max-tokens TOKENS --ignore-eos [--trace CLI_TRACE --trace-out F]
/// PROMPT`, checked to have generated exactly `tokens` tokens.
fn cli_peak_rss(
    build: &Build,
    traced: bool,
    args: &Args,
    threads: &str,
    tokens: usize,
) -> Result<CliRun, String> {
    let label = if traced { "traced CLI" } else { "untraced CLI" };
    let mut command = Command::new("/usr/bin/time");
    command.arg("-v").arg(&build.cli);
    clean_env(&mut command, threads);
    command.args(["--max-tokens", &tokens.to_string(), "--ignore-eos"]);
    let trace_file = traced.then(|| build.dir.join(format!("cli-{CLI_TRACE}-{tokens}.ndjson")));
    if let Some(file) = &trace_file {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", file.display())),
        }
        command
            .args(["--trace", CLI_TRACE, "--trace-out"])
            .arg(file);
    }
    command.arg(&args.prompt).stdin(Stdio::null());
    let output = command.output().map_err(no_time)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("{label} failed: {}\n{stderr}", output.status));
    }
    // The first token comes from the prefill, each other one from a decode step.
    let steps = decode_steps(&stdout).unwrap_or(0);
    if steps + 1 != tokens {
        return Err(format!(
            "{label}: {steps} decode steps where {tokens} tokens need {}; was the end of text \
             ignored?\n{stdout}",
            tokens - 1
        ));
    }
    let trace_bytes = match &trace_file {
        Some(file) => Some(
            std::fs::metadata(file)
                .map_err(|e| format!("{label}: no trace file {}: {e}", file.display()))?
                .len(),
        ),
        None => None,
    };
    Ok(CliRun {
        kib: max_rss_kib(&stderr)?,
        trace_bytes,
    })
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
    bench_dir: &Path,
) -> Result<CountedRun, String> {
    let mut command = Command::new("valgrind");
    command
        .args([
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
        ])
        .arg(binary);
    let (decode_steps, stderr) = run_smollm(command, config, prompt, tokens, threads, bench_dir)
        .map_err(|e| {
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
        decode_steps,
    })
}

/// The two binaries of one build of the `smollm` package.
struct Build {
    /// The CLI, counted by `--instructions` and measured by `--memory --cli`.
    cli: PathBuf,
    /// The lockstep worker, timed by default.
    worker: PathBuf,
    /// Where the binaries (and the trace files of the runs) are.
    dir: PathBuf,
}

/// `cargo build --profile PROFILE -p smollm --bins [--features trace]`, the binaries copied into
/// `bench_dir` (suffixed `-traced` or `-untraced`) so the other build does not overwrite them.
fn build(
    workspace: &Path,
    target_dir: &Path,
    bench_dir: &Path,
    profile: &str,
    traced: bool,
) -> Result<Build, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace)
        .env("CARGO_TARGET_DIR", target_dir)
        .args(["build", "--profile", profile, "-p", "smollm"])
        .args(["--bin", "smollm", "--bin", "decode_worker"]);
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
    let suffix = if traced { "traced" } else { "untraced" };
    let copy = |name: &str| -> Result<PathBuf, String> {
        let exe = std::env::consts::EXE_SUFFIX;
        // Cargo's output directory: `debug` for dev and test, `release` for release and bench,
        // a custom profile's name for it.
        let profile_dir = match profile {
            "dev" | "test" => "debug",
            "bench" => "release",
            other => other,
        };
        let built = target_dir.join(profile_dir).join(format!("{name}{exe}"));
        let copy = bench_dir.join(format!("{name}-{suffix}{exe}"));
        std::fs::copy(&built, &copy)
            .map_err(|e| format!("cannot copy {} to {}: {e}", built.display(), copy.display()))?;
        Ok(copy)
    };
    Ok(Build {
        cli: copy("smollm")?,
        worker: copy("decode_worker")?,
        dir: bench_dir.to_path_buf(),
    })
}

/// The number of decode steps in the CLI's summary line
/// `decode: 131.4 ms/token (median of 23 steps, fastest 120.2 ms; prefill ...)`.
fn decode_steps(stdout: &str) -> Option<usize> {
    stdout.lines().find_map(|line| {
        let (_, rest) = line.strip_prefix("decode: ")?.split_once(" (median of ")?;
        rest.split_once(" steps")?.0.parse().ok()
    })
}

/// Finishes `command` (the CLI, or a wrapper with the CLI as its last argument so far) with the
/// configuration's arguments, runs it, and returns its number of decode steps and its stderr.
fn run_smollm(
    mut command: Command,
    config: &Config,
    prompt: &str,
    tokens: usize,
    threads: &str,
    bench_dir: &Path,
) -> Result<(usize, String), String> {
    configure(&mut command, config, threads, bench_dir);
    command.args(["--max-tokens", &tokens.to_string()]);
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
    let steps = decode_steps(&stdout).ok_or_else(|| {
        format!(
            "no `decode: N ms/token (median of N steps` line in the output of {}:\n{stdout}",
            config.label
        )
    })?;
    Ok((steps, stderr))
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

#[cfg(test)]
mod tests {
    use super::{
        decode_steps, max_rss_kib, median, memory_lengths, parse_args, round_bootstrap_interval,
        Args,
    };

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|a| (*a).to_owned()))
    }

    #[test]
    fn round_bootstrap_brackets_the_median_and_needs_two_rounds() {
        let rounds: Vec<Vec<f64>> = (0..12)
            .map(|r| {
                (0..8)
                    .map(|t| 1.0 + f64::from(r) * 0.01 + f64::from(t) * 1e-4)
                    .collect()
            })
            .collect();
        let slices: Vec<&[f64]> = rounds.iter().map(Vec::as_slice).collect();
        let pooled: Vec<f64> = rounds.concat();
        let (low, high) = round_bootstrap_interval(&slices, 2000).expect("12 rounds");
        assert!(low < median(&pooled) && median(&pooled) < high);
        assert_eq!(round_bootstrap_interval(&slices[..1], 2000), None);
    }

    #[test]
    fn round_bootstrap_is_wide_when_rounds_disagree() {
        // Two rounds far apart, tight inside: the turns alone would give a narrow interval
        // around the pooled median; rounds drawn whole span both.
        let low_round = [1.00, 1.001, 1.002, 1.003];
        let high_round = [1.10, 1.101, 1.102, 1.103];
        let (low, high) =
            round_bootstrap_interval(&[&low_round[..], &high_round[..]], 2000).expect("2 rounds");
        assert!(low <= 1.003 && high >= 1.10, "{low} .. {high}");
    }

    #[test]
    fn decode_steps_reads_the_cli_summary() {
        let stdout = "The capital of France is Paris.\n\
                      decode: 131.4 ms/token (median of 23 steps, fastest 120.2 ms; prefill of 5 tokens 300.0 ms)\n";
        assert_eq!(decode_steps(stdout), Some(23));
        assert_eq!(decode_steps("decode: no decode steps"), None);
    }

    #[test]
    fn rounds_and_tokens_default_per_mode() {
        let timed = parse(&[]).unwrap();
        assert_eq!((timed.rounds, timed.tokens), (10, 24));
        let memory = parse(&["--memory"]).unwrap();
        assert_eq!((memory.rounds, memory.tokens, memory.cli), (1, 1000, false));
        let cli = parse(&["--memory", "--cli"]).unwrap();
        assert_eq!((cli.rounds, cli.tokens, cli.cli), (3, 1000, true));
        let quick = parse(&["--memory", "--cli", "--rounds", "1", "--tokens", "2"]).unwrap();
        assert_eq!((quick.rounds, quick.tokens), (1, 2));
        assert!(parse(&["--cli"]).is_err());
        assert!(parse(&["--memory", "--instructions"]).is_err());
    }

    #[test]
    fn memory_lengths_are_a_fifth_and_the_whole() {
        assert_eq!(memory_lengths(1000), [200, 1000]);
        assert_eq!(memory_lengths(2), [1, 2]);
    }

    #[test]
    fn max_rss_reads_gnu_time() {
        let report = "\tCommand being timed: \"smollm\"\n\
                      \tMaximum resident set size (kbytes): 312456\n\
                      \tExit status: 0\n";
        assert_eq!(max_rss_kib(report), Ok(312_456));
        assert!(max_rss_kib("nothing").is_err());
    }
}

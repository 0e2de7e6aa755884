//! The command line: `gpu_check bench ...`, `verify`, `reads`, `parts` and `trace`.

use std::fmt;
use std::path::PathBuf;

use candle_core::DType;

pub const USAGE: &str = "\
usage: gpu_check bench [--device cpu|cuda] [--dtype f32|f16|bf16] [--rounds R] [--passes P]
                       [--layers N] [--json OUT]
       gpu_check verify [--device cpu|cuda] [--json OUT]
       gpu_check reads [--device cpu|cuda] [--sizes N,N,...] [--rounds R] [--passes P] [--json OUT]
       gpu_check parts [--device cpu|cuda] [--rounds R] [--passes P] [--json OUT]
       gpu_check trace --out FILE [--device cpu|cuda] [--dtype f32|f16|bf16] [--passes P]
                       [--layers N] [--capture PATTERN]
bench:  a SmolLM2-shaped decode step with random weights, untraced and traced, in R rounds of P
        passes per configuration (defaults: 10 rounds of 20 passes, 30 layers, f32)
verify: statistics and digests of tensors read on the device against the CPU's
        (exit status 0: all match, 1: a mismatch, 2: bad arguments or setup)
reads:  what one tensor's statistics cost in a forward pass, by size, reduced on the device and
        copied to the host, and the size below which the copy is cheaper
        (defaults: 1 to 4M elements, 5 rounds of 20 passes)
parts:  the host time one read of a 576-element device tensor costs, split into its parts (the
        session's bookkeeping, the device pointer, the queue, the pass, a digest)
        (defaults: 10 rounds of 20 passes)
trace:  the decode step traced in full (without quantization) into a trace file, to diff the
        same model on two devices (default: 2 passes)
--device defaults to cuda when built with the `cuda` feature and a GPU opens, else cpu";

/// Which device to run on, as `--device` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl DeviceKind {
    const NAMED: [(Self, &'static str); 2] = [(Self::Cpu, "cpu"), (Self::Cuda, "cuda")];

    pub fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or("", |&(_, name)| name)
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element types `--dtype` takes, with their names.
const DTYPES: [(DType, &str); 3] = [
    (DType::F32, "f32"),
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
];

#[derive(Debug, Clone, PartialEq)]
pub struct BenchArgs {
    /// `None`: the default device (see `crate::device::open`).
    pub device: Option<DeviceKind>,
    pub dtype: DType,
    pub rounds: usize,
    pub passes: usize,
    /// Blocks of the model (SmolLM2 has 30); fewer keep a smoke run short.
    pub layers: usize,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VerifyArgs {
    pub device: Option<DeviceKind>,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReadsArgs {
    pub device: Option<DeviceKind>,
    /// Elements of the tensors read, one measurement each.
    pub sizes: Vec<usize>,
    pub rounds: usize,
    pub passes: usize,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PartsArgs {
    pub device: Option<DeviceKind>,
    pub rounds: usize,
    pub passes: usize,
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TraceArgs {
    pub device: Option<DeviceKind>,
    pub dtype: DType,
    pub passes: usize,
    pub layers: usize,
    pub out: PathBuf,
    /// A capture filter: the tensors it admits are saved in full beside the trace.
    pub capture: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Bench(BenchArgs),
    Verify(VerifyArgs),
    Reads(ReadsArgs),
    Parts(PartsArgs),
    Trace(TraceArgs),
    Help,
}

/// Parses everything after the program name; the error is a message for the user.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let command = args
        .next()
        .ok_or("missing the command: bench, verify, reads, parts or trace")?;
    match command.as_str() {
        "bench" => parse_bench(args).map(Command::Bench),
        "verify" => parse_verify(args).map(Command::Verify),
        "reads" => parse_reads(args).map(Command::Reads),
        "parts" => parse_parts(args).map(Command::Parts),
        "trace" => parse_trace(args).map(Command::Trace),
        "-h" | "--help" | "help" => Ok(Command::Help),
        other => Err(format!(
            "unknown command {other:?}: bench, verify, reads, parts or trace"
        )),
    }
}

fn parse_bench(args: impl Iterator<Item = String>) -> Result<BenchArgs, String> {
    let mut parsed = BenchArgs {
        device: None,
        dtype: DType::F32,
        rounds: 10,
        passes: 20,
        layers: crate::model::LAYERS,
        json: None,
    };
    for (flag, value) in flags(args)? {
        match flag.as_str() {
            "--device" => parsed.device = Some(parse_device(&value)?),
            "--dtype" => parsed.dtype = parse_dtype(&value)?,
            "--rounds" => parsed.rounds = parse_count(&flag, &value)?,
            "--passes" => parsed.passes = parse_count(&flag, &value)?,
            "--layers" => parsed.layers = parse_count(&flag, &value)?,
            "--json" => parsed.json = Some(PathBuf::from(value)),
            other => return Err(format!("bench takes no {other}")),
        }
    }
    Ok(parsed)
}

fn parse_verify(args: impl Iterator<Item = String>) -> Result<VerifyArgs, String> {
    let mut parsed = VerifyArgs {
        device: None,
        json: None,
    };
    for (flag, value) in flags(args)? {
        match flag.as_str() {
            "--device" => parsed.device = Some(parse_device(&value)?),
            "--json" => parsed.json = Some(PathBuf::from(value)),
            other => return Err(format!("verify takes no {other}")),
        }
    }
    Ok(parsed)
}

/// Sizes from 1 element to 4M, by factors of 2 to 4, with SmolLM2's widths among them.
pub const DEFAULT_READ_SIZES: [usize; 13] = [
    1,
    16,
    64,
    256,
    576,
    1536,
    4096,
    16_384,
    49_152,
    262_144,
    1 << 20,
    2 << 20,
    4 << 20,
];

fn parse_reads(args: impl Iterator<Item = String>) -> Result<ReadsArgs, String> {
    let mut parsed = ReadsArgs {
        device: None,
        sizes: DEFAULT_READ_SIZES.to_vec(),
        rounds: 5,
        passes: 20,
        json: None,
    };
    for (flag, value) in flags(args)? {
        match flag.as_str() {
            "--device" => parsed.device = Some(parse_device(&value)?),
            "--sizes" => {
                parsed.sizes = value
                    .split(',')
                    .map(|size| parse_count(&flag, size.trim()))
                    .collect::<Result<_, _>>()?;
            }
            "--rounds" => parsed.rounds = parse_count(&flag, &value)?,
            "--passes" => parsed.passes = parse_count(&flag, &value)?,
            "--json" => parsed.json = Some(PathBuf::from(value)),
            other => return Err(format!("reads takes no {other}")),
        }
    }
    Ok(parsed)
}

fn parse_parts(args: impl Iterator<Item = String>) -> Result<PartsArgs, String> {
    let mut parsed = PartsArgs {
        device: None,
        rounds: 10,
        passes: 20,
        json: None,
    };
    for (flag, value) in flags(args)? {
        match flag.as_str() {
            "--device" => parsed.device = Some(parse_device(&value)?),
            "--rounds" => parsed.rounds = parse_count(&flag, &value)?,
            "--passes" => parsed.passes = parse_count(&flag, &value)?,
            "--json" => parsed.json = Some(PathBuf::from(value)),
            other => return Err(format!("parts takes no {other}")),
        }
    }
    Ok(parsed)
}

fn parse_trace(args: impl Iterator<Item = String>) -> Result<TraceArgs, String> {
    let mut out = None;
    let mut parsed = TraceArgs {
        device: None,
        dtype: DType::F32,
        passes: 2,
        layers: crate::model::LAYERS,
        out: PathBuf::new(),
        capture: None,
    };
    for (flag, value) in flags(args)? {
        match flag.as_str() {
            "--device" => parsed.device = Some(parse_device(&value)?),
            "--dtype" => parsed.dtype = parse_dtype(&value)?,
            "--passes" => parsed.passes = parse_count(&flag, &value)?,
            "--layers" => parsed.layers = parse_count(&flag, &value)?,
            "--out" => out = Some(PathBuf::from(value)),
            "--capture" => parsed.capture = Some(value),
            other => return Err(format!("trace takes no {other}")),
        }
    }
    parsed.out = out.ok_or("trace needs --out FILE")?;
    Ok(parsed)
}

/// `--flag value` and `--flag=value` pairs; every flag of this program takes a value.
fn flags(mut args: impl Iterator<Item = String>) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    while let Some(arg) = args.next() {
        if !arg.starts_with("--") {
            return Err(format!("unexpected argument {arg:?}"));
        }
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), value.to_owned()),
            None => {
                let value = args.next().ok_or(format!("{arg} needs a value"))?;
                (arg, value)
            }
        };
        pairs.push((flag, value));
    }
    Ok(pairs)
}

fn parse_device(value: &str) -> Result<DeviceKind, String> {
    DeviceKind::NAMED
        .iter()
        .find(|(_, name)| *name == value)
        .map(|&(kind, _)| kind)
        .ok_or_else(|| format!("--device takes cpu or cuda, not {value:?}"))
}

fn parse_dtype(value: &str) -> Result<DType, String> {
    DTYPES
        .iter()
        .find(|(_, name)| *name == value)
        .map(|&(dtype, _)| dtype)
        .ok_or_else(|| format!("--dtype takes f32, f16 or bf16, not {value:?}"))
}

fn parse_count(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag} takes a positive number, not {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<Command, String> {
        parse(words.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn bench_defaults_and_flags() {
        let Ok(Command::Bench(defaults)) = parse_words("bench") else {
            panic!("bench parses");
        };
        assert_eq!(
            (
                defaults.device,
                defaults.rounds,
                defaults.passes,
                defaults.layers
            ),
            (None, 10, 20, 30)
        );
        assert_eq!(defaults.dtype, DType::F32);
        let Ok(Command::Bench(given)) = parse_words(
            "bench --device cpu --dtype=bf16 --rounds 2 --passes 3 --layers 1 --json out.json",
        ) else {
            panic!("bench with flags parses");
        };
        assert_eq!(given.device, Some(DeviceKind::Cpu));
        assert_eq!(
            (given.dtype, given.rounds, given.passes),
            (DType::BF16, 2, 3)
        );
        assert_eq!(given.json, Some(PathBuf::from("out.json")));
    }

    #[test]
    fn verify_flags() {
        let Ok(Command::Verify(args)) = parse_words("verify --device cuda") else {
            panic!("verify parses");
        };
        assert_eq!(args.device, Some(DeviceKind::Cuda));
        assert!(parse_words("verify --rounds 3").is_err());
    }

    #[test]
    fn reads_and_trace_flags() {
        let Ok(Command::Reads(reads)) = parse_words("reads --sizes 1,576,1048576 --rounds 2")
        else {
            panic!("reads parses");
        };
        assert_eq!(reads.sizes, [1, 576, 1 << 20]);
        assert_eq!((reads.rounds, reads.passes), (2, 20));
        let Ok(Command::Reads(defaults)) = parse_words("reads") else {
            panic!("reads parses");
        };
        assert_eq!(defaults.sizes, DEFAULT_READ_SIZES);
        let Ok(Command::Parts(parts)) = parse_words("parts --device cpu --rounds 3 --json p.json")
        else {
            panic!("parts parses");
        };
        assert_eq!(
            (parts.device, parts.rounds, parts.passes),
            (Some(DeviceKind::Cpu), 3, 20)
        );
        assert_eq!(parts.json, Some(PathBuf::from("p.json")));
        let Ok(Command::Trace(trace)) =
            parse_words("trace --device cpu --out t.ndjson --capture layer:*")
        else {
            panic!("trace parses");
        };
        assert_eq!(trace.out, PathBuf::from("t.ndjson"));
        assert_eq!(
            (trace.passes, trace.capture.as_deref()),
            (2, Some("layer:*"))
        );
    }

    #[test]
    fn bad_arguments_are_errors() {
        for words in [
            "",
            "benchmark",
            "bench --device tpu",
            "bench --dtype f64",
            "bench --rounds 0",
            "bench --passes many",
            "bench --rounds",
            "bench extra",
            "reads --sizes 1,,2",
            "reads --sizes 0",
            "parts --sizes 1",
            "trace --device cpu",
        ] {
            assert!(parse_words(words).is_err(), "{words:?}");
        }
        assert_eq!(parse_words("--help"), Ok(Command::Help));
    }
}

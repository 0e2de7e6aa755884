//! The command line: `gpu_check bench ...` and `gpu_check verify ...`.

use std::fmt;
use std::path::PathBuf;

use candle_core::DType;

pub const USAGE: &str = "\
usage: gpu_check bench [--device cpu|cuda] [--dtype f32|f16|bf16] [--rounds R] [--passes P]
                       [--layers N] [--json OUT]
       gpu_check verify [--device cpu|cuda] [--json OUT]
bench:  a SmolLM2-shaped decode step with random weights, untraced and traced, in R rounds of P
        passes per configuration (defaults: 10 rounds of 20 passes, 30 layers, f32)
verify: statistics and digests of tensors read on the device against the CPU's
        (exit status 0: all match, 1: a mismatch, 2: bad arguments or setup)
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
pub enum Command {
    Bench(BenchArgs),
    Verify(VerifyArgs),
    Help,
}

/// Parses everything after the program name; the error is a message for the user.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let command = args.next().ok_or("missing the command: bench or verify")?;
    match command.as_str() {
        "bench" => parse_bench(args).map(Command::Bench),
        "verify" => parse_verify(args).map(Command::Verify),
        "-h" | "--help" | "help" => Ok(Command::Help),
        other => Err(format!("unknown command {other:?}: bench or verify")),
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
        ] {
            assert!(parse_words(words).is_err(), "{words:?}");
        }
        assert_eq!(parse_words("--help"), Ok(Command::Help));
    }
}

//! A port's command-line program run once, traced to a file, for the tests of what its trace
//! says: the header and the events; and the checks of what each mode (quantized,
//! `--dequantize`, `CANDLE_DEQUANTIZE_ALL=1`) records. Shared by the GGUF examples' tests
//! (`#[path]`).
//!
//! A run is a child process, so that an environment variable candle reads once per thread
//! (`CANDLE_DEQUANTIZE_ALL`) is set for it alone, never for the tests running beside it.

use model_trace::{
    Event, Fingerprint, TensorSummary, TraceHeader, TraceReader, CANDLE_DEQUANTIZE_ALL,
    CANDLE_DEQUANTIZE_ALL_F16,
};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The variables a run must not inherit from the caller: model-trace's own, and candle's.
const CLEARED: [&str; 8] = [
    model_trace::FILTER_ENV_VAR,
    model_trace::OUT_ENV_VAR,
    model_trace::CAPTURE_ENV_VAR,
    model_trace::RUN_ENV_VAR,
    model_trace::PATCH_ENV_VAR,
    model_trace::ISOLATE_ENV_VAR,
    CANDLE_DEQUANTIZE_ALL,
    CANDLE_DEQUANTIZE_ALL_F16,
];

/// What one traced run wrote.
pub struct TracedRun {
    pub header: TraceHeader,
    pub events: Vec<Event>,
}

impl TracedRun {
    /// Runs `program` with `args` and then `--trace-out FILE`, in an environment without
    /// [`CLEARED`]'s variables but with `env`, and reads the trace file it wrote. `name` tells
    /// this run's file from the others of the test binary. Panics, with the program's output,
    /// if it fails.
    pub fn of(program: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let file = trace_file(name);
        let mut command = Command::new(program);
        for var in CLEARED {
            command.env_remove(var);
        }
        let output = command
            .envs(env.iter().copied())
            .args(args)
            .arg("--trace-out")
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("{program} does not start: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let mut reader =
            TraceReader::open(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let events = (&mut reader)
            .map(|event| event.unwrap_or_else(|e| panic!("{}: {e}", file.display())))
            .collect();
        let header = reader.header().clone();
        let _ = std::fs::remove_file(&file);
        Self { header, events }
    }

    /// The tensor of `stage` (`input`, `attn_in`, ..., `output`) in `layer` of `pass`.
    #[allow(dead_code)] // not every port's tests read a stage
    pub fn stage(&self, pass: usize, layer: usize, stage: &str) -> Option<&TensorSummary> {
        self.events.iter().find_map(|event| match event {
            Event::Layer(l) if (l.pass, l.layer) == (pass, layer) => {
                l.stage(stage).map(|s| &s.tensor)
            }
            _ => None,
        })
    }

    /// Checks what the header says the run computed in: matmuls on `weights`, dequantized from
    /// the file's `from` (empty: as the file has them), said by `source`; F32 activations and
    /// KV cache; and the free-text `dtype` saying the same without the source.
    pub fn assert_precision(&self, weights: &[&str], from: &[&str], source: &str) {
        let metadata = &self.header.metadata;
        let precision = metadata.precision.as_ref().expect("a precision");
        assert_eq!(precision.weights, weights);
        assert_eq!(precision.dequantized_from, from);
        assert_eq!(precision.activations.as_deref(), Some("F32"));
        assert_eq!(precision.kv_cache.as_deref(), Some("F32"));
        assert_eq!(precision.source.as_deref(), Some(source));
        let matmuls = match from {
            [] => format!("{} weights", weights.join(", ")),
            _ => format!(
                "{} weights dequantized to {}",
                from.join(", "),
                weights.join(", ")
            ),
        };
        let dtype = format!("{matmuls}; F32 activations; F32 KV cache");
        assert_eq!(metadata.dtype.as_deref(), Some(dtype.as_str()));
    }

    /// How many quantization records the run wrote.
    pub fn quant_events(&self) -> usize {
        self.events
            .iter()
            .filter(|event| matches!(event, Event::Quant(_)))
            .count()
    }

    /// Every layer tensor's fingerprint, as (pass, layer, stage, fingerprint) in the order
    /// written, and the logits' last.
    pub fn fingerprints(&self) -> Vec<(usize, usize, String, Option<Fingerprint>)> {
        let mut all = Vec::new();
        for event in &self.events {
            match event {
                Event::Layer(layer) => all.extend(layer.stages.iter().map(|stage| {
                    let name = stage.name.to_string();
                    (layer.pass, layer.layer, name, stage.tensor.fingerprint)
                })),
                Event::Logits(logits) => all.push((
                    logits.pass,
                    logits.layer,
                    "logits".to_owned(),
                    logits.logits.fingerprint,
                )),
                _ => {}
            }
        }
        all
    }
}

/// A trace file of this test process's own, under the temporary directory.
fn trace_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "{}-{name}-{}.ndjson",
        env!("CARGO_PKG_NAME"),
        std::process::id()
    ))
}

/// A port's program in its three modes, one prompt pass each: what a test binary runs once
/// and checks.
pub struct Modes {
    /// The program (`env!("CARGO_BIN_EXE_...")`).
    pub program: &'static str,
    /// Its arguments before the mode's, for one traced prompt pass.
    pub args: &'static [&'static str],
    /// The prompt, last.
    pub prompt: &'static str,
    /// The types of the file's matmul weights, sorted.
    pub types: &'static [&'static str],
    /// Its quantized matmuls a pass.
    pub matmuls: usize,
    /// The layer tensors (input, stages, output) and logits a pass records.
    pub tensors: usize,
    /// The quantized run, made by [`Modes::quantized`] (`OnceLock::new()`).
    pub quantized: OnceLock<TracedRun>,
    /// The `--dequantize` run, made by [`Modes::dequantized`] (`OnceLock::new()`).
    pub dequantized: OnceLock<TracedRun>,
}

impl Modes {
    /// One run with the mode's `args` and `env` (`name` tells its trace file from the others').
    pub fn run(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> TracedRun {
        let mut all = self.args.to_vec();
        all.extend_from_slice(args);
        all.push(self.prompt);
        TracedRun::of(self.program, name, &all, env)
    }

    /// The run on the quantized weights, made once.
    pub fn quantized(&self) -> &TracedRun {
        self.quantized
            .get_or_init(|| self.run("quantized", &[], &[]))
    }

    /// The run with `--dequantize`, made once.
    pub fn dequantized(&self) -> &TracedRun {
        self.dequantized
            .get_or_init(|| self.run("dequantized", &["--dequantize"], &[]))
    }

    /// Quantized: the file's types, and a quantization record for every matmul.
    pub fn check_quantized(&self) {
        let run = self.quantized();
        run.assert_precision(self.types, &[], "the port");
        assert_eq!(run.quant_events(), self.matmuls);
    }

    /// `--dequantize`: F32 weights dequantized from the file's types, and no quantization
    /// record (an f32 matmul against its own f32 twin would record an error of 0 under a
    /// quantized label).
    pub fn check_dequantized(&self) {
        let run = self.dequantized();
        run.assert_precision(&["F32"], self.types, "the port");
        assert_eq!(run.quant_events(), 0);
    }

    /// `CANDLE_DEQUANTIZE_ALL=1`: what `--dequantize` records, said by the variable too, and
    /// every tensor bit for bit the same (the same f32 matmuls).
    pub fn check_candle_dequantize_all(&self) {
        let run = self.run("candle", &[], &[(CANDLE_DEQUANTIZE_ALL, "1")]);
        run.assert_precision(&["F32"], self.types, "the port, CANDLE_DEQUANTIZE_ALL=1");
        assert_eq!(run.quant_events(), 0);
        let fingerprints = run.fingerprints();
        assert_eq!(fingerprints.len(), self.tensors);
        assert!(fingerprints.iter().all(|(.., f)| f.is_some()));
        assert!(fingerprints == self.dequantized().fingerprints());
        assert!(fingerprints != self.quantized().fingerprints());
    }
}

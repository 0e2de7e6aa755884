//! Golden traces: a small annotated model checked against a golden file it wrote, and the
//! changes a check must name (one operation of one layer), the ones it must let pass (a
//! tolerance asked for; the same run on a machine with other kernels), and the files it writes
//! (missing, blessed, under CI, this run's trace beside a golden file it does not match).
#![cfg(feature = "enabled")]

use std::path::{Path, PathBuf};

use model_trace::golden::{Golden, GoldenError, CROSS_MACHINE_RTOL};
use model_trace::{
    trace_attention, trace_layer, trace_logits, trace_model, trace_tensor, Event, TraceReader,
};

const HIDDEN: usize = 64;
const LAYERS: usize = 4;
const VOCAB: usize = 32;

/// What a variant of the model does differently, to see what a check says about it.
#[derive(Clone, Copy, PartialEq)]
enum Change {
    None,
    /// The RMSNorm of this layer sums its squares from the last element to the first: the
    /// same sum in another order, which rounds differently.
    ReversedNormSum(usize),
    /// This layer's MLP output scaled by 1.01: a real bug.
    ScaledMlp(usize),
}

struct Block {
    index: usize,
    gain: Vec<f32>,
    change: Change,
}

impl Block {
    #[trace_layer(index = self.index)]
    fn forward(&self, x: &[f32], position: usize) -> Vec<f32> {
        let attn_in = self.rms_norm(x);
        trace_tensor!("attn_in", &attn_in);
        let probs = self.attention(&attn_in, position);
        let mixed: f32 = probs.iter().sum::<f32>() / probs.len() as f32;
        let attn_out: Vec<f32> = attn_in.iter().map(|v| v * mixed).collect();
        trace_tensor!("attn_out", &attn_out);
        let resid_mid: Vec<f32> = x.iter().zip(&attn_out).map(|(a, b)| a + b).collect();
        trace_tensor!("resid_mid", &resid_mid);
        let scale = if self.change == Change::ScaledMlp(self.index) {
            1.01
        } else {
            1.0
        };
        let mlp_out: Vec<f32> = resid_mid.iter().map(|v| v.tanh() * 0.5 * scale).collect();
        trace_tensor!("mlp_out", &mlp_out);
        resid_mid.iter().zip(&mlp_out).map(|(a, b)| a + b).collect()
    }

    fn rms_norm(&self, x: &[f32]) -> Vec<f32> {
        let squares = x.iter().map(|v| v * v);
        let sum: f32 = if self.change == Change::ReversedNormSum(self.index) {
            squares.rev().sum()
        } else {
            squares.sum()
        };
        let rms = (sum / x.len() as f32 + 1e-6).sqrt();
        x.iter().zip(&self.gain).map(|(v, g)| v / rms * g).collect()
    }

    #[trace_attention]
    fn attention(&self, x: &[f32], position: usize) -> Vec<f32> {
        let scores: Vec<f32> = (0..=position)
            .map(|k| x[k % HIDDEN] * (k + 1) as f32)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exp: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f32 = exp.iter().sum();
        exp.iter().map(|e| e / sum).collect()
    }
}

struct Model {
    blocks: Vec<Block>,
}

impl Model {
    fn new(change: Change) -> Self {
        let blocks = (0..LAYERS)
            .map(|index| Block {
                index,
                gain: (0..HIDDEN)
                    .map(|i| 1.0 + ((i * 7 + index) % 11) as f32 / 37.0)
                    .collect(),
                change,
            })
            .collect();
        Self { blocks }
    }

    #[trace_model(position = position, tokens = [token])]
    fn forward(&self, token: u32, position: usize) -> Vec<f32> {
        let mut hidden: Vec<f32> = (0..HIDDEN)
            .map(|i| ((i as f32 + 1.3) * (token as f32 + 0.7)).sin() * 3.1)
            .collect();
        for block in &self.blocks {
            hidden = block.forward(&hidden, position);
        }
        self.head(&hidden)
    }

    #[trace_logits]
    fn head(&self, hidden: &[f32]) -> Vec<f32> {
        (0..VOCAB)
            .map(|v| {
                hidden
                    .iter()
                    .enumerate()
                    .map(|(i, h)| h * ((i * v) as f32 * 0.01).cos())
                    .sum()
            })
            .collect()
    }

    /// Greedy decoding of `steps` tokens after `token`.
    fn generate(&self, mut token: u32, steps: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for position in 0..steps {
            let logits = self.forward(token, position);
            token = (0..VOCAB as u32)
                .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
                .unwrap_or(0);
            out.push(token);
        }
        out
    }
}

/// A fresh directory for one test's golden files.
fn directory(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("model-trace-golden-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A check of `path` that neither blesses nor behaves as under CI, whatever the environment.
fn golden(path: &Path) -> Golden {
    Golden::new(path).bless(false).in_ci(false)
}

fn run(change: Change) -> Vec<u32> {
    Model::new(change).generate(5, 3)
}

/// Blesses the golden file of the unchanged model.
fn blessed(test: &str) -> PathBuf {
    let path = directory(test).join("golden").join("tiny.ndjson");
    let (_, outcome) = Golden::new(&path).bless(true).compare(|| run(Change::None));
    let matched = outcome.expect("blessing writes the file");
    assert!(matched.blessed && matched.tensors > 0);
    path
}

#[test]
fn a_missing_golden_file_is_written_and_fails_then_the_same_run_passes_bit_exactly() {
    let path = directory("missing").join("tiny.ndjson");
    let (tokens, outcome) = golden(&path).compare(|| run(Change::None));
    assert_eq!(tokens, run(Change::None), "the closure's value comes back");
    match outcome {
        Err(GoldenError::Missing { written: true, .. }) => {}
        other => panic!("expected a missing file, written: {other:?}"),
    }
    let message = golden(&path).compare(|| ()).1.unwrap_err().to_string();
    assert!(message.contains("recorded no tensor"), "{message}");
    let (_, outcome) = golden(&path).compare(|| run(Change::None));
    let matched = outcome.expect("the same run matches");
    // Per pass: 4 layers × (input, 4 stages, attention, output) + logits; 3 passes.
    assert_eq!(matched.tensors, 3 * (LAYERS * 7 + 1));
    assert_eq!(matched.bit_identical, matched.tensors);
    assert!(matched.tolerant.is_none() && matched.note().is_none());
}

#[test]
fn under_ci_a_missing_golden_file_fails_without_being_written() {
    let path = directory("ci").join("tiny.ndjson");
    let (_, outcome) = golden(&path).in_ci(true).compare(|| run(Change::None));
    let error = outcome.unwrap_err();
    assert!(
        matches!(error, GoldenError::Missing { written: false, .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("MODEL_TRACE_BLESS=1"), "{error}");
    assert!(!path.exists());
}

#[test]
fn the_golden_file_is_one_line_per_layer_of_a_pass_and_reads_as_a_trace() {
    let path = blessed("format");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The header, then per pass: the pass line, a line per layer, the logits' line.
    assert_eq!(lines.len(), 1 + 3 * (1 + LAYERS + 1), "{text}");
    assert!(lines[0].starts_with(r#"{"format":"model-trace-golden","version":1,"machine":"#));
    assert_eq!(lines[1], r#"{"pass":0,"position":0,"tokens":[5]}"#);
    assert!(
        lines[2].starts_with(r#"{"pass":0,"layer":0,"tensors":[["input",[64],""#),
        "{}",
        lines[2]
    );
    // In the order they were computed: the attention probabilities inside the layer.
    let names = [
        "input",
        "attn_in",
        "attention",
        "attn_out",
        "resid_mid",
        "mlp_out",
        "output",
    ];
    assert_eq!(lines[2].matches("[\"").count(), names.len(), "{}", lines[2]);
    assert!(
        names
            .iter()
            .all(|name| lines[2].contains(&format!("[\"{name}\","))),
        "{}",
        lines[2]
    );
    let at = |name: &str| lines[2].find(name).unwrap();
    assert!(at("\"attn_in\"") < at("\"attention\"") && at("\"attention\"") < at("\"attn_out\""));
    assert!(
        lines[6].contains(r#"["logits",[32],"#) && lines[6].contains(r#"{"top":[["#),
        "{}",
        lines[6]
    );
    // Read back as a trace: the layers, attention and logits of three passes.
    let mut reader = TraceReader::open(&path).unwrap();
    assert_eq!(reader.header().format, "model-trace-golden");
    let events: Vec<Event> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
    assert_eq!(count(|e| matches!(e, Event::PassBegin(_))), 3);
    assert_eq!(count(|e| matches!(e, Event::PassEnd(_))), 3);
    assert_eq!(
        count(|e| matches!(e, Event::Layer(l) if l.stages.len() == 6)),
        3 * LAYERS
    );
    assert_eq!(count(|e| matches!(e, Event::Attention(_))), 3 * LAYERS);
    assert_eq!(
        count(|e| matches!(e, Event::Logits(l) if l.batch_rows[0].top_tokens.len() == 5)),
        3
    );
}

#[test]
fn a_sum_taken_in_another_order_in_one_layer_is_named_with_its_layer_and_stage() {
    let path = blessed("one-op");
    let (_, outcome) = golden(&path).compare(|| run(Change::ReversedNormSum(2)));
    let Err(GoldenError::Mismatch(mismatch)) = outcome else {
        panic!("a changed operation must fail the check: {outcome:?}");
    };
    // Named at the first pass whose sum rounds differently (a sum of 64 squares taken in
    // another order may round to the same bits, and does in some passes here).
    let first = mismatch.first.as_ref().expect("a first difference");
    assert_eq!((first.layer, first.name.as_str()), (2, "attn_in"));
    let message = mismatch.to_string();
    let named = format!(
        "first difference: pass {}, layer 2, attn_in: other bits",
        first.pass
    );
    assert!(message.contains(&named), "{message}");
    // Every tensor before it is bit-identical: at least layers 0 and 1 of its pass, and layer
    // 2's input.
    assert!(mismatch.bit_identical > 2 * 7, "{message}");
    let new = path.with_file_name("tiny.new.ndjson");
    assert!(
        new.exists(),
        "this run's trace is written beside the golden file"
    );
    assert!(
        message.contains(&format!(
            "model-trace diff --atol 0 --rtol 0 {} {}",
            path.display(),
            new.display()
        )),
        "{message}"
    );
    // The same change within a tolerance asked for: it rounds, it computes the same.
    let (_, outcome) = golden(&path)
        .rtol(1e-4)
        .compare(|| run(Change::ReversedNormSum(2)));
    let matched = outcome.expect("within 1e-4");
    assert!(matched.bit_identical < matched.tensors);
    // A passing check removes the stale trace of the failed one.
    assert!(!new.exists());
}

#[test]
fn a_bug_fails_a_tolerant_check_by_its_statistics() {
    let path = blessed("bug");
    let (_, outcome) = golden(&path)
        .rtol(1e-4)
        .compare(|| run(Change::ScaledMlp(1)));
    let Err(GoldenError::Mismatch(mismatch)) = outcome else {
        panic!("a 1% error is not within 1e-4: {outcome:?}");
    };
    let first = mismatch.first.as_ref().unwrap();
    assert_eq!(
        (first.pass, first.layer, first.name.as_str()),
        (0, 1, "mlp_out")
    );
    let message = mismatch.to_string();
    assert!(message.contains("× the allowance"), "{message}");
    assert!(
        message.contains("by statistics within rtol 0.0001"),
        "{message}"
    );
}

#[test]
fn on_another_machine_the_statistics_decide_within_the_stated_tolerance() {
    let path = blessed("machine");
    let text = std::fs::read_to_string(&path).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let machine = model_trace::machine();
    assert!(
        header.contains(&format!("\"machine\":\"{machine}\"")),
        "{header}"
    );
    let other = header.replace(
        &format!("\"machine\":\"{machine}\""),
        "\"machine\":\"riscv64 v\"",
    );
    std::fs::write(&path, format!("{other}\n{rest}")).unwrap();
    // Rounding that another machine's kernels would do: passes, and says how it compared.
    let (_, outcome) = golden(&path).compare(|| run(Change::ReversedNormSum(2)));
    let matched = outcome.expect("a rounding difference passes on another machine");
    let tolerant = matched.tolerant.as_ref().expect("compared by statistics");
    assert_eq!(tolerant.tolerance.rtol, CROSS_MACHINE_RTOL);
    let note = matched.note().unwrap();
    assert!(
        note.contains("blessed on another machine (riscv64 v") && note.contains(&machine),
        "{note}"
    );
    // A real bug does not.
    let (_, outcome) = golden(&path).compare(|| run(Change::ScaledMlp(3)));
    let Err(GoldenError::Mismatch(mismatch)) = outcome else {
        panic!("a 1% error fails on any machine: {outcome:?}");
    };
    assert_eq!(mismatch.first.as_ref().map(|p| p.layer), Some(3));
    assert!(mismatch
        .to_string()
        .contains("blessed on another machine (riscv64 v)"));
}

#[test]
fn blessing_rewrites_the_golden_file_and_then_the_changed_run_passes() {
    let path = blessed("bless");
    let before = std::fs::read_to_string(&path).unwrap();
    let (_, outcome) = golden(&path)
        .bless(true)
        .compare(|| run(Change::ScaledMlp(0)));
    assert!(outcome
        .unwrap()
        .note()
        .unwrap()
        .contains("review and commit it"));
    let after = std::fs::read_to_string(&path).unwrap();
    assert_ne!(before, after);
    // Only the lines of changed layers differ (a clean `git diff`): pass lines are the same.
    let same = before
        .lines()
        .zip(after.lines())
        .filter(|(a, b)| a == b)
        .count();
    assert!(same > 3, "{same}");
    golden(&path).check(|| run(Change::ScaledMlp(0)));
}

#[test]
#[should_panic(expected = "golden check failed")]
fn check_panics_with_what_differs() {
    let path = blessed("panics");
    golden(&path).check(|| run(Change::ScaledMlp(2)));
}

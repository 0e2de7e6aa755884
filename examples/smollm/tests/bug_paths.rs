//! Each injected bug of the decode, cache and batch paths changes the numbers of the paths it
//! names, and only those: with the bug on, every other path is bit-identical to the clean port.
//! The relations of `tests/passes.rs` must find a bug on its path, and no bug where it is not.
//!
//! One test: the bug switch is the process's, so the bugs run one after another. Missing weights
//! fail the test (never skip): run `scripts/fetch-models` first.

use candle_core::Tensor;
use smollm::generate::load;
use smollm::model::argmax;
use smollm::passes::{run_split, Split};
use smollm::{bugs, Batch, GgufTokenizer, Model};

/// The paths a bug may change, each computed the same way with and without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// 8 tokens in one pass.
    Whole,
    /// A prefill of 6, then 2 decode steps.
    Decode,
    /// Passes of 4 tokens (none of one token: no decode step).
    Chunks,
    /// A batch of 3 prompts of different lengths, left-padded: its prefill.
    PaddedPrefill,
    /// The same batch's first decode step.
    PaddedDecode,
    /// A batch of 2 prompts of the same length (no padding): its prefill.
    EvenPrefill,
}

const PATHS: [Path; 6] = [
    Path::Whole,
    Path::Decode,
    Path::Chunks,
    Path::PaddedPrefill,
    Path::PaddedDecode,
    Path::EvenPrefill,
];

/// Each bug and the paths it changes; it leaves the others bit-identical.
const BUGS: [(&str, &[Path]); 7] = [
    ("kv-cache-off-by-one", &[Path::Decode, Path::PaddedDecode]),
    (
        "rope-decode-position-missing",
        &[Path::Decode, Path::PaddedDecode],
    ),
    (
        "rope-decode-position-twice",
        &[Path::Decode, Path::PaddedDecode],
    ),
    (
        "kv-cache-f16",
        &[Path::Decode, Path::Chunks, Path::PaddedDecode],
    ),
    (
        "kv-cache-bf16",
        &[Path::Decode, Path::Chunks, Path::PaddedDecode],
    ),
    (
        "batch-rope-ignores-padding",
        &[Path::PaddedPrefill, Path::PaddedDecode],
    ),
    (
        "batch-mask-other-row",
        &[Path::PaddedPrefill, Path::PaddedDecode],
    ),
];

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Rust is a programming language that",
    "Hi",
];

struct Inputs {
    tokens: Vec<u32>,
    padded: Vec<Vec<u32>>,
    even: Vec<Vec<u32>>,
    pad_id: u32,
}

fn inputs(tokenizer: &GgufTokenizer) -> Inputs {
    let text = std::fs::read_to_string("../../LICENSE-APACHE").unwrap();
    let mut tokens = tokenizer.encode(&text).unwrap();
    tokens.truncate(8);
    let padded = PROMPTS
        .iter()
        .map(|p| tokenizer.encode(p).unwrap())
        .collect();
    Inputs {
        even: vec![tokens[..4].to_vec(), tokens[4..].to_vec()],
        tokens,
        padded,
        pad_id: tokenizer.eos_id,
    }
}

/// The logits `path` ends with.
fn run(model: &mut Model, inputs: &Inputs, path: Path) -> Tensor {
    match path {
        Path::Whole => run_split(model, &inputs.tokens, Split::Whole).unwrap(),
        Path::Decode => run_split(model, &inputs.tokens, Split::DecodeFrom(6)).unwrap(),
        Path::Chunks => run_split(model, &inputs.tokens, Split::Chunks(4)).unwrap(),
        Path::PaddedPrefill | Path::PaddedDecode => {
            let batch = Batch::left_padded(&inputs.padded, inputs.pad_id).unwrap();
            let logits = model.forward_batch(&batch, 0).unwrap();
            if path == Path::PaddedPrefill {
                return logits;
            }
            let next = (0..batch.rows())
                .map(|row| argmax(&logits.get(row).unwrap()).unwrap())
                .collect();
            let step = batch.continued(next).unwrap();
            model.forward_batch(&step, batch.columns()).unwrap()
        }
        Path::EvenPrefill => {
            let batch = Batch::left_padded(&inputs.even, inputs.pad_id).unwrap();
            model.forward_batch(&batch, 0).unwrap()
        }
    }
}

fn values(logits: &Tensor) -> Vec<f32> {
    logits.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `max |a - b| / max |a|`.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    worst / scale
}

#[test]
fn each_bug_changes_the_paths_it_names_and_leaves_the_others_bit_identical() {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    let (mut model, tokenizer) =
        load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
    let inputs = inputs(&tokenizer);
    let lengths: Vec<usize> = inputs.padded.iter().map(Vec::len).collect();
    assert!(
        lengths[0] != lengths[1] && lengths[1] != lengths[2],
        "{lengths:?}"
    );

    bugs::inject_list("").unwrap();
    let clean: Vec<Vec<f32>> = PATHS
        .iter()
        .map(|&path| values(&run(&mut model, &inputs, path)))
        .collect();
    let mut wrong = Vec::new();
    for (bug, changed) in BUGS {
        bugs::inject_list(bug).unwrap();
        for (&path, clean) in PATHS.iter().zip(&clean) {
            let buggy = values(&run(&mut model, &inputs, path));
            let identical = buggy
                .iter()
                .zip(clean)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            let error = relative_error(clean, &buggy);
            println!("{bug:30} {path:?}: relative error {error:.2e}");
            if identical == changed.contains(&path) {
                wrong.push(format!(
                    "{bug} on {path:?}: {} (relative error {error:e})",
                    if identical { "no change" } else { "changed" }
                ));
            }
        }
    }
    bugs::inject_list("").unwrap();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

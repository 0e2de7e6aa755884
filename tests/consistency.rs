//! Consistency checks on a small annotated model with a KV cache, positions and a batch path:
//! the three relations hold bit for bit on the clean model, and each injected bug is named at
//! its position, layer and stage (or batch row).
#![cfg(feature = "enabled")]

use model_trace::consistency::{Consistency, ConsistencyError};
use model_trace::{trace_layer, trace_model, trace_tensor, TensorRef};

const HIDDEN: usize = 16;
const LAYERS: usize = 3;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Bug {
    None,
    /// A decode step's keys written one position early.
    CacheOffByOne,
    /// A batch row's rotary position taken as its column (its padding not subtracted).
    RopeIgnoresPadding,
}

/// One layer's cache: per sequence, the keys and values of each column.
#[derive(Default)]
struct Cache {
    keys: Vec<Vec<Vec<f32>>>,
    values: Vec<Vec<Vec<f32>>>,
}

struct Block {
    index: usize,
    bug: Bug,
}

/// Rows `[batch, seq, HIDDEN]` with each row's left padding.
struct Rows<'a> {
    values: &'a [f32],
    batch: usize,
    seq: usize,
    padding: &'a [usize],
}

impl Block {
    #[trace_layer(index = self.index)]
    fn forward(&self, x: &Rows<'_>, column: usize, cache: &mut Cache) -> Vec<f32> {
        let shape = [x.batch, x.seq, HIDDEN];
        let attn_in: Vec<f32> = x.values.chunks(HIDDEN).flat_map(rms_norm).collect();
        trace_tensor!("attn_in", &TensorRef::new(&attn_in, &shape).unwrap());
        let attn_out = self.attention(&attn_in, x, column, cache);
        trace_tensor!("attn_out", &TensorRef::new(&attn_out, &shape).unwrap());
        let out: Vec<f32> = x.values.iter().zip(&attn_out).map(|(a, b)| a + b).collect();
        let mlp_out: Vec<f32> = out.iter().map(|v| (v * 1.3).tanh() * 0.5).collect();
        trace_tensor!("mlp_out", &TensorRef::new(&mlp_out, &shape).unwrap());
        out.iter().zip(&mlp_out).map(|(a, b)| a + b).collect()
    }

    fn attention(&self, x: &[f32], rows: &Rows<'_>, column: usize, cache: &mut Cache) -> Vec<f32> {
        cache.keys.resize(rows.batch, Vec::new());
        cache.values.resize(rows.batch, Vec::new());
        let mut out = Vec::with_capacity(x.len());
        for b in 0..rows.batch {
            let pad = rows.padding[b];
            let position = |c: usize| match self.bug {
                Bug::RopeIgnoresPadding => c,
                _ => c.saturating_sub(pad),
            };
            for s in 0..rows.seq {
                let c = column + s;
                let row = &x[(b * rows.seq + s) * HIDDEN..][..HIDDEN];
                let key = rotate(row, position(c));
                let value: Vec<f32> = row.iter().map(|v| v * 0.7 + 0.1).collect();
                let at = if self.bug == Bug::CacheOffByOne && rows.seq == 1 && c > 0 {
                    c - 1
                } else {
                    c
                };
                for stored in [&mut cache.keys[b], &mut cache.values[b]] {
                    if stored.len() <= c {
                        stored.resize(c + 1, vec![0.0; HIDDEN]);
                    }
                }
                cache.keys[b][at] = key;
                cache.values[b][at] = value;
                let query = rotate(row, position(c));
                out.extend(attend(
                    &query,
                    &cache.keys[b][..=c],
                    &cache.values[b][..=c],
                    pad.min(c),
                ));
            }
        }
        out
    }
}

fn rms_norm(row: &[f32]) -> Vec<f32> {
    let rms = (row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32 + 1e-6).sqrt();
    row.iter().map(|v| v / rms).collect()
}

/// A position-dependent rotation of each pair of values.
fn rotate(row: &[f32], position: usize) -> Vec<f32> {
    let mut out = row.to_vec();
    for (i, pair) in out.chunks_mut(2).enumerate() {
        let angle = position as f32 / 10f32.powf(i as f32 / 4.0);
        let (sin, cos) = angle.sin_cos();
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * cos - b * sin;
        pair[1] = a * sin + b * cos;
    }
    out
}

/// Softmax attention of `query` over keys `first..`.
fn attend(query: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], first: usize) -> Vec<f32> {
    let scores: Vec<f32> = keys[first..]
        .iter()
        .map(|k| k.iter().zip(query).map(|(a, b)| a * b).sum::<f32>() / 4.0)
        .collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f32 = weights.iter().sum();
    let mut out = vec![0.0; HIDDEN];
    for (w, v) in weights.iter().zip(&values[first..]) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += w / total * x;
        }
    }
    out
}

struct Model {
    blocks: Vec<Block>,
    caches: Vec<Cache>,
}

impl Model {
    fn new(bug: Bug) -> Self {
        Self {
            blocks: (0..LAYERS).map(|index| Block { index, bug }).collect(),
            caches: (0..LAYERS).map(|_| Cache::default()).collect(),
        }
    }

    fn clear(&mut self) {
        self.caches.iter_mut().for_each(|c| *c = Cache::default());
    }

    /// One pass over `tokens` (`batch` rows one after another) at `column`.
    #[trace_model(position = column, tokens = tokens)]
    fn forward(&mut self, tokens: &[u32], batch: usize, padding: &[usize], column: usize) {
        let mut x: Vec<f32> = tokens.iter().flat_map(|&t| embed(t)).collect();
        let seq = tokens.len() / batch;
        for (block, cache) in self.blocks.iter().zip(&mut self.caches) {
            let rows = Rows {
                values: &x,
                batch,
                seq,
                padding,
            };
            x = block.forward(&rows, column, cache);
        }
    }

    /// `tokens` in passes: a prefill of `prefill`, then `chunk` tokens a pass.
    fn run(&mut self, tokens: &[u32], prefill: usize, chunk: usize) {
        self.clear();
        self.forward(&tokens[..prefill], 1, &[0], 0);
        let mut at = prefill;
        while at < tokens.len() {
            let end = (at + chunk).min(tokens.len());
            self.forward(&tokens[at..end], 1, &[0], at);
            at = end;
        }
    }

    /// `prompts` left-padded to the longest, prefilled together, then `steps` more tokens each.
    fn run_batch(&mut self, prompts: &[Vec<u32>], steps: usize) {
        self.clear();
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let padding: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
        let tokens: Vec<u32> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(0, width - p.len()).chain(p.iter().copied()))
            .collect();
        self.forward(&tokens, prompts.len(), &padding, 0);
        for step in 0..steps {
            let next: Vec<u32> = prompts.iter().map(|p| follow(p, step)).collect();
            self.forward(&next, prompts.len(), &padding, width + step);
        }
    }

    /// `prompt` alone, then the same `steps` tokens as [`run_batch`](Self::run_batch).
    fn run_alone(&mut self, prompt: &[u32], steps: usize) {
        self.clear();
        self.forward(prompt, 1, &[0], 0);
        for step in 0..steps {
            self.forward(&[follow(prompt, step)], 1, &[0], prompt.len() + step);
        }
    }
}

/// The token a prompt's `step`-th decode step feeds (fixed, not sampled).
fn follow(prompt: &[u32], step: usize) -> u32 {
    (prompt.len() as u32 * 7 + step as u32 * 3) % 50
}

fn embed(token: u32) -> Vec<f32> {
    (0..HIDDEN)
        .map(|i| ((token as f32 + 1.0) * (i as f32 + 0.5)).sin())
        .collect()
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 31 + 7) % 50).collect()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![tokens(9), tokens(5)[1..].to_vec(), tokens(7)]
}

#[test]
fn the_clean_model_is_bit_identical_in_every_split() {
    let ids = tokens(40);
    let model = std::cell::RefCell::new(Model::new(Bug::None));
    for (prefill, chunk, relation) in [
        (30, 1, "prefill 30 + 10 decode steps = one pass"),
        (8, 8, "chunks of 8 = one pass"),
    ] {
        let agreement = Consistency::new(relation).rtol(0.0).check(
            || model.borrow_mut().run(&ids, 40, 1),
            || model.borrow_mut().run(&ids, prefill, chunk),
        );
        let comparison = agreement.comparison;
        // 40 positions x 3 layers x 3 stages, every one the same bits.
        assert_eq!(comparison.compared, 40 * LAYERS * 3, "{relation}");
        assert_eq!(comparison.bit_identical, comparison.compared, "{relation}");
        assert!(comparison.tokens_checked);
        assert_eq!(comparison.max_error(), 0.0);
    }
}

#[test]
fn a_batch_matches_each_prompt_alone_with_its_padding_left_out() {
    let prompts = prompts();
    let model = std::cell::RefCell::new(Model::new(Bug::None));
    let agreement = Consistency::new("a batch of 3 = each alone")
        .rtol(0.0)
        .check_batch(
            prompts
                .iter()
                .map(|p| || model.borrow_mut().run_alone(p, 4)),
            || model.borrow_mut().run_batch(&prompts, 4),
        );
    let comparison = agreement.comparison;
    let paddings: Vec<usize> = comparison.pairings.iter().map(|p| p.shift).collect();
    assert_eq!(paddings, [0, 5, 2]);
    // Every real position of every row: (9 + 4) + (4 + 4) + (7 + 4) positions.
    assert_eq!(comparison.compared, (13 + 8 + 11) * LAYERS * 3);
    assert_eq!(comparison.bit_identical, comparison.compared);
}

#[test]
fn a_kv_cache_written_one_position_early_is_named_at_the_second_decode_step() {
    let ids = tokens(40);
    let (clean, buggy) = (
        std::cell::RefCell::new(Model::new(Bug::None)),
        std::cell::RefCell::new(Model::new(Bug::CacheOffByOne)),
    );
    let (_, _, outcome) = Consistency::new("prefill + decode = one pass").compare(
        || clean.borrow_mut().run(&ids, 40, 1),
        || buggy.borrow_mut().run(&ids, 30, 1),
    );
    let comparison = outcome.unwrap();
    assert!(comparison.diverged());
    let first = comparison.first.clone().unwrap();
    // Decode step 30 writes its key over position 29's and leaves its own place empty: the
    // attention of position 30 is the first to read the cache wrong.
    assert_eq!(
        (first.place.position, first.layer, first.stage.as_str()),
        (30, 0, "attn_out")
    );
    assert_eq!(first.passes, (0, 1));
    let text = comparison.describe("one pass", "prefill + decode");
    assert!(
        text.contains("first past tolerance: position 30 layer 0 stage attn_out"),
        "{text}"
    );
}

#[test]
fn rotary_positions_that_ignore_padding_are_named_at_the_padded_row() {
    let prompts = prompts();
    let (clean, buggy) = (
        std::cell::RefCell::new(Model::new(Bug::None)),
        std::cell::RefCell::new(Model::new(Bug::RopeIgnoresPadding)),
    );
    // Rotary embeddings are relative: a row whose every position is shifted by its padding
    // scores its keys the same in exact arithmetic, and differs by rounding only. The batch
    // relation holds bit for bit on this model, so a bit-exact check still names it.
    let (_, _, outcome) = Consistency::new("a batch = each alone")
        .rtol(0.0)
        .compare_batch(
            prompts
                .iter()
                .map(|p| || clean.borrow_mut().run_alone(p, 2)),
            || buggy.borrow_mut().run_batch(&prompts, 2),
        );
    let comparison = outcome.unwrap();
    let first = comparison.first.clone().unwrap();
    // Row 0 has no padding and is right; rows 1 and 2 are rotated at other angles from their
    // first token on.
    assert_eq!(first.layer, 0);
    assert_ne!(first.actual_place.sequence, 0);
    assert!(comparison.max_error() < 1e-5, "{}", comparison.max_error());
    assert!(comparison
        .worst_by_layer
        .values()
        .all(|worst| worst.actual_place.sequence != 0));
    let text = comparison.describe("the runs alone", "the batch");
    assert!(text.contains("batch row"), "{text}");
}

#[test]
#[should_panic(expected = "first past tolerance: position 30 layer 0 stage attn_out")]
fn check_panics_naming_the_first_row_past_tolerance() {
    let ids = tokens(36);
    let (clean, buggy) = (
        std::cell::RefCell::new(Model::new(Bug::None)),
        std::cell::RefCell::new(Model::new(Bug::CacheOffByOne)),
    );
    Consistency::new("prefill + decode = one pass").check(
        || clean.borrow_mut().run(&ids, 36, 1),
        || buggy.borrow_mut().run(&ids, 30, 1),
    );
}

#[test]
fn runs_without_rows_or_with_another_batch_size_are_errors_that_say_so() {
    let model = std::cell::RefCell::new(Model::new(Bug::None));
    let (_, _, outcome) = Consistency::new("nothing recorded").compare(|| (), || ());
    let error = outcome.unwrap_err();
    assert!(matches!(error, ConsistencyError::Positions(_)));
    assert!(error.to_string().contains("no row summaries"), "{error}");
    let prompts = prompts();
    let (_, _, outcome) = Consistency::new("two alone, a batch of three").compare_batch(
        prompts[..2]
            .iter()
            .map(|p| || model.borrow_mut().run_alone(p, 1)),
        || model.borrow_mut().run_batch(&prompts, 1),
    );
    let error = outcome.unwrap_err().to_string();
    assert!(
        error.contains("the batch has 3 rows but 2 runs alone"),
        "{error}"
    );
}

/// A pass that does not say its position (it is then at its number) over `ids`.
#[trace_model(tokens = ids)]
fn unpositioned(ids: &[u32]) {
    unpositioned_layer(ids);
}

#[trace_layer(index = 0)]
fn unpositioned_layer(ids: &[u32]) {
    let values: Vec<f32> = ids.iter().flat_map(|&t| embed(t)).collect();
    trace_tensor!(
        "attn_in",
        &TensorRef::new(&values, &[1, ids.len(), HIDDEN]).unwrap()
    );
}

#[test]
fn passes_without_their_position_are_an_error_not_a_verdict() {
    let ids = tokens(6);
    let (_, _, outcome) = Consistency::new("prefill + decode = one pass").compare(
        || unpositioned(&ids),
        || {
            unpositioned(&ids[..4]);
            unpositioned(&ids[4..5]);
            unpositioned(&ids[5..]);
        },
    );
    let error = outcome.unwrap_err().to_string();
    assert!(
        error.contains("recorded position 1 of sequence 0 twice"),
        "{error}"
    );
    assert!(error.contains("`position = ..`"), "{error}");
}

#[test]
fn a_run_that_stops_early_fails_the_check() {
    let ids = tokens(20);
    let model = std::cell::RefCell::new(Model::new(Bug::None));
    let (_, _, outcome) = Consistency::new("prefill + decode = one pass").compare(
        || model.borrow_mut().run(&ids, 20, 1),
        || model.borrow_mut().run(&ids[..15], 10, 1),
    );
    let comparison = outcome.unwrap();
    assert!(comparison.first.is_none());
    assert_eq!(comparison.unpaired, 5 * LAYERS * 3);
    assert!(comparison.diverged());
    let text = comparison.describe("one pass", "prefill + decode");
    assert!(
        text.contains("the runs do not cover the same positions"),
        "{text}"
    );
}

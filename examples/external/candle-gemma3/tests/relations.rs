//! The three relations of a model against itself, checked with model-trace's
//! `Consistency` helper on candle-transformers' own Gemma 3, past its 512-key sliding window:
//! LICENSE-APACHE's first 600 token ids in one pass against a prefill and decode steps and
//! against chunks; prompts in one batch against each alone.
//!
//! The model runs on its weights dequantized to f32 (`Weights::Dequantized`, candle's
//! `CANDLE_DEQUANTIZE_ALL`). Quantized, candle rounds each matrix product's input rows to 8 bits,
//! and those steps turn the rounding differences of two passes (1e-7) into row errors of up to
//! 0.15 within the prefill, which no tolerance tells from a bug; f32 keeps them at 1e-5. The
//! README gives the quantized figures (measured with the binary and `model-trace diff`).
//!
//! Each test asserts what candle's model does today: one bug named where it first shows, two
//! paths that stop with candle's error, two relations that hold.
#![cfg(feature = "trace")]

use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use candle_gemma3::runs::Weights;
use candle_gemma3::Gemma3;
use model_trace::consistency::Consistency;

/// LICENSE-APACHE's token ids computed by the one-pass, decode and chunk runs.
const TOKENS: usize = 600;
/// The prefill before the decode steps.
const PREFILL: usize = 500;
/// Tokens a pass of the chunked run.
const CHUNK: usize = 128;
/// Gemma 3 270M's blocks.
const LAYERS: usize = 18;
/// Rows recorded per layer and position: the layer's input and output and the seven stages of
/// `LayerWeights::forward`.
const STAGES: usize = 9;
/// Prompts in a batch.
const PROMPTS: usize = 3;

/// The model, loaded once for all the tests (a test holds it while it runs).
fn model() -> MutexGuard<'static, Gemma3> {
    static MODEL: OnceLock<Mutex<Gemma3>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let model = Gemma3::load_cached(Weights::Dequantized);
            Mutex::new(model.unwrap_or_else(|error| panic!("{error}")))
        })
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Candle's decode step (one token, `seq_len == 1`) applies no mask, and its KV cache keeps
/// every key: a sliding-window layer's decode step attends to all earlier positions, where one
/// pass masks those more than 512 back. Position 513 is the first with such a key (key 0).
#[test]
fn decode_steps_past_the_sliding_window_are_named_at_position_513() {
    let guard = model();
    let ids = guard.license_tokens(TOKENS).unwrap();
    let model = RefCell::new(guard);
    let (one_pass, split, outcome) = Consistency::new("a prefill of 500 + decode steps = one pass")
        .compare(
            || model.borrow_mut().run_split(&ids, TOKENS, TOKENS),
            || model.borrow_mut().run_split(&ids, PREFILL, 1),
        );
    one_pass.unwrap();
    split.unwrap();
    let comparison = outcome.unwrap();
    println!("{}", comparison.describe("one pass", "prefill + decode"));
    assert_eq!(comparison.compared, TOKENS * LAYERS * STAGES);
    assert!(comparison.tokens_checked);
    let first = comparison.first.clone().expect("a row past tolerance");
    assert_eq!(
        (first.place.position, first.layer, first.stage.as_str()),
        (513, 0, "attn_out")
    );
    // Pass 0 is the prefill; decode step k computes position PREFILL + k - 1.
    assert_eq!(first.passes, (0, 513 - PREFILL + 1));
    assert!(first.error > 10.0 * comparison.rtol, "{}", first.error);
}

/// A pass of several tokens after position 0 builds its mask from an f32 block for the cached
/// keys and a u32 block for its own, and candle cannot concatenate them: every chunk after the
/// first stops there, before its first layer. The first chunk matches the one pass.
#[test]
fn a_chunk_after_the_first_stops_with_candles_error_and_the_first_matches_one_pass() {
    let guard = model();
    let ids = guard.license_tokens(TOKENS).unwrap();
    let model = RefCell::new(guard);
    let (one_pass, chunked, outcome) = Consistency::new("chunks of 128 = one pass").compare(
        || model.borrow_mut().run_split(&ids, TOKENS, TOKENS),
        || model.borrow_mut().run_split(&ids, CHUNK, CHUNK),
    );
    one_pass.unwrap();
    let error = chunked.unwrap_err().to_string();
    assert!(
        error.contains("dtype mismatch in cat, lhs: F32, rhs: U32"),
        "{error}"
    );
    let comparison = outcome.unwrap();
    println!("{}", comparison.describe("one pass", "chunks"));
    // No row past tolerance; the positions the failed chunks never reached fail the check.
    assert!(comparison.first.is_none() && comparison.token_mismatches.is_empty());
    assert!(comparison.diverged());
    assert_eq!(comparison.compared, CHUNK * LAYERS * STAGES);
    assert_eq!(comparison.unpaired, (TOKENS - CHUNK) * LAYERS * STAGES);
}

/// Prompts of 520 tokens, past the window, in one batch: every layer's rows match each prompt
/// alone, and then the pass stops in the final norm, which takes the batch's last column as a
/// strided view that candle's RMS norm refuses (one prompt alone is contiguous).
#[test]
fn a_batch_prefill_past_the_window_matches_each_prompt_alone_then_stops_in_the_final_norm() {
    let guard = model();
    let batch = guard.license_batch(PROMPTS, 520, 0).unwrap();
    let model = RefCell::new(guard);
    let (alone, together, outcome) = Consistency::new("a batch of 3 prompts = each alone")
        .compare_batch(
            (0..PROMPTS).map(|row| {
                let (model, batch) = (&model, &batch);
                move || model.borrow_mut().run_alone(batch, row)
            }),
            || model.borrow_mut().run_batch(&batch),
        );
    for run in alone {
        run.unwrap();
    }
    let error = together.unwrap_err().to_string();
    assert!(error.contains("input has to be contiguous"), "{error}");
    let comparison = outcome.unwrap();
    println!("{}", comparison.describe("each alone", "the batch"));
    assert!(!comparison.diverged());
    assert_eq!(comparison.compared, PROMPTS * 520 * LAYERS * STAGES);
}

/// Decode steps of three sequences in one batch (one-token prompts, so that no batch pass has
/// more than one column and none reaches the final norm's error) match each sequence alone.
#[test]
fn batched_decode_steps_match_each_sequence_alone() {
    let guard = model();
    let batch = guard.license_batch(PROMPTS, 1, 16).unwrap();
    let model = RefCell::new(guard);
    let agreement = Consistency::new("3 sequences decoded together = each alone").check_batch(
        (0..PROMPTS).map(|row| {
            let (model, batch) = (&model, &batch);
            move || model.borrow_mut().run_alone(batch, row).unwrap()
        }),
        || model.borrow_mut().run_batch(&batch).unwrap(),
    );
    let comparison = agreement.comparison;
    println!("{}", comparison.describe("each alone", "the batch"));
    assert_eq!(comparison.compared, PROMPTS * 17 * LAYERS * STAGES);
    assert!(comparison.tokens_checked);
}

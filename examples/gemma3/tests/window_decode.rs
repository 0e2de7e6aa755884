//! `window-decode-one-short` past the sliding window: a decode step at position 510 still sees
//! its 511 keys, the step at 511 loses key 0 (its window of 512 trimmed to 511), and a one-pass
//! prefill over the same positions is unchanged. Real English text (the repository's
//! LICENSE-APACHE), 512 positions.
//!
//! A test file of its own: the bug is injected for the whole process.

mod common;

use common::{license_ids, model, relative_error};
use gemma3::passes::{run_passes, Split};

#[test]
fn the_decode_window_one_short_shows_from_position_511_on() {
    let mut guard = model();
    let (model, tokenizer) = &mut *guard;
    let ids = license_ids(tokenizer, 512);
    // Passes: the prefill of positions 0..510, then the steps at 510 and 511.
    let clean = run_passes(model, &ids, Split::DecodeFrom(510)).unwrap();
    gemma3::bugs::inject_list("window-decode-one-short").unwrap();
    let buggy = run_passes(model, &ids, Split::DecodeFrom(510)).unwrap();
    gemma3::bugs::inject_list("").unwrap();
    let errors: Vec<f32> = clean
        .iter()
        .zip(&buggy)
        .map(|(c, b)| relative_error(b, c))
        .collect();
    eprintln!("prefill, step at 510, step at 511: {errors:?}");
    assert_eq!(errors[..2], [0.0, 0.0], "unchanged before position 511");
    assert!(errors[2] > 0.0, "the step at 511 must change");
}

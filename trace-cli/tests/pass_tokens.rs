//! `diff` warns of a pass that consumed other token ids in the other trace (or the floor) than
//! in the reference, as their `pass_begin` events say: the tensors are compared all the same,
//! but a divergence there may be the input's, not the implementation's. Where a trace does not
//! say which ids it consumed, nothing is said.

mod common;

use std::path::Path;

use model_trace::{trace_layer, trace_model};

use common::{run, scratch, text, write_run};

#[trace_layer(index = index)]
fn block(x: &[f32], index: usize) -> Vec<f32> {
    x.iter()
        .map(|v| (v * 0.9 + index as f32 * 0.1).tanh())
        .collect()
}

/// The same tensors whatever the ids: the traces differ only in the tokens they say.
fn layers(position: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..32)
        .map(|i| ((i + position) as f32 * 0.37).sin())
        .collect();
    for layer in 0..2 {
        x = block(&x, layer);
    }
    x
}

#[trace_model(position = position, tokens = ids)]
fn forward(ids: &[u32], position: usize) -> Vec<f32> {
    layers(position)
}

#[trace_model(position = position)]
fn untokenized(position: usize) -> Vec<f32> {
    layers(position)
}

/// `passes` passes into `dir/name`, pass `p` given the ids `tokens(p)` (none where `None`).
fn write(
    dir: &Path,
    name: &str,
    passes: usize,
    tokens: impl Fn(usize) -> Option<Vec<u32>>,
) -> String {
    let path = dir.join(name);
    write_run(&path, false, None, || {
        for pass in 0..passes {
            match tokens(pass) {
                Some(ids) => forward(&ids, pass),
                None => untokenized(pass),
            };
        }
    });
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The prompt in pass 0, then one generated token a pass.
fn prompt_then_one(pass: usize) -> Option<Vec<u32>> {
    Some(if pass == 0 {
        vec![1, 504, 3575, 282, 4649, 314]
    } else {
        vec![7042 + pass as u32]
    })
}

/// `diff --json`'s exit code and warnings.
fn diff_warnings(args: &[&str]) -> (Option<i32>, Vec<String>) {
    let output = run(args);
    let value: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON on stdout ({e}): {}", text(&output)));
    let warnings = value["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .map(|w| w.as_str().expect("a warning is a string").to_owned())
        .collect();
    (output.status.code(), warnings)
}

fn about_tokens(warnings: &[String]) -> Vec<&str> {
    (warnings.iter())
        .map(String::as_str)
        .filter(|w| w.contains("consumed other tokens"))
        .collect()
}

#[test]
fn the_same_tokens_are_no_warning() {
    let dir = scratch("tokens-same");
    let reference = write(&dir, "reference.ndjson", 3, prompt_then_one);
    let other = write(&dir, "other.ndjson", 3, prompt_then_one);
    let (code, warnings) = diff_warnings(&["diff", "--json", &reference, &other]);
    assert_eq!(code, Some(0));
    assert_eq!(warnings, Vec::<String>::new());
}

#[test]
fn other_tokens_in_a_pass_are_a_warning_naming_it() {
    let dir = scratch("tokens-other");
    let reference = write(&dir, "reference.ndjson", 3, prompt_then_one);
    let other = write(&dir, "other.ndjson", 3, |pass| {
        if pass == 2 {
            Some(vec![30])
        } else {
            prompt_then_one(pass)
        }
    });
    let expected =
        format!("pass 2 consumed other tokens in {reference} ([7044]) than in {other} ([30])");
    // The tensors are the same: the comparison's verdict stands, with the warning beside it.
    let (code, warnings) = diff_warnings(&["diff", "--json", &reference, &other]);
    assert_eq!(code, Some(0));
    assert_eq!(warnings, std::slice::from_ref(&expected));
    let output = run(&["diff", &reference, &other]);
    assert_eq!(output.status.code(), Some(0));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains(&format!("warning: {expected}\n")),
        "{printed}"
    );
}

#[test]
fn tokens_on_one_side_only_are_no_warning() {
    let dir = scratch("tokens-one-side");
    let tokenized = write(&dir, "tokenized.ndjson", 3, prompt_then_one);
    let untokenized = write(&dir, "untokenized.ndjson", 3, |_| None);
    // Some passes with ids, others without.
    let mixed = write(&dir, "mixed.ndjson", 3, |pass| {
        (pass != 1).then(|| prompt_then_one(pass)).flatten()
    });
    for (reference, other) in [
        (&tokenized, &untokenized),
        (&untokenized, &tokenized),
        (&tokenized, &mixed),
    ] {
        let (code, warnings) = diff_warnings(&["diff", "--json", reference, other]);
        assert_eq!(code, Some(0));
        assert_eq!(
            warnings,
            Vec::<String>::new(),
            "{reference} against {other}"
        );
    }
}

#[test]
fn long_lists_are_cut_short_and_say_where_they_differ() {
    let dir = scratch("tokens-long");
    let ids: Vec<u32> = (100..112).collect();
    let reference = write(&dir, "reference.ndjson", 1, |_| Some(ids.clone()));
    let mut changed = ids.clone();
    changed[10] = 7;
    changed.pop();
    let other = write(&dir, "other.ndjson", 1, |_| Some(changed.clone()));
    let (_, warnings) = diff_warnings(&["diff", "--json", &reference, &other]);
    assert_eq!(
        warnings,
        [format!(
            "pass 0 consumed other tokens in {reference} \
             ([100, 101, 102, 103, 104, 105, 106, 107, …] (12 ids)) than in {other} \
             ([100, 101, 102, 103, 104, 105, 106, 107, …] (11 ids)), differing first at index 10"
        )]
    );
}

#[test]
fn past_three_passes_the_others_are_counted_in_one_warning() {
    let dir = scratch("tokens-many");
    let reference = write(&dir, "reference.ndjson", 7, prompt_then_one);
    let other = write(&dir, "other.ndjson", 7, |pass| Some(vec![pass as u32]));
    let (code, warnings) = diff_warnings(&["diff", "--json", &reference, &other]);
    assert_eq!(code, Some(0));
    let warnings = about_tokens(&warnings);
    assert_eq!(warnings.len(), 4, "{warnings:#?}");
    for (pass, warning) in warnings[..3].iter().enumerate() {
        assert!(
            warning.starts_with(&format!(
                "pass {pass} consumed other tokens in {reference} ("
            )),
            "{warning}"
        );
    }
    assert_eq!(
        warnings[3],
        format!(
            "4 more passes consumed other tokens in {reference} than in {other}, the first of \
             them pass 3"
        )
    );
}

#[test]
fn the_floor_is_held_to_the_references_tokens_too() {
    let dir = scratch("tokens-floor");
    let reference = write(&dir, "reference.ndjson", 2, prompt_then_one);
    let other = write(&dir, "other.ndjson", 2, prompt_then_one);
    let floor = write(&dir, "floor.ndjson", 2, |pass| {
        if pass == 1 {
            Some(vec![30, 31])
        } else {
            prompt_then_one(pass)
        }
    });
    let (code, warnings) =
        diff_warnings(&["diff", "--json", "--floor", &floor, &reference, &other]);
    assert_eq!(code, Some(0));
    assert_eq!(
        about_tokens(&warnings),
        [format!(
            "pass 1 consumed other tokens in {reference} ([7043]) than in {floor} ([30, 31])"
        )]
    );
    let untokenized_floor = write(&dir, "untokenized-floor.ndjson", 2, |_| None);
    let (_, warnings) = diff_warnings(&[
        "diff",
        "--json",
        "--floor",
        &untokenized_floor,
        &reference,
        &other,
    ]);
    assert_eq!(about_tokens(&warnings), Vec::<&str>::new());
}

//! What a golden check adds to a test: the README's SmolLM2 run (4 greedy tokens of "The capital
//! of France is"), alone and inside `model_trace::golden` checking it against its golden trace
//! (blessed here first, in a temporary directory). The target is at most 10% more. Run it in
//! the profile the tests use (`cargo bench -p smollm --features trace --bench golden_check
//! --profile dev`) and in release (without `--profile`).

use criterion::{criterion_group, criterion_main, Criterion};
use model_trace::golden::Golden;
use smollm::generate::{greedy, load};

const PROMPT: &str = "The capital of France is";

fn golden_check(c: &mut Criterion) {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    let (mut model, tokenizer) =
        load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
    let dir = std::env::temp_dir().join(format!("smollm-golden-bench-{}", std::process::id()));
    let golden = dir.join("smollm-paris.ndjson");
    let (_, blessed) = Golden::new(&golden)
        .bless(true)
        .compare(|| greedy(&mut model, &tokenizer, PROMPT, 4));
    blessed.unwrap_or_else(|e| panic!("{e}"));
    let mut group = c.benchmark_group("smollm_4_tokens");
    group.sample_size(10);
    group.bench_function("run", |b| {
        b.iter(|| greedy(&mut model, &tokenizer, PROMPT, 4).unwrap());
    });
    group.bench_function("run_in_golden_check", |b| {
        b.iter(|| {
            let check = Golden::new(&golden).bless(false).in_ci(false);
            let (generation, outcome) = check.compare(|| greedy(&mut model, &tokenizer, PROMPT, 4));
            outcome.unwrap_or_else(|e| panic!("{e}"));
            generation.unwrap()
        });
    });
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, golden_check);
criterion_main!(benches);

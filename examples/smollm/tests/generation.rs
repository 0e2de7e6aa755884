//! End-to-end checks on the real SmolLM2 weights. Missing weights fail the test (never skip): run
//! `scripts/fetch-models` first.

use candle_core::{Device, Tensor};
use smollm::generate::{greedy, load};
use smollm::model::argmax;
use smollm::{Columns, GgufTokenizer, Model};

const PROMPT: &str = "The capital of France is";

fn model() -> (Model, GgufTokenizer) {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tokenizer_from_gguf_encodes_and_round_trips() {
    let (_, tokenizer) = model();
    let ids = tokenizer.encode(PROMPT).unwrap();
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| tokenizer.tokenizer.id_to_token(id).unwrap())
        .collect();
    assert_eq!(pieces, ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]);
    assert_eq!(tokenizer.decode(&ids).unwrap(), PROMPT);

    // The "smollm" pre-tokenizer splits digits one by one (and so off the space before them).
    let year: Vec<String> = tokenizer
        .encode("in 2024")
        .unwrap()
        .iter()
        .map(|&id| tokenizer.tokenizer.id_to_token(id).unwrap())
        .collect();
    assert_eq!(year, ["in", "Ġ", "2", "0", "2", "4"]);
    // Control tokens are single ids, and decode drops them.
    let chat = tokenizer.encode("<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!(chat.first(), Some(&1));
    assert_eq!(chat.last(), Some(&2));
    assert_eq!(tokenizer.decode(&chat).unwrap(), "user\nHi");
    assert_eq!((tokenizer.bos_id, tokenizer.eos_id), (1, 2));

    let text = "Rust's borrow checker, naïvely: 3.14 × r² — ok?";
    assert_eq!(
        tokenizer.decode(&tokenizer.encode(text).unwrap()).unwrap(),
        text
    );
}

#[test]
fn greedy_continuation_says_paris() {
    let (mut model, tokenizer) = model();
    let generation = greedy(&mut model, &tokenizer, PROMPT, 8).unwrap();
    assert!(
        generation.text.contains("Paris"),
        "continuation: {:?}",
        generation.text
    );
}

#[test]
fn kv_cache_decoding_matches_full_recompute() {
    let (mut model, tokenizer) = model();
    let mut tokens = tokenizer.encode(PROMPT).unwrap();
    let mut cached = vec![model.forward(&tokens, 0).unwrap()];
    for _ in 0..4 {
        let next = argmax(cached.last().unwrap()).unwrap();
        tokens.push(next);
        let position = tokens.len() - 1;
        cached.push(model.forward(&[next], position).unwrap());
        assert_eq!(model.cached_len(), tokens.len());
    }
    let prompt_len = tokens.len() - 4;
    for (step, cached_logits) in cached.iter().enumerate() {
        let full = model.forward(&tokens[..prompt_len + step], 0).unwrap();
        let diff = max_abs_diff(cached_logits, &full);
        assert!(diff < 1e-4, "step {step}: max |Δlogit| = {diff}");
    }
}

#[test]
fn kv_cache_reports_growth() {
    let (mut model, tokenizer) = model();
    let tokens = tokenizer.encode(PROMPT).unwrap();
    model.forward(&tokens, 0).unwrap();
    let cache = &model.caches()[0];
    assert_eq!(cache.len(), tokens.len());
    assert!(cache.capacity() >= cache.len());
    let config = model.config();
    // keys + values, f32, the whole capacity
    assert_eq!(
        cache.bytes(),
        2 * cache.capacity() * config.num_kv_heads * config.head_dim * 4
    );
    assert!(
        model.forward(&[42], 3).is_err(),
        "position must match the cache"
    );
}

#[test]
fn attention_probs_are_causal_distributions() {
    let (model, _) = model();
    let config = model.config().clone();
    let attention = model.blocks()[0].attention();
    let device = Device::Cpu;
    let (q_len, position) = (3, 2);
    let q = Tensor::randn(
        0f32,
        1.0,
        (1, config.num_heads, q_len, config.head_dim),
        &device,
    )
    .unwrap();
    let k = Tensor::randn(
        0f32,
        1.0,
        (1, config.num_kv_heads, position + q_len, config.head_dim),
        &device,
    )
    .unwrap();
    let probs = attention
        .attention_probs(&q, &k, Columns::unpadded(position))
        .unwrap();
    assert_eq!(probs.dims(), [1, config.num_heads, q_len, position + q_len]);
    let rows = probs.squeeze(0).unwrap().to_vec3::<f32>().unwrap();
    for head in &rows {
        for (i, row) in head.iter().enumerate() {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert!(row[position + i + 1..].iter().all(|&p| p == 0.0));
        }
    }
}

#[test]
fn quantized_matmuls_agree_with_their_f32_reference() {
    let (model, _) = model();
    let linears = model.quant_linears();
    assert_eq!(linears.len(), 30 * 7 + 1);
    for linear in [linears[0], linears[6], *linears.last().unwrap()] {
        let (_, inputs) = linear.dims().unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 2, inputs), &Device::Cpu).unwrap();
        let quantized = linear.forward(&x).unwrap();
        let reference = linear.forward_f32(&x).unwrap();
        assert_eq!(quantized.dims(), reference.dims());
        // The kernel also quantizes the activations (to Q8), so the two differ a little.
        let q = quantized.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let r = reference.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let dot: f32 = q.iter().zip(&r).map(|(a, b)| a * b).sum();
        let norms = q.iter().map(|a| a * a).sum::<f32>().sqrt()
            * r.iter().map(|b| b * b).sum::<f32>().sqrt();
        let cosine = dot / norms;
        assert!(cosine > 0.999, "{}: cosine {cosine}", linear.name());
    }
}

#[test]
fn logit_lens_ends_at_the_model_prediction() {
    let (mut model, tokenizer) = model();
    model.logit_lens = true;
    let tokens = tokenizer.encode(PROMPT).unwrap();
    let logits = model.forward(&tokens, 0).unwrap();
    let lens = model.lens_logits().unwrap();
    assert_eq!(lens.len(), model.config().num_layers);
    let last = lens.last().unwrap();
    assert_eq!(max_abs_diff(last, &logits), 0.0);
}

/// candle-transformers' own quantized llama on the same file: an independent implementation.
#[test]
fn logits_match_candle_transformers_quantized_llama() {
    use candle_transformers::models::quantized_llama::ModelWeights;
    let (mut model, tokenizer) = model();
    let tokens = tokenizer.encode(PROMPT).unwrap();
    let ours = model.forward(&tokens, 0).unwrap();

    let path = smollm::weights::find_gguf().unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let mut theirs_model = ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    let input = Tensor::new(tokens.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let theirs = theirs_model.forward(&input, 0).unwrap().squeeze(0).unwrap();
    let diff = max_abs_diff(&ours, &theirs);
    assert!(diff < 1e-3, "max |Δlogit| = {diff}");
    assert_eq!(argmax(&ours).unwrap(), argmax(&theirs).unwrap());
}

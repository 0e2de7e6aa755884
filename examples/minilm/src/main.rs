//! `minilm "some sentence"`: the token ids, the start of the sentence embedding, and for every
//! layer and head which token each token attends to most.

use std::process::ExitCode;

use candle_core::{Device, Tensor};
use minilm::tokenizer::{self, Encoded};
use minilm::{weights, Model};

const DEFAULT_SENTENCE: &str = "This is an example sentence";
const SHOWN_DIMS: usize = 8;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "-h" || arg == "--help") {
        println!("usage: minilm [SENTENCE]   (default: {DEFAULT_SENTENCE:?})");
        return Ok(());
    }
    let text = if args.is_empty() {
        DEFAULT_SENTENCE.to_string()
    } else {
        args.join(" ")
    };

    let files = weights::locate_or_fetch()?;
    let device = Device::Cpu;
    let model = Model::load(&files, &device)?;
    let tokenizer = tokenizer::load(&files.tokenizer)?;
    let encoded = tokenizer::encode(&tokenizer, &text)?;
    let (ids, mask) = encoded.to_tensors(&device)?;

    let (hidden, attention) = model.forward_with_attention(&ids, &mask)?;
    let embedding = minilm::model::l2_normalize(&minilm::model::mean_pool(&hidden, &mask)?)?;
    let embedding: Vec<f32> = embedding.squeeze(0)?.to_vec1()?;

    println!("text: {text:?}");
    println!("tokens: {}", encoded.tokens.join(" "));
    println!("ids: {:?}", encoded.ids);
    let shown: Vec<String> = embedding
        .iter()
        .take(SHOWN_DIMS)
        .map(|v| format!("{v:.8}"))
        .collect();
    println!(
        "embedding ({} dims, first {}): [{}]",
        embedding.len(),
        shown.len(),
        shown.join(", ")
    );
    println!("strongest attention (query->key) per layer and head:");
    let labels = token_labels(&encoded);
    for (layer, probs) in attention.iter().enumerate() {
        print_layer(layer, probs, &labels)?;
    }
    Ok(())
}

/// Tokens as they appear in the attention lines; a repeated token gets its position (`the@4`) so
/// that every arrow points at one place.
fn token_labels(encoded: &Encoded) -> Vec<String> {
    let tokens = &encoded.tokens;
    tokens
        .iter()
        .enumerate()
        .map(|(position, token)| {
            if tokens.iter().filter(|other| *other == token).count() > 1 {
                format!("{token}@{position}")
            } else {
                token.clone()
            }
        })
        .collect()
}

/// `probs`: `[1, heads, query, key]`.
fn print_layer(layer: usize, probs: &Tensor, labels: &[String]) -> candle_core::Result<()> {
    let strongest = probs.squeeze(0)?.argmax(candle_core::D::Minus1)?;
    let strongest: Vec<Vec<u32>> = strongest.to_vec2()?;
    for (head, keys) in strongest.iter().enumerate() {
        let arrows: Vec<String> = keys
            .iter()
            .zip(labels)
            .map(|(&key, query)| {
                let key = labels.get(key as usize).map_or("?", String::as_str);
                format!("{query}->{key}")
            })
            .collect();
        println!("L{layer} H{head}: {}", arrows.join(" "));
    }
    Ok(())
}

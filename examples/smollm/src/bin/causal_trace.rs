//! Causal tracing on SmolLM2 (see `smollm::causal`): which layer at which token position
//! carries "Paris" for "The capital of France is".
//!
//! ```text
//! cargo run --release -p smollm --features trace --bin causal_trace -- [--out DIR] [--json]
//!     [--clean PROMPT --corrupted PROMPT --answer TOKEN]
//! model-trace report DIR/patched.ndjson     # the layer × position heatmap
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use smollm::causal::causal_trace;
use smollm::generate::load;

const USAGE: &str = "usage: causal_trace [--out DIR] [--json] [--clean PROMPT] [--corrupted PROMPT] [--answer TOKEN]\n\
    Patches the clean prompt's layer outputs into the corrupted prompt's run one (layer, position) at a\n\
    time and prints the answer's probability for each; the trace files go to DIR (default causal-trace),\n\
    and `model-trace report DIR/patched.ndjson` draws the heatmap. Needs --features trace.";

struct Args {
    out: PathBuf,
    json: bool,
    clean: String,
    corrupted: String,
    answer: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        out: PathBuf::from("causal-trace"),
        json: false,
        clean: "The capital of France is".into(),
        corrupted: "The capital of Italy is".into(),
        answer: " Paris".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--out" => args.out = PathBuf::from(value()?),
            "--json" => args.json = true,
            "--clean" => args.clean = value()?,
            "--corrupted" => args.corrupted = value()?,
            "--answer" => args.answer = value()?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("error: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if !model_trace::ENABLED {
        eprintln!("error: causal tracing patches through model-trace's tracepoints: build with --features trace");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> smollm::Result<()> {
    let path = smollm::weights::locate_or_fetch()?;
    let (mut model, tokenizer) = load(&path)?;
    let found = causal_trace(
        &mut model,
        &tokenizer,
        &args.clean,
        &args.corrupted,
        &args.answer,
        &args.out,
    )?;
    if args.json {
        println!("{}", found.to_json());
        return Ok(());
    }
    println!(
        "P({:?}): clean {:.4}, corrupted {:.4}; {} runs in {:.1} s",
        args.answer,
        found.clean,
        found.corrupted,
        found.runs,
        found.elapsed.as_secs_f64()
    );
    print!("layer");
    for token in &found.tokens {
        print!(
            " {:>9}",
            format!("{token:?}").chars().take(9).collect::<String>()
        );
    }
    println!();
    for (layer, row) in found.patched.iter().enumerate() {
        print!("{layer:>5}");
        for p in row {
            print!(" {p:>9.4}");
        }
        println!();
    }
    let (layer, position, p) = found.strongest();
    println!(
        "strongest: layer {layer} at {:?} (position {position}) restores P to {p:.4}",
        found.tokens[position]
    );
    println!(
        "heatmap: model-trace report {}",
        found.patched_trace.display()
    );
    Ok(())
}

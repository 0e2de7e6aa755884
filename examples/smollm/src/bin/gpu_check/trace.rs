//! `gpu_check trace`: the decode step of `model` traced into a trace file, so that the same
//! model run on two devices can be compared with `model-trace diff`.
//!
//! The weights and the input are drawn from fixed seeds on the host and copied to the device
//! (see `model`), so a trace written with `--device cpu` and one written with `--device cuda`
//! record the same computation: what `diff` finds between them is the devices' rounding (cuBLAS
//! against the CPU's matrix products, the order of the reductions).
//!
//! The session records in full without quantization (there is no quantized weight), with
//! `DigestPolicy::Always`: device tensors get their sketches too, from which `diff` estimates each
//! tensor's relative error; `--capture` saves the tensors it admits in full beside the file, for
//! an element-wise diff.

use model_trace::{DigestPolicy, ModelTracerConfig, Session};

use crate::args::TraceArgs;
use crate::device;
use crate::model::StepModel;
use crate::Failure;

pub fn run(args: &TraceArgs) -> Result<(), Failure> {
    crate::require_tracing("trace")?;
    let opened = device::open(args.device)?;
    let model = StepModel::random(args.layers, args.dtype, &opened.device)?;
    let input = StepModel::input(args.dtype, &opened.device)?;
    let config = ModelTracerConfig {
        trace_quant_error: false,
        digests: DigestPolicy::Always,
        ..ModelTracerConfig::full()
    };
    let mut builder = Session::builder(config)
        .trace_file(&args.out)
        .model("SmolLM2-135M-shaped decode step, random weights (gpu_check)")
        .device(opened.name)
        .dtype(args.dtype.as_str());
    if let Some(capture) = &args.capture {
        builder = builder.capture(capture.clone());
    }
    let session = builder
        .start()
        .map_err(|e| Failure::Setup(format!("the session does not start: {e}")))?;
    for position in 0..args.passes {
        model.step(&input, position)?;
    }
    let (tracer, errors) = session.finish_with_errors();
    if let Some(first) = errors.first() {
        return Err(Failure::Failed(format!(
            "{} kinds of record errors, first: {first}",
            errors.len()
        )));
    }
    println!(
        "gpu_check trace: {} passes of {} blocks on {} ({}) in {}; {} passes with an anomaly",
        args.passes,
        args.layers,
        opened.name,
        args.dtype.as_str(),
        args.out.display(),
        tracer.summary().anomalies_detected,
    );
    Ok(())
}

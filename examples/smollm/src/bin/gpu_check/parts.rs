//! `gpu_check parts`: the host time one traced device tensor costs, split into its parts.
//!
//! A read of a device tensor in a lightweight session costs the host time (the GPU's work is
//! a few microseconds a pass, in one kernel launch): that time is the tracing's overhead on a
//! decode step, whose host already queues the model's kernels as fast as it can. Measured here
//! for one SmolLM2-wide tensor (576 f32 values), as [`reads`](crate::reads) measures it, and
//! each of its parts on its own:
//!
//! * **read**: a pass of 64 reads of distinct device tensors in a lightweight session, over
//!   the same pass untraced, per read;
//! * **session**: the same pass over 1-element CPU tensors, per read: the session's
//!   bookkeeping, which every tensor pays wherever it lives (the layer's frame, the tensor's
//!   plan, its record); the statistics of one value cost next to nothing;
//! * **device pointer**: cudarc's `device_ptr` on the tensor's storage, which the read calls
//!   for the address it puts in its task (on candle's context, which tracks events, it makes
//!   the stream wait for the slice's last write: a driver call), timed over many calls;
//! * **queue**: the rest of a read: read − session − device pointer (the task, the tensor held
//!   until the flush, the batch's bookkeeping);
//! * **pass**: what a pass pays once, whatever it reads: a pass of one layer (two reads) over
//!   the untraced one, less its two reads: the flush, the launch, the readback and its wait;
//! * **digest**: in a session that writes a trace file (only such a session takes digests), a
//!   read with `DigestPolicy::Always` (the values gathered, copied back and summarised with a
//!   digest on the host, on up to four threads) over a read with the default policy (device
//!   tensors: statistics only), per read; and on the host alone, on one thread:
//!   `TensorSummary::of_values` of the 576 values over their statistics alone, and of that the
//!   BLAKE3 fingerprint and the sketch. On the CPU both file sessions digest every tensor.
//!
//! Rounds interleave the passes (their order rotating); each figure is a median over every
//! pass of every round, or for the calls timed alone over the rounds. On the CPU (`--device
//! cpu`) the read is a CPU tensor's and there is no device pointer: useful to check the
//! program, and for the session's and the digest's parts.

use std::hint::black_box;
use std::time::Instant;

use candle_core::{Device, Tensor};
use model_trace::{
    DigestPolicy, Fingerprint, ModelTracerConfig, Sketch, TensorStats, TensorSummary,
};
use serde_json::json;

use crate::args::PartsArgs;
use crate::device;
use crate::reads::{block, distinct_copies, random_tensor};
use crate::{median, write_json, Failure};

/// Elements of the tensor read: SmolLM2-135M's hidden size.
const SIZE: usize = 576;

/// Reads a long pass holds (32 layers).
const READS: usize = 64;

/// Calls timed together in one measurement of a host-only part.
const CALLS: usize = 2_000;

/// The passes measured, each a session (or none) over some tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// 64 device tensors, no session.
    Untraced,
    /// The same, lightweight.
    Read,
    /// The same, lightweight, writing a trace file (device tensors: statistics only).
    FileRead,
    /// The same with `DigestPolicy::Always`.
    FileDigest,
    /// 2 device tensors (one layer), no session.
    ShortUntraced,
    /// The same, lightweight.
    ShortRead,
    /// 64 one-element CPU tensors, no session.
    CpuUntraced,
    /// The same, lightweight.
    CpuRead,
}

impl Pass {
    const ALL: [Self; 8] = [
        Self::Untraced,
        Self::Read,
        Self::FileRead,
        Self::FileDigest,
        Self::ShortUntraced,
        Self::ShortRead,
        Self::CpuUntraced,
        Self::CpuRead,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Untraced => "untraced",
            Self::Read => "read",
            Self::FileRead => "read, trace file",
            Self::FileDigest => "read with digest, trace file",
            Self::ShortUntraced => "one layer, untraced",
            Self::ShortRead => "one layer, read",
            Self::CpuUntraced => "cpu 1 element, untraced",
            Self::CpuRead => "cpu 1 element, read",
        }
    }

    fn session(self) -> Option<ModelTracerConfig> {
        let lightweight = ModelTracerConfig {
            device_copy_below: 0,
            ..ModelTracerConfig::lightweight()
        };
        match self {
            Self::Untraced | Self::ShortUntraced | Self::CpuUntraced => None,
            Self::Read | Self::ShortRead | Self::CpuRead | Self::FileRead => Some(lightweight),
            Self::FileDigest => Some(ModelTracerConfig {
                digests: DigestPolicy::Always,
                ..lightweight
            }),
        }
    }

    fn writes_file(self) -> bool {
        matches!(self, Self::FileRead | Self::FileDigest)
    }
}

/// The tensors each kind of pass reads.
struct Tensors {
    device: Vec<Tensor>,
    cpu: Vec<Tensor>,
}

impl Tensors {
    fn of(&self, pass: Pass) -> &[Tensor] {
        match pass {
            Pass::Untraced | Pass::Read | Pass::FileRead | Pass::FileDigest => &self.device,
            Pass::ShortUntraced | Pass::ShortRead => &self.device[..2],
            Pass::CpuUntraced | Pass::CpuRead => &self.cpu,
        }
    }
}

/// What was measured: pass times (ms) by pass, and ns a call of the host-only parts.
#[derive(Default)]
struct Measured {
    passes: [Vec<f64>; Pass::ALL.len()],
    device_pointer_ns: Vec<f64>,
    summary_stats_ns: Vec<f64>,
    summary_digest_ns: Vec<f64>,
    fingerprint_ns: Vec<f64>,
    sketch_ns: Vec<f64>,
}

/// The parts, in µs a read (the pass's fixed cost: µs a pass).
#[derive(Debug, Clone, Copy)]
struct Parts {
    untraced_pass_ms: f64,
    read: f64,
    session: f64,
    device_pointer: Option<f64>,
    queue: f64,
    pass: f64,
    digest_in_pass: f64,
    digest_host: f64,
    fingerprint: f64,
    sketch: f64,
}

impl Measured {
    fn pass_ms(&self, pass: Pass) -> f64 {
        median(&self.passes[pass as usize])
    }

    fn parts(&self) -> Parts {
        let per_read = |traced: Pass, untraced: Pass, reads: usize| {
            (self.pass_ms(traced) - self.pass_ms(untraced)) * 1e3 / reads as f64
        };
        let read = per_read(Pass::Read, Pass::Untraced, READS);
        let session = per_read(Pass::CpuRead, Pass::CpuUntraced, READS);
        let device_pointer =
            (!self.device_pointer_ns.is_empty()).then(|| median(&self.device_pointer_ns) / 1e3);
        let summary_stats = median(&self.summary_stats_ns);
        Parts {
            untraced_pass_ms: self.pass_ms(Pass::Untraced),
            read,
            session,
            device_pointer,
            queue: read - session - device_pointer.unwrap_or(0.0),
            pass: per_read(Pass::ShortRead, Pass::ShortUntraced, 1) - 2.0 * read,
            digest_in_pass: per_read(Pass::FileDigest, Pass::FileRead, READS),
            digest_host: (median(&self.summary_digest_ns) - summary_stats) / 1e3,
            fingerprint: median(&self.fingerprint_ns) / 1e3,
            sketch: median(&self.sketch_ns) / 1e3,
        }
    }
}

pub fn run(args: &PartsArgs) -> Result<(), Failure> {
    if !model_trace::ENABLED {
        return Err(Failure::Setup(
            "built without `--features trace`: sessions record nothing, so there is nothing to \
             split; build with `--features trace` (and `cuda` for the GPU)"
                .into(),
        ));
    }
    let opened = device::open(args.device)?;
    eprintln!(
        "gpu_check parts: {}, {SIZE} f32 values, {} rounds of {} passes",
        opened.name, args.rounds, args.passes
    );
    let values = random_tensor(SIZE, &opened.device)?;
    let tensors = Tensors {
        device: distinct_copies(&values, READS)?,
        cpu: distinct_copies(&random_tensor(1, &Device::Cpu)?, READS)?,
    };
    let host_values: Vec<f32> = values.to_vec1()?;
    // A file of its own for each session: a session given the path of an earlier session's
    // file writes beside it under another name.
    let blocks = std::cell::Cell::new(0usize);
    let run = |pass: Pass, passes: usize| {
        blocks.set(blocks.get() + 1);
        let file = std::env::temp_dir().join(format!(
            "gpu_check-parts-{}-{}.ndjson",
            std::process::id(),
            blocks.get()
        ));
        let file = pass.writes_file().then_some(file.as_path());
        block(
            pass.session(),
            file,
            pass.label(),
            tensors.of(pass),
            passes,
            &opened.device,
        )
    };
    let mut measured = Measured::default();
    // Untimed: the first passes load the kernel and allocate the batch's buffers.
    for pass in Pass::ALL {
        run(pass, 2)?;
    }
    for round in 0..args.rounds {
        for turn in 0..Pass::ALL.len() {
            let pass = Pass::ALL[(round + turn) % Pass::ALL.len()];
            measured.passes[pass as usize].extend(run(pass, args.passes)?);
        }
        if let Some(ns) = device_pointer_ns(&values) {
            measured.device_pointer_ns.push(ns);
        }
        measured.summary_stats_ns.push(ns_a_call(|| {
            TensorSummary::from_stats(vec![SIZE], "f32", TensorStats::from_slice(&host_values))
        }));
        measured.summary_digest_ns.push(ns_a_call(|| {
            TensorSummary::of_values(vec![SIZE], "f32", &host_values)
        }));
        measured
            .fingerprint_ns
            .push(ns_a_call(|| Fingerprint::of(&host_values)));
        measured
            .sketch_ns
            .push(ns_a_call(|| Sketch::of(&host_values)));
    }
    let parts = measured.parts();
    print_table(&parts, args, opened.name);
    if let Some(path) = &args.json {
        write_json(path, &to_json(&parts, &measured, args, opened.name))?;
    }
    Ok(())
}

/// ns a call of `work`, over [`CALLS`] calls.
fn ns_a_call<T>(mut work: impl FnMut() -> T) -> f64 {
    let start = Instant::now();
    for _ in 0..CALLS {
        black_box(work());
    }
    start.elapsed().as_secs_f64() * 1e9 / CALLS as f64
}

/// ns a call of cudarc's `device_ptr` on `tensor`'s storage, as the read calls it (the event
/// it would record on drop forgotten, as the read forgets it); `None` off CUDA.
#[cfg(feature = "cuda")]
fn device_pointer_ns(tensor: &Tensor) -> Option<f64> {
    use candle_core::cuda::cudarc::driver::DevicePtr;
    use candle_core::cuda::CudaStorageSlice;
    use candle_core::Storage;

    let (storage, _) = tensor.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return None;
    };
    let CudaStorageSlice::F32(slice) = &cuda.slice else {
        return None;
    };
    let stream = cuda.device.cuda_stream();
    Some(ns_a_call(|| {
        let (address, record) = black_box(slice).device_ptr(&stream);
        std::mem::forget(record);
        address
    }))
}

#[cfg(not(feature = "cuda"))]
fn device_pointer_ns(_tensor: &Tensor) -> Option<f64> {
    None
}

fn print_table(parts: &Parts, args: &PartsArgs, device: &str) {
    let pointer = parts
        .device_pointer
        .map_or_else(|| "n/a".to_owned(), |us| format!("{us:.3}"));
    println!(
        "\n| part | µs |\n|---|---:|\n\
         | a read (576 f32, lightweight, in a pass of {READS}) | {:.3} |\n\
         | · session bookkeeping (a 1-element CPU tensor's read) | {:.3} |\n\
         | · device pointer (cudarc `device_ptr`) | {pointer} |\n\
         | · queue (the rest: task, held tensor, batch) | {:.3} |\n\
         | a pass, once (flush, launch, readback, wait) | {:.1} |\n\
         | a digest, in a pass (trace file: Always over the default policy) | {:.3} |\n\
         | · host work of a digest, one thread (of_values − statistics) | {:.3} |\n\
         | · · BLAKE3 fingerprint | {:.3} |\n\
         | · · sketch | {:.3} |",
        parts.read,
        parts.session,
        parts.queue,
        parts.pass,
        parts.digest_in_pass,
        parts.digest_host,
        parts.fingerprint,
        parts.sketch,
    );
    println!(
        "\n{device}; medians of {} rounds × {} passes (untraced pass of {READS} reads: {:.3} ms); \
         host-only parts: medians over the rounds of {CALLS} calls each.",
        args.rounds, args.passes, parts.untraced_pass_ms
    );
}

fn to_json(
    parts: &Parts,
    measured: &Measured,
    args: &PartsArgs,
    device: &str,
) -> serde_json::Value {
    let passes: serde_json::Map<String, serde_json::Value> = Pass::ALL
        .iter()
        .map(|&pass| (pass.label().to_owned(), json!(measured.pass_ms(pass))))
        .collect();
    json!({
        "command": "parts",
        "device": device,
        "dtype": "f32",
        "elements": SIZE,
        "reads_per_pass": READS,
        "rounds": args.rounds,
        "passes": args.passes,
        "us": {
            "read": parts.read,
            "session": parts.session,
            "device_pointer": parts.device_pointer,
            "queue": parts.queue,
            "pass": parts.pass,
            "digest_in_pass": parts.digest_in_pass,
            "digest_host": parts.digest_host,
            "fingerprint": parts.fingerprint,
            "sketch": parts.sketch,
        },
        "pass_ms": passes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_add_up_to_the_read() {
        let mut measured = Measured::default();
        let ms = |pass: Pass| match pass {
            Pass::Untraced => 1.0,
            Pass::Read => 1.128,
            Pass::FileRead => 1.200,
            Pass::FileDigest => 1.392,
            Pass::ShortUntraced => 0.5,
            Pass::ShortRead => 0.534,
            Pass::CpuUntraced => 0.01,
            Pass::CpuRead => 0.074,
        };
        for pass in Pass::ALL {
            measured.passes[pass as usize] = vec![ms(pass)];
        }
        measured.device_pointer_ns = vec![400.0, 500.0, 450.0];
        measured.summary_stats_ns = vec![300.0];
        measured.summary_digest_ns = vec![2700.0];
        measured.fingerprint_ns = vec![1500.0];
        measured.sketch_ns = vec![600.0];
        let parts = measured.parts();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(parts.read, 2.0), "{parts:?}");
        assert!(close(parts.session, 1.0), "{parts:?}");
        assert_eq!(parts.device_pointer, Some(0.45));
        assert!(close(parts.queue, 0.55), "{parts:?}");
        assert!(close(parts.pass, 30.0), "{parts:?}");
        assert!(close(parts.digest_in_pass, 3.0), "{parts:?}");
        assert!(close(parts.digest_host, 2.4), "{parts:?}");
    }
}

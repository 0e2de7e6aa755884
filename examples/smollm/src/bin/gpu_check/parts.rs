//! `gpu_check parts`: the host time one traced device tensor costs, split into its parts.
//!
//! A read of a device tensor in a lightweight session costs the host time (the GPU's work is
//! a few microseconds a pass, in one kernel launch): that time is the tracing's overhead on a
//! decode step, whose host already queues the model's kernels as fast as it can. Measured here
//! for one SmolLM2-wide tensor (576 f32 values), and each of its parts on its own:
//!
//! * **read**: what one more read adds to a pass, in a lightweight session. Passes of 64
//!   and of 2 reads (each of a tensor of its own) are timed against the same passes untraced;
//!   a pass's excess is `reads · read + pass`, so the two lengths give both unknowns;
//! * **pass**: what a pass pays once, whatever it reads; of that, the session's own part (the
//!   pass's begin and end, the anomaly rules) is measured by the next item's passes, and the
//!   rest is the device's: the flush, the launch, the readback and its wait;
//! * **session**: the same two pass lengths over tensors whose summaries are finished at the
//!   pass's end, as a device read's are, but which need no device (a closure returns a
//!   summary computed beforehand): the session's bookkeeping of a device read, from the
//!   annotation to the layer record delivered after the pass;
//! * **device pointer**: cudarc's `device_ptr` on the tensor's storage, which the read calls
//!   for the address it puts in its task (on candle's context, which tracks events, it makes
//!   the stream wait for the slice's last write: a driver call), timed over many calls;
//! * **queue**: the rest of a read: read − session − device pointer (the storage's lookup, the
//!   layout, the task, the tensor held until the flush, the statistics decoded from the slot);
//! * **digest**: in a session that writes a trace file (only such a session takes digests), a
//!   read with `DigestPolicy::Always` (the values gathered, copied back and summarised with a
//!   digest on the host, on up to four threads) over a read with the default policy (device
//!   tensors: statistics only), per read of a pass of 64; and on the host alone, on one
//!   thread: `TensorSummary::of_values` of the 576 values over their statistics alone, and of
//!   that the BLAKE3 fingerprint and the sketch. On the CPU both file sessions digest every
//!   tensor.
//!
//! Rounds interleave the passes (their order rotating); each pass figure is a median over every
//! pass of every round, and each call timed alone a median over the rounds. On the CPU
//! (`--device cpu`) the read is a CPU tensor's, read when it is traced, and there is no device
//! pointer: useful to check the program, and for the session's and the digest's parts.

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

use candle_core::Tensor;
use model_trace::{
    trace_layer, trace_model, DigestPolicy, Fingerprint, ModelTracerConfig, PendingSummary, Sketch,
    SummaryRequest, TensorError, TensorStats, TensorSummary, TraceTensor,
};
use serde_json::json;

use crate::args::PartsArgs;
use crate::device;
use crate::reads::{block, distinct_copies, random_tensor, CANDLE_PASS};
use crate::{median, write_json, Failure, TempDir};

/// Elements of the tensor read: SmolLM2-135M's hidden size.
const SIZE: usize = 576;

/// Reads a long pass holds (32 layers), and a short one (one layer).
const LONG: usize = 64;
const SHORT: usize = 2;

/// Calls timed together in one measurement of a host-only part.
const CALLS: usize = 2_000;

/// A value whose summary is finished at the end of the pass, as a device read's is, from
/// statistics computed beforehand: the session's bookkeeping of a device read, without one.
#[derive(Debug, Clone, Copy)]
struct LaterTensor {
    value: f32,
    stats: TensorStats,
}

impl LaterTensor {
    fn new(value: f32) -> Self {
        Self {
            value,
            stats: TensorStats::from_slice(&[value]),
        }
    }
}

impl TraceTensor for LaterTensor {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Borrowed(&[1])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        Ok(Cow::Owned(vec![self.value]))
    }

    fn on_host(&self) -> bool {
        false
    }

    fn start_summary(
        &self,
        _request: &SummaryRequest,
    ) -> Option<Result<PendingSummary, TensorError>> {
        let stats = self.stats;
        Some(Ok(PendingSummary::new(move || {
            Ok(TensorSummary::from_stats(vec![1], "f32", stats))
        })))
    }
}

/// A pass over `LaterTensor`s, as `reads`' pass is over candle tensors.
#[trace_model(position = position, name = "later")]
fn later_pass(tensors: &[LaterTensor], position: usize) {
    for (index, pair) in tensors.chunks_exact(2).enumerate() {
        let _ = later_layer(&pair[0], &pair[1], index);
    }
}

#[trace_layer(index = index)]
fn later_layer(input: &LaterTensor, output: &LaterTensor, index: usize) -> LaterTensor {
    let _ = (input, index);
    *output
}

/// The passes measured, each a session (or none) over some tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// 64 device tensors, no session.
    Untraced,
    /// The same, lightweight.
    Read,
    /// 2 device tensors (one layer), no session.
    ShortUntraced,
    /// The same, lightweight.
    ShortRead,
    /// 64 device tensors, lightweight, writing a trace file (device tensors: statistics only).
    FileRead,
    /// The same with `DigestPolicy::Always`.
    FileDigest,
    /// 64 `LaterTensor`s, no session.
    LaterUntraced,
    /// The same, lightweight.
    LaterRead,
    /// 2 `LaterTensor`s, no session.
    LaterShortUntraced,
    /// The same, lightweight.
    LaterShortRead,
}

impl Pass {
    const ALL: [Self; 10] = [
        Self::Untraced,
        Self::Read,
        Self::ShortUntraced,
        Self::ShortRead,
        Self::FileRead,
        Self::FileDigest,
        Self::LaterUntraced,
        Self::LaterRead,
        Self::LaterShortUntraced,
        Self::LaterShortRead,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Untraced => "untraced",
            Self::Read => "read",
            Self::ShortUntraced => "one layer, untraced",
            Self::ShortRead => "one layer, read",
            Self::FileRead => "read, trace file",
            Self::FileDigest => "read with digest, trace file",
            Self::LaterUntraced => "read later, untraced",
            Self::LaterRead => "read later",
            Self::LaterShortUntraced => "one layer read later, untraced",
            Self::LaterShortRead => "one layer read later",
        }
    }

    fn session(self) -> Option<ModelTracerConfig> {
        let lightweight = ModelTracerConfig {
            device_copy_below: 0,
            ..ModelTracerConfig::lightweight()
        };
        match self {
            Self::Untraced
            | Self::ShortUntraced
            | Self::LaterUntraced
            | Self::LaterShortUntraced => None,
            Self::Read
            | Self::ShortRead
            | Self::FileRead
            | Self::LaterRead
            | Self::LaterShortRead => Some(lightweight),
            Self::FileDigest => Some(ModelTracerConfig {
                digests: DigestPolicy::Always,
                ..lightweight
            }),
        }
    }

    fn writes_file(self) -> bool {
        matches!(self, Self::FileRead | Self::FileDigest)
    }

    /// Over `LaterTensor`s rather than device tensors.
    fn reads_later(self) -> bool {
        matches!(
            self,
            Self::LaterUntraced | Self::LaterRead | Self::LaterShortUntraced | Self::LaterShortRead
        )
    }

    /// The tensors a pass reads: a long or a short pass.
    fn reads(self) -> usize {
        match self {
            Self::ShortUntraced
            | Self::ShortRead
            | Self::LaterShortUntraced
            | Self::LaterShortRead => SHORT,
            _ => LONG,
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

/// The parts: µs a read, and µs a pass for what a pass pays once.
#[derive(Debug, Clone, Copy)]
struct Parts {
    untraced_pass_ms: f64,
    read: f64,
    session: f64,
    device_pointer: Option<f64>,
    queue: f64,
    pass_once: f64,
    session_pass_once: f64,
    digest_in_pass: f64,
    digest_host: f64,
    fingerprint: f64,
    sketch: f64,
}

impl Measured {
    fn pass_ms(&self, pass: Pass) -> f64 {
        median(&self.passes[pass as usize])
    }

    /// µs a traced pass takes over the same pass untraced.
    fn excess_us(&self, traced: Pass, untraced: Pass) -> f64 {
        (self.pass_ms(traced) - self.pass_ms(untraced)) * 1e3
    }

    fn parts(&self) -> Parts {
        // A pass's excess is `reads · per_read + once`: two lengths give both.
        let split = |long: f64, short: f64| {
            let per_read = (long - short) / (LONG - SHORT) as f64;
            (per_read, short - SHORT as f64 * per_read)
        };
        let (read, pass_once) = split(
            self.excess_us(Pass::Read, Pass::Untraced),
            self.excess_us(Pass::ShortRead, Pass::ShortUntraced),
        );
        let (session, session_pass_once) = split(
            self.excess_us(Pass::LaterRead, Pass::LaterUntraced),
            self.excess_us(Pass::LaterShortRead, Pass::LaterShortUntraced),
        );
        let device_pointer =
            (!self.device_pointer_ns.is_empty()).then(|| median(&self.device_pointer_ns) / 1e3);
        Parts {
            untraced_pass_ms: self.pass_ms(Pass::Untraced),
            read,
            session,
            device_pointer,
            queue: read - session - device_pointer.unwrap_or(0.0),
            pass_once,
            session_pass_once,
            digest_in_pass: self.excess_us(Pass::FileDigest, Pass::FileRead) / LONG as f64,
            digest_host: (median(&self.summary_digest_ns) - median(&self.summary_stats_ns)) / 1e3,
            fingerprint: median(&self.fingerprint_ns) / 1e3,
            sketch: median(&self.sketch_ns) / 1e3,
        }
    }
}

pub fn run(args: &PartsArgs) -> Result<(), Failure> {
    crate::require_tracing("parts")?;
    let opened = device::open(args.device)?;
    eprintln!(
        "gpu_check parts: {}, {SIZE} f32 values, {} rounds of {} passes",
        opened.name, args.rounds, args.passes
    );
    let values = random_tensor(SIZE, &opened.device)?;
    let device_tensors = distinct_copies(&values, LONG)?;
    let later: Vec<LaterTensor> = (0..LONG).map(|i| LaterTensor::new(i as f32)).collect();
    let host_values: Vec<f32> = values.to_vec1()?;
    // A file of its own for each session (a session given the path of an earlier session's
    // file writes beside it under another name), all removed with the directory.
    let dir = TempDir::new()?;
    let blocks = std::cell::Cell::new(0usize);
    let run = |pass: Pass, passes: usize| {
        blocks.set(blocks.get() + 1);
        let file = dir.join(&format!("{}.ndjson", blocks.get()));
        let file = pass.writes_file().then_some(file.as_path());
        let (config, label, device) = (pass.session(), pass.label(), &opened.device);
        let reads = pass.reads();
        if pass.reads_later() {
            block(
                config,
                file,
                label,
                (&later[..reads], later_pass),
                passes,
                device,
            )
        } else {
            let tensors = &device_tensors[..reads];
            block(config, file, label, (tensors, CANDLE_PASS), passes, device)
        }
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
         | a read (576 f32, lightweight) | {:.3} |\n\
         | · the session's bookkeeping (a read finished at the pass's end, no device) | {:.3} |\n\
         | · device pointer (cudarc `device_ptr`) | {pointer} |\n\
         | · queue (the rest: storage, layout, task, held tensor, slot) | {:.3} |\n\
         | a pass, once | {:.1} |\n\
         | · the session's (begin, end, anomaly rules) | {:.1} |\n\
         | · the device's (flush, launch, readback, wait) | {:.1} |\n\
         | a digest, per read of a pass of {LONG} (trace file: Always over the default policy) | {:.3} |\n\
         | · host work of a digest, one thread (of_values − statistics) | {:.3} |\n\
         | · · BLAKE3 fingerprint | {:.3} |\n\
         | · · sketch | {:.3} |",
        parts.read,
        parts.session,
        parts.queue,
        parts.pass_once,
        parts.session_pass_once,
        parts.pass_once - parts.session_pass_once,
        parts.digest_in_pass,
        parts.digest_host,
        parts.fingerprint,
        parts.sketch,
    );
    println!(
        "\n{device}; medians of {} rounds × {} passes of {LONG} and {SHORT} reads (untraced pass \
         of {LONG}: {:.3} ms); host-only parts: medians over the rounds of {CALLS} calls each.",
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
        "reads_per_pass": [LONG, SHORT],
        "rounds": args.rounds,
        "passes": args.passes,
        "us_a_read": {
            "read": parts.read,
            "session": parts.session,
            "device_pointer": parts.device_pointer,
            "queue": parts.queue,
            "digest_in_pass": parts.digest_in_pass,
            "digest_host": parts.digest_host,
            "fingerprint": parts.fingerprint,
            "sketch": parts.sketch,
        },
        "us_a_pass": {
            "once": parts.pass_once,
            "session": parts.session_pass_once,
        },
        "pass_ms": passes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pass times made of known parts (µs): a read of the device 2.0, of which the session
    /// 1.0 and the device pointer 0.45; a pass 30, of which the session 4; a digest 3.
    #[test]
    fn the_parts_come_back_from_the_pass_times() {
        let (read, once, session, session_once) = (2.0, 30.0, 1.0, 4.0);
        let ms = |reads: usize, per_read: f64, once: f64| (reads as f64 * per_read + once) / 1e3;
        let mut measured = Measured::default();
        for pass in Pass::ALL {
            let base = match pass {
                Pass::ShortUntraced
                | Pass::ShortRead
                | Pass::LaterShortUntraced
                | Pass::LaterShortRead => 0.5,
                _ => 1.0,
            };
            let extra = match pass {
                Pass::Read => ms(LONG, read, once),
                Pass::ShortRead => ms(SHORT, read, once),
                Pass::FileRead => ms(LONG, read + 1.0, once),
                Pass::FileDigest => ms(LONG, read + 1.0 + 3.0, once),
                Pass::LaterRead => ms(LONG, session, session_once),
                Pass::LaterShortRead => ms(SHORT, session, session_once),
                _ => 0.0,
            };
            measured.passes[pass as usize] = vec![base + extra];
        }
        measured.device_pointer_ns = vec![400.0, 500.0, 450.0];
        measured.summary_stats_ns = vec![300.0];
        measured.summary_digest_ns = vec![2700.0];
        measured.fingerprint_ns = vec![1500.0];
        measured.sketch_ns = vec![600.0];
        let parts = measured.parts();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(parts.read, read), "{parts:?}");
        assert!(close(parts.pass_once, once), "{parts:?}");
        assert!(close(parts.session, session), "{parts:?}");
        assert!(close(parts.session_pass_once, session_once), "{parts:?}");
        assert_eq!(parts.device_pointer, Some(0.45));
        assert!(close(parts.queue, 0.55), "{parts:?}");
        assert!(close(parts.digest_in_pass, 3.0), "{parts:?}");
        assert!(close(parts.digest_host, 2.4), "{parts:?}");
    }
}

//! `gpu_check reads`: what the statistics of one tensor cost in a forward pass, by the tensor's
//! size, on each of the two ways model-trace reads a device tensor.
//!
//! A pass here does nothing but record: `#[trace_model]` around `layers` calls of a
//! `#[trace_layer]` that takes one tensor and returns another, `2 · layers` reads a pass, all
//! read back together when the pass returns. Every read is of a tensor of its own (copies of
//! the same values): a batch reads a tensor it has already read once (a layer's output that is
//! the next layer's input), so reading one tensor `2 · layers` times would time that lookup,
//! not a read. Three ways to run it:
//!
//! * untraced: the same calls with no session (the annotations find none), then the device's
//!   synchronize: the floor every pass pays;
//! * on the device: a lightweight session with `device_copy_below = 0`: one statistics kernel a
//!   read, the slots copied back once a pass;
//! * copied: `device_copy_below = usize::MAX`: each read copies the tensor into pinned host
//!   memory (asynchronously) and the host reduces it when the pass ends.
//!
//! Each size is measured with many reads a pass (up to 64, fewer for large tensors so that a pass
//! reads at most 16M elements), which gives the cost of one more read in a pass like the
//! decode step's, and with one layer (two reads), which adds the pass's one wait for the device.
//! Rounds interleave the ways and the pass lengths; each figure is a median over every pass of
//! every round. The cost of a read is `(traced − untraced) / reads`. The crossover is the
//! smallest measured size from which reading on the device is never dearer than the copy:
//! below it, `ModelTracerConfig::device_copy_below` should send tensors to the copy.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use model_trace::{trace_layer, trace_model, ModelTracerConfig, Session};
use serde_json::json;

use crate::args::ReadsArgs;
use crate::device;
use crate::model::Draws;
use crate::{median, write_json, Failure};

/// Reads a pass may hold: the decode step has 210.
const MAX_READS: usize = 64;

/// Elements a pass reads at most (so that the copy of large tensors stays a few milliseconds).
const MAX_ELEMENTS_PER_PASS: usize = 16 << 20;

/// How the tensors of a pass are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Untraced,
    Device,
    Copy,
}

impl Way {
    const ALL: [(Self, &'static str); 3] = [
        (Self::Untraced, "untraced"),
        (Self::Device, "device"),
        (Self::Copy, "copy"),
    ];

    fn session(self) -> Option<ModelTracerConfig> {
        let copy_below = match self {
            Self::Untraced => return None,
            Self::Device => 0,
            Self::Copy => usize::MAX,
        };
        Some(ModelTracerConfig {
            device_copy_below: copy_below,
            ..ModelTracerConfig::lightweight()
        })
    }
}

/// Layers of a pass that reads a tensor of `size` elements many times (two reads a layer).
fn many_layers(size: usize) -> usize {
    (MAX_ELEMENTS_PER_PASS / size.max(1)).clamp(2, MAX_READS) / 2
}

/// A pass of `tensors.len() / 2` layers, layer `i` reading `tensors[2i]` as its input and
/// `tensors[2i + 1]` as its output.
#[trace_model(position = position, name = "reads")]
fn read_pass(tensors: &[Tensor], position: usize) {
    for (index, pair) in tensors.chunks_exact(2).enumerate() {
        let _ = read_layer(&pair[0], &pair[1], index);
    }
}

#[trace_layer(index = index)]
fn read_layer(input: &Tensor, output: &Tensor, index: usize) -> Tensor {
    let _ = (input, index);
    output.clone()
}

/// `count` tensors on `device`, each with storage of its own, all holding `values`.
pub fn distinct_copies(values: &Tensor, count: usize) -> Result<Vec<Tensor>, Failure> {
    Ok((0..count)
        .map(|_| values.copy())
        .collect::<candle_core::Result<_>>()?)
}

/// Tensors (two a layer) and the traced pass over them, given the tensors and its position.
pub type PassOver<'a, T> = (&'a [T], fn(&[T], usize));

/// Times `passes` passes of `pass` over `tensors` (two a layer), in a session of `config`
/// (`None`: no session) that writes a trace file to `file` if given. The session's record
/// errors fail it; so does, for a session without a file, a count of tensors kept other than
/// the reads' (a file session keeps them in the file). The file stays: give a path in a
/// [`TempDir`](crate::TempDir).
pub fn block<T>(
    config: Option<ModelTracerConfig>,
    file: Option<&Path>,
    label: &str,
    (tensors, pass): PassOver<'_, T>,
    passes: usize,
    device: &Device,
) -> Result<Vec<f64>, Failure> {
    let session =
        match config {
            None => None,
            Some(config) => {
                let mut builder = Session::builder(config);
                if let Some(file) = file {
                    builder = builder.trace_file(file);
                }
                Some(builder.start().map_err(|e| {
                    Failure::Setup(format!("{label}: the session does not start: {e}"))
                })?)
            }
        };
    let mut times_ms = Vec::with_capacity(passes);
    for position in 0..passes {
        let start = Instant::now();
        pass(tensors, position);
        device.synchronize()?;
        times_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    if let Some(session) = session {
        let (tracer, errors) = session.finish_with_errors();
        if let Some(first) = errors.first() {
            return Err(Failure::Failed(format!("{label}: {first}")));
        }
        let recorded = crate::tensors_recorded(&tracer);
        let reads = tensors.len() / 2 * 2 * passes;
        if model_trace::ENABLED && file.is_none() && recorded != reads {
            return Err(Failure::Failed(format!(
                "{label}: {recorded} tensors recorded, not {reads}"
            )));
        }
    }
    Ok(times_ms)
}

/// The pass `block` times for candle tensors.
pub const CANDLE_PASS: fn(&[Tensor], usize) = read_pass;

/// One size's figures: per way, the pass times of the long and the one-layer passes.
struct SizeFigures {
    size: usize,
    layers: usize,
    long: [Vec<f64>; 3],
    short: [Vec<f64>; 3],
}

impl SizeFigures {
    fn median_of(times: &[Vec<f64>; 3], way: Way) -> f64 {
        median(&times[way as usize])
    }

    /// µs one more read adds to a pass of many reads.
    fn read_us(&self, way: Way) -> f64 {
        let extra = Self::median_of(&self.long, way) - Self::median_of(&self.long, Way::Untraced);
        extra * 1e3 / (2 * self.layers) as f64
    }

    /// µs a pass of one layer (two reads and the pass's wait) adds to the untraced pass.
    fn alone_us(&self, way: Way) -> f64 {
        (Self::median_of(&self.short, way) - Self::median_of(&self.short, Way::Untraced)) * 1e3
    }
}

pub fn run(args: &ReadsArgs) -> Result<(), Failure> {
    crate::require_tracing("reads")?;
    let opened = device::open(args.device)?;
    eprintln!(
        "gpu_check reads: {}, f32, sizes {:?}, {} rounds of {} passes",
        opened.name, args.sizes, args.rounds, args.passes
    );
    let mut figures = Vec::with_capacity(args.sizes.len());
    for &size in &args.sizes {
        figures.push(measure_size(size, args, &opened.device)?);
    }
    print_table(&figures, args, opened.name);
    if let Some(path) = &args.json {
        write_json(path, &to_json(&figures, args, opened.name))?;
    }
    Ok(())
}

fn measure_size(size: usize, args: &ReadsArgs, device: &Device) -> Result<SizeFigures, Failure> {
    let tensor = random_tensor(size, device)?;
    let layers = many_layers(size);
    let tensors = distinct_copies(&tensor, 2 * layers)?;
    let mut figures = SizeFigures {
        size,
        layers,
        long: Default::default(),
        short: Default::default(),
    };
    // Untimed: the first passes load the kernel and allocate the batch's buffers.
    for &(way, key) in &Way::ALL {
        block(way.session(), None, key, (&tensors, CANDLE_PASS), 2, device)?;
    }
    for round in 0..args.rounds {
        for turn in 0..Way::ALL.len() {
            let (way, key) = Way::ALL[(round + turn) % Way::ALL.len()];
            let long = block(
                way.session(),
                None,
                key,
                (&tensors, CANDLE_PASS),
                args.passes,
                device,
            )?;
            figures.long[way as usize].extend(long);
            let short = block(
                way.session(),
                None,
                key,
                (&tensors[..2], CANDLE_PASS),
                args.passes,
                device,
            )?;
            figures.short[way as usize].extend(short);
        }
    }
    eprintln!(
        "{size} elements: device {:.2} µs a read, copy {:.2} µs",
        figures.read_us(Way::Device),
        figures.read_us(Way::Copy)
    );
    Ok(figures)
}

/// `size` f32 values drawn from a fixed seed, on `device`.
pub fn random_tensor(size: usize, device: &Device) -> Result<Tensor, Failure> {
    let mut draws = Draws::new(0x5eed, size as u64);
    let values: Vec<f32> = (0..size).map(|_| draws.symmetric()).collect();
    Ok(Tensor::from_vec(values, size, &Device::Cpu)?
        .to_dtype(DType::F32)?
        .to_device(device)?)
}

/// The smallest measured size from which the device's read is never dearer than the copy (the
/// sizes in increasing order); `None` when the copy is cheaper at the largest size.
fn crossover(figures: &[SizeFigures]) -> Option<usize> {
    let mut sorted: Vec<&SizeFigures> = figures.iter().collect();
    sorted.sort_by_key(|f| f.size);
    let mut from = None;
    for figure in sorted {
        if figure.read_us(Way::Device) <= figure.read_us(Way::Copy) {
            from.get_or_insert(figure.size);
        } else {
            from = None;
        }
    }
    from
}

/// What the measurements say `device_copy_below` should be: the crossover, or 0 when the device
/// is never dearer at any measured size; `None` when the copy wins at the largest.
fn suggested_copy_below(figures: &[SizeFigures]) -> Option<usize> {
    let smallest = figures.iter().map(|f| f.size).min()?;
    crossover(figures).map(|from| if from == smallest { 0 } else { from })
}

fn print_table(figures: &[SizeFigures], args: &ReadsArgs, device: &str) {
    println!(
        "\n| elements | reads a pass | untraced pass ms | µs a read: device | µs a read: copy | \
         one layer alone, µs: device | copy |\n|---:|---:|---:|---:|---:|---:|---:|"
    );
    for figure in figures {
        println!(
            "| {} | {} | {:.3} | {:.2} | {:.2} | {:.1} | {:.1} |",
            figure.size,
            2 * figure.layers,
            SizeFigures::median_of(&figure.long, Way::Untraced),
            figure.read_us(Way::Device),
            figure.read_us(Way::Copy),
            figure.alone_us(Way::Device),
            figure.alone_us(Way::Copy),
        );
    }
    println!(
        "\n{device}, f32; medians of {} rounds × {} passes. µs a read: (traced − untraced pass) \
         / reads, in a pass of many reads; one layer alone: a pass of two reads (and its one \
         wait) over the untraced pass.",
        args.rounds, args.passes
    );
    match (crossover(figures), suggested_copy_below(figures)) {
        (_, Some(0)) => println!(
            "crossover: reading on the device is never dearer than the copy at any measured \
             size (device_copy_below = 0)"
        ),
        (Some(size), _) => println!(
            "crossover: from {size} elements on, reading on the device is never dearer than the \
             copy (device_copy_below = {size})"
        ),
        (None, _) => println!("crossover: the copy is cheaper at the largest measured size"),
    }
}

fn to_json(figures: &[SizeFigures], args: &ReadsArgs, device: &str) -> serde_json::Value {
    let sizes: Vec<serde_json::Value> = figures
        .iter()
        .map(|figure| {
            let ways: serde_json::Map<String, serde_json::Value> = Way::ALL
                .iter()
                .map(|&(way, key)| {
                    (
                        key.to_owned(),
                        json!({
                            "pass_ms": SizeFigures::median_of(&figure.long, way),
                            "one_layer_pass_ms": SizeFigures::median_of(&figure.short, way),
                        }),
                    )
                })
                .collect();
            json!({
                "elements": figure.size,
                "reads_per_pass": 2 * figure.layers,
                "read_us": {
                    "device": figure.read_us(Way::Device),
                    "copy": figure.read_us(Way::Copy),
                },
                "one_layer_alone_us": {
                    "device": figure.alone_us(Way::Device),
                    "copy": figure.alone_us(Way::Copy),
                },
                "ways": ways,
            })
        })
        .collect();
    json!({
        "command": "reads",
        "device": device,
        "dtype": "f32",
        "rounds": args.rounds,
        "passes": args.passes,
        "crossover_elements": crossover(figures),
        "suggested_device_copy_below": suggested_copy_below(figures),
        "sizes": sizes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(size: usize, device_ms: f64, copy_ms: f64) -> SizeFigures {
        SizeFigures {
            size,
            layers: 1,
            long: [vec![1.0], vec![1.0 + device_ms], vec![1.0 + copy_ms]],
            short: [vec![1.0], vec![1.0], vec![1.0]],
        }
    }

    #[test]
    fn the_crossover_is_where_the_device_stays_cheaper() {
        let figures = [
            figure(1, 0.010, 0.004),
            figure(64, 0.010, 0.011),
            figure(256, 0.010, 0.009),
            figure(4096, 0.010, 0.020),
            figure(1 << 20, 0.012, 0.900),
        ];
        assert_eq!(crossover(&figures), Some(4096));
        assert_eq!(suggested_copy_below(&figures), Some(4096));
        assert_eq!(crossover(&figures[..3]), None);
        assert_eq!(suggested_copy_below(&figures[..3]), None);
        assert_eq!(suggested_copy_below(&figures[1..2]), Some(0));
        assert!((figures[4].read_us(Way::Copy) - 450.0).abs() < 1e-9);
    }

    #[test]
    fn passes_read_at_most_their_share() {
        assert_eq!(many_layers(1), MAX_READS / 2);
        assert_eq!(many_layers(1 << 20), 8);
        assert_eq!(many_layers(4 << 20), 2);
        assert_eq!(many_layers(64 << 20), 1);
    }
}

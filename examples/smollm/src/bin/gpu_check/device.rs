//! Opening the device `--device` asks for, or the default one.

use candle_core::Device;

use crate::args::DeviceKind;
use crate::Failure;

/// Whether this binary was built with the `cuda` feature (candle's CUDA backend).
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// The device to run on and its name for the output (`cpu`, `cuda:0`).
pub struct Opened {
    pub device: Device,
    pub name: &'static str,
}

/// `--device cuda`: GPU 0 or an error; `--device cpu`: the CPU; neither: GPU 0 when this is a
/// CUDA build and one opens, else the CPU, with a line on stderr saying why.
pub fn open(choice: Option<DeviceKind>) -> Result<Opened, Failure> {
    let cpu = Opened {
        device: Device::Cpu,
        name: "cpu",
    };
    match choice {
        Some(DeviceKind::Cpu) => Ok(cpu),
        Some(DeviceKind::Cuda) if !CUDA_BUILT => Err(Failure::Setup(
            "--device cuda: this gpu_check was built without CUDA; build it with \
             `cargo build --release -p smollm --features trace,cuda --bin gpu_check`"
                .into(),
        )),
        Some(DeviceKind::Cuda) => open_cuda().map_err(|e| {
            Failure::Setup(format!(
                "--device cuda: cannot open CUDA device 0: {}\n(are the CUDA libraries on \
                 LD_LIBRARY_PATH? see examples/smollm/README.md)",
                first_line(&e)
            ))
        }),
        None if !CUDA_BUILT => {
            eprintln!(
                "note: built without the `cuda` feature: running on the CPU \
                 (`--features trace,cuda` builds the GPU version)"
            );
            Ok(cpu)
        }
        None => Ok(open_cuda().unwrap_or_else(|e| {
            eprintln!(
                "note: no CUDA device opens ({}): running on the CPU",
                first_line(&e)
            );
            cpu
        })),
    }
}

/// The first line of candle's error: the rest is a backtrace when RUST_BACKTRACE is set, and
/// its frames are unnamed in a stripped binary.
fn first_line(error: &candle_core::Error) -> String {
    error
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// GPU 0. Without the `cuda` feature candle answers with an error, which `open` never asks for.
fn open_cuda() -> candle_core::Result<Opened> {
    Ok(Opened {
        device: Device::new_cuda(0)?,
        name: "cuda:0",
    })
}

//! The statistics kernel (`stats.cu`): compiled by NVRTC for the device's architecture, once
//! per process and architecture, loaded once per device, launched once per tensor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda::cudarc::driver::{
    sys::CUdevice_attribute, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda::{CudaDevice, CudaStorageSlice};

use super::layout::{DeviceLayout, MAX_RANK};
use crate::tensor::TensorError;

/// The kernel's source: one entry point per dtype it reads.
const SOURCE: &str = include_str!("stats.cu");

/// Name under which the module is cached by the device.
const MODULE: &str = "model_trace_stats";

/// Threads per block; the kernel's block reduction needs a multiple of 32 (at most 1024).
const THREADS: u32 = 256;

/// Blocks per multiprocessor: enough to hide memory latency, few enough that the per-block
/// atomics on one slot stay a handful of microseconds at most.
const BLOCKS_PER_SM: u32 = 2;

/// The 64-bit words of one tensor's results (see `stats.cu`).
pub(super) const SLOT_WORDS: usize = 8;

/// The layout as the kernel reads it: `struct Layout` of `stats.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KernelLayout {
    offset: u64,
    count: u64,
    rank: u64,
    dims: [u64; MAX_RANK],
    strides: [u64; MAX_RANK],
}

// SAFETY: `KernelLayout` is `repr(C)`, made of `u64`s only (no padding, no pointers), and has the
// same fields in the same order as `struct Layout` in stats.cu, which the kernel takes by value.
unsafe impl DeviceRepr for KernelLayout {}

impl From<&DeviceLayout> for KernelLayout {
    fn from(layout: &DeviceLayout) -> Self {
        let mut dims = [1u64; MAX_RANK];
        let mut strides = [0u64; MAX_RANK];
        for (at, (&dim, &stride)) in layout.dims.iter().zip(&layout.strides).enumerate() {
            dims[at] = dim as u64;
            strides[at] = stride as u64;
        }
        Self {
            offset: layout.offset as u64,
            count: layout.count as u64,
            rank: layout.dims.len() as u64,
            dims,
            strides,
        }
    }
}

/// PTX (or why NVRTC could not make it) by compute capability.
type Compiled = HashMap<(i32, i32), Result<Arc<str>, String>>;

/// PTX of `stats.cu`, by compute capability; an error is kept too, so that a failing compile is
/// tried once.
fn ptx_for(capability: (i32, i32)) -> Result<Arc<str>, TensorError> {
    static COMPILED: OnceLock<Mutex<Compiled>> = OnceLock::new();
    let mut compiled = COMPILED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    compiled
        .entry(capability)
        .or_insert_with(|| {
            let (major, minor) = capability;
            let options = CompileOptions {
                options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
                ..CompileOptions::default()
            };
            compile_ptx_with_opts(SOURCE, options)
                .map(|ptx| Arc::from(ptx.to_src()))
                .map_err(|error| format!("compiling the statistics kernel with NVRTC: {error}"))
        })
        .clone()
        .map_err(TensorError::Backend)
}

/// What a launch needs of a device, looked up once.
pub(super) struct Launcher {
    device: CudaDevice,
    ptx: Arc<str>,
    blocks_cap: u32,
}

impl Launcher {
    pub(super) fn new(device: &CudaDevice, stream: &Arc<CudaStream>) -> Result<Self, TensorError> {
        let context = stream.context();
        let capability = context.compute_capability().map_err(backend)?;
        let sms = context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(backend)?;
        Ok(Self {
            device: device.clone(),
            ptx: ptx_for(capability)?,
            blocks_cap: u32::try_from(sms.max(1)).unwrap_or(1) * BLOCKS_PER_SM,
        })
    }

    /// Queues the reduction of the values `layout` describes in `values` into `slot` (zeroed,
    /// `SLOT_WORDS` long). `None` when the kernel does not read this dtype.
    pub(super) fn launch(
        &self,
        values: &CudaStorageSlice,
        layout: &DeviceLayout,
        slot: &mut CudaSlice<u64>,
        at: usize,
    ) -> Option<Result<(), TensorError>> {
        let name = match values {
            CudaStorageSlice::F32(_) => "model_trace_stats_f32",
            CudaStorageSlice::F64(_) => "model_trace_stats_f64",
            CudaStorageSlice::F16(_) => "model_trace_stats_f16",
            CudaStorageSlice::BF16(_) => "model_trace_stats_bf16",
            _ => return None,
        };
        Some(self.launch_named(name, values, layout, slot, at))
    }

    fn launch_named(
        &self,
        name: &str,
        values: &CudaStorageSlice,
        layout: &DeviceLayout,
        slots: &mut CudaSlice<u64>,
        at: usize,
    ) -> Result<(), TensorError> {
        let function = self
            .device
            .get_or_load_custom_func(name, MODULE, &self.ptx)
            .map_err(|error| TensorError::Backend(error.to_string()))?;
        let kernel_layout = KernelLayout::from(layout);
        let wanted = layout.count.div_ceil(THREADS as usize);
        let blocks = u32::try_from(wanted)
            .unwrap_or(u32::MAX)
            .clamp(1, self.blocks_cap);
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut slot = slots.slice_mut(at * SLOT_WORDS..(at + 1) * SLOT_WORDS);
        let mut builder = function.builder();
        match values {
            CudaStorageSlice::F32(values) => builder.arg(values),
            CudaStorageSlice::F64(values) => builder.arg(values),
            CudaStorageSlice::F16(values) => builder.arg(values),
            CudaStorageSlice::BF16(values) => builder.arg(values),
            _ => return Err(TensorError::Backend(format!("no {name} for this dtype"))),
        };
        builder.arg(&kernel_layout);
        builder.arg(&mut slot);
        // SAFETY: the arguments match the kernel's signature: a pointer to the tensor's values
        // (of the type the entry point reads), its layout by value (`KernelLayout` is
        // `struct Layout`), and a slot of SLOT_WORDS u64s. Every element the layout addresses
        // lies inside the tensor's storage (candle's layout of this storage); the slot lies
        // inside `slots`. The launch is ordered on candle's stream after the work that wrote the
        // values.
        unsafe { builder.launch(config) }.map_err(backend)?;
        Ok(())
    }
}

pub(super) fn backend(error: impl std::fmt::Display) -> TensorError {
    TensorError::Backend(format!("CUDA: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC needs no GPU: the kernel's source is compiled here, for the oldest architecture CUDA
    /// 13 still targets and for the H100's.
    #[test]
    fn the_kernel_compiles_with_every_entry_point() {
        for capability in [(7, 5), (9, 0)] {
            let ptx = ptx_for(capability).unwrap();
            for dtype in ["f32", "f64", "f16", "bf16"] {
                let entry = format!(".entry model_trace_stats_{dtype}(");
                assert!(ptx.contains(&entry), "{capability:?}: no {entry}");
            }
        }
    }
}

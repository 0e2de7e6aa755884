//! The read kernel (`stats.cu`): compiled by NVRTC for the device's architecture, once per
//! process and architecture, loaded once per device, launched once per batch of reads.
//!
//! A read queued on a device costs no driver call of its own beyond the lookup of its storage's
//! address (see [`device_address`]): its task, a fixed-size record of what to read and where
//! to put it, waits on the host until the batch is flushed, and then one table copy and one
//! launch serve every read of the batch. Launching one kernel per tensor instead cost 6-9 µs of
//! host time a tensor on an H100 machine (1.45 µs batched), and made a SmolLM2-shaped decode
//! step 1.42× slower than untraced (1.14× batched).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda::cudarc::driver::{
    sys::CUdevice_attribute, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda::{CudaDevice, CudaStorageSlice};

use super::layout::{DeviceLayout, MAX_RANK};
use crate::tensor::TensorError;

/// The kernel's source.
const SOURCE: &str = include_str!("stats.cu");

/// Name under which the module is cached by the device.
const MODULE: &str = "model_trace_read";

/// The kernel's one entry point.
const ENTRY: &str = "model_trace_read";

/// Threads per block; the kernel's block reduction needs a multiple of 32 (at most 1024).
const THREADS: u32 = 256;

/// Blocks per multiprocessor a task may take: enough to hide memory latency on a large tensor,
/// few enough that the per-block atomics on one slot stay a handful of microseconds at most.
const BLOCKS_PER_SM: u32 = 2;

/// The 64-bit words of one tensor's statistics (see `stats.cu`).
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

impl From<&DeviceLayout> for KernelLayout {
    fn from(layout: &DeviceLayout) -> Self {
        let mut dims = [1u64; MAX_RANK];
        let mut strides = [0u64; MAX_RANK];
        for (at, (&dim, &stride)) in layout.dims().iter().zip(layout.strides()).enumerate() {
            dims[at] = dim as u64;
            strides[at] = stride as u64;
        }
        Self {
            offset: layout.offset as u64,
            count: layout.count as u64,
            rank: layout.dims().len() as u64,
            dims,
            strides,
        }
    }
}

/// What a task does: `KIND_*` of `stats.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TaskKind {
    /// Statistics into a slot.
    Stats = 0,
    /// The values, row-major in their own dtype, into a staging buffer.
    Gather = 1,
}

/// One read as the kernel takes it: `struct Task` of `stats.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Task {
    /// The tensor's storage.
    address: u64,
    /// The slot's (stats) or the staging bytes' (gather) device address.
    target: u64,
    /// The task's first block in the launch, and how many it takes.
    first_block: u32,
    blocks: u32,
    kind: u32,
    dtype: u32,
    layout: KernelLayout,
}

// SAFETY: `KernelLayout` and `Task` are `repr(C)`, made of `u64`s and `u32`s in pairs (no
// padding, no pointers the host dereferences), with the fields of `struct Layout` and
// `struct Task` in stats.cu in the same order; the kernel reads `Task`s from device memory.
unsafe impl DeviceRepr for KernelLayout {}
// SAFETY: as above.
unsafe impl DeviceRepr for Task {}
// SAFETY: integers only: all zero bits is a `Task` (an empty read that is never launched).
unsafe impl ValidAsZeroBits for Task {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for KernelLayout {}

impl Task {
    /// A read of `storage` through `layout`, writing to `target`.
    pub(super) fn new(
        kind: TaskKind,
        storage: &StorageAddress,
        layout: &DeviceLayout,
        target: u64,
    ) -> Self {
        Self {
            address: storage.address,
            target,
            first_block: 0,
            blocks: 0,
            kind: kind as u32,
            dtype: storage.dtype,
            layout: KernelLayout::from(layout),
        }
    }

    /// The elements the task reads.
    pub(super) fn count(&self) -> u64 {
        self.layout.count
    }
}

/// Where a tensor's storage is and what the kernel reads it as.
pub(super) struct StorageAddress {
    address: u64,
    /// Bytes an element.
    pub(super) width: usize,
    /// `DTYPE_*` of stats.cu.
    dtype: u32,
}

impl StorageAddress {
    /// The storage `values` on `stream` (candle's), `None` for a dtype the kernel does not read
    /// (f32, f64, f16 and bf16 it does).
    pub(super) fn of(values: &CudaStorageSlice, stream: &CudaStream) -> Option<Self> {
        let (address, width, dtype) = match values {
            CudaStorageSlice::F32(s) => (device_address(s, stream), 4, 0),
            CudaStorageSlice::F64(s) => (device_address(s, stream), 8, 1),
            CudaStorageSlice::F16(s) => (device_address(s, stream), 2, 2),
            CudaStorageSlice::BF16(s) => (device_address(s, stream), 2, 3),
            _ => return None,
        };
        Some(Self {
            address,
            width,
            dtype,
        })
    }
}

/// The device address of `slice`, for work queued on `stream`, the stream of the candle device
/// that owns it.
///
/// cudarc makes each use of a slice wait for its last write's event and record a read event,
/// when the context has several streams, so that work on another stream is ordered after it.
/// Here the stream is candle's own, the one every candle op on this device writes on and cudarc
/// frees the slice on: stream order already keeps the work queued on it after the writes and
/// before the free, so the read event is not recorded (a driver call saved per read). The batch
/// also holds the tensor until its work is queued.
pub(super) fn device_address<T>(slice: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (address, record) = slice.device_ptr(stream);
    std::mem::forget(record);
    address
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
                .map_err(|error| format!("compiling the read kernel with NVRTC: {error}"))
        })
        .clone()
        .map_err(TensorError::Backend)
}

/// What a launch needs of a device, looked up once.
pub(super) struct Launcher {
    stream: Arc<CudaStream>,
    function: CudaFunction,
    blocks_cap: u32,
}

impl Launcher {
    pub(super) fn new(device: &CudaDevice, stream: &Arc<CudaStream>) -> Result<Self, TensorError> {
        let context = stream.context();
        let capability = context.compute_capability().map_err(backend)?;
        let sms = context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(backend)?;
        let ptx = ptx_for(capability)?;
        let function = device
            .get_or_load_custom_func(ENTRY, MODULE, &ptx)
            .map_err(|error| TensorError::Backend(error.to_string()))?;
        Ok(Self {
            stream: Arc::clone(stream),
            function: CudaFunction::clone(&function),
            blocks_cap: u32::try_from(sms.max(1)).unwrap_or(1) * BLOCKS_PER_SM,
        })
    }

    /// Blocks a task of `count` elements takes: one per `THREADS` elements, at most the cap.
    pub(super) fn blocks_for(&self, count: u64) -> u32 {
        u32::try_from(count.div_ceil(u64::from(THREADS)))
            .unwrap_or(u32::MAX)
            .clamp(1, self.blocks_cap)
    }

    /// Queues the kernel over `count` tasks at device address `tasks`, whose blocks number
    /// `blocks` in all.
    pub(super) fn launch(&self, tasks: u64, count: u32, blocks: u32) -> Result<(), TensorError> {
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = self.stream.launch_builder(&self.function);
        builder.arg(&tasks);
        builder.arg(&count);
        // SAFETY: the arguments match the kernel's signature: the address of `count` `Task`s
        // (`struct Task`, copied to the device before this launch on the same stream), and
        // their number. Each task's blocks are `first_block..first_block + blocks`, increasing,
        // together `0..blocks`. Every element a task's layout addresses lies inside its
        // tensor's storage (candle's layout of it), whose tensor the batch holds until this
        // launch is queued; each target is a zeroed slot or a staging range of the task's size
        // that no other task of the batch writes. Ordered on candle's stream after the work
        // that wrote the values.
        unsafe { builder.launch(config) }.map_err(backend)?;
        Ok(())
    }
}

/// Deals out the launch's blocks: sets each task's `first_block` and `blocks` (from `blocks_for`
/// of its size), in order; returns the total.
pub(super) fn deal_blocks(tasks: &mut [Task], blocks_for: impl Fn(u64) -> u32) -> u32 {
    let mut next = 0u32;
    for task in tasks {
        task.first_block = next;
        task.blocks = blocks_for(task.count());
        next = next.saturating_add(task.blocks);
    }
    next
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
    fn the_kernel_compiles() {
        for capability in [(7, 5), (9, 0)] {
            let ptx = ptx_for(capability).unwrap();
            let entry = format!(".entry {ENTRY}(");
            assert!(ptx.contains(&entry), "{capability:?}: no {entry}");
        }
    }

    /// `struct Task` of stats.cu: two addresses, four 32-bit fields, then the layout.
    #[test]
    fn tasks_have_the_kernels_layout() {
        assert_eq!(size_of::<KernelLayout>(), (3 + 2 * MAX_RANK) * 8);
        assert_eq!(size_of::<Task>(), 2 * 8 + 4 * 4 + size_of::<KernelLayout>());
        assert_eq!(std::mem::offset_of!(Task, layout), 32);
    }

    #[test]
    fn blocks_are_dealt_in_order() {
        let layout = DeviceLayout::new(0, &[10], &[1]).unwrap();
        let task = |count: u64| Task {
            layout: KernelLayout {
                count,
                ..KernelLayout::from(&layout)
            },
            address: 0,
            target: 0,
            first_block: 0,
            blocks: 0,
            kind: 0,
            dtype: 0,
        };
        let mut tasks = [task(1), task(1000), task(3)];
        let total = deal_blocks(&mut tasks, |count| count.div_ceil(256).clamp(1, 2) as u32);
        let dealt: Vec<(u32, u32)> = tasks.iter().map(|t| (t.first_block, t.blocks)).collect();
        assert_eq!(dealt, [(0, 1), (1, 2), (3, 1)]);
        assert_eq!(total, 4);
    }
}

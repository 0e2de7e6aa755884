//! One device's reads of one forward pass, read back together.
//!
//! A started read takes a slot (for the statistics kernel) or a range of a pinned staging buffer
//! (for a copy of the values), and queues its work on candle's stream. The first read finished
//! after that copies every used slot to pinned host memory and waits for the stream once; the
//! other reads of the batch take their part of what came back. The next read started begins a
//! new batch, reusing the device and host buffers (they only ever grow, by whole chunks, so work
//! in flight never sees its memory move).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use candle_core::cuda::cudarc::driver::{
    result, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice, SyncOnDrop,
};
use candle_core::cuda::{CudaDevice, CudaStorageSlice, DeviceId};

use super::kernel::{backend, Launcher, SLOT_WORDS};
use super::layout::DeviceLayout;
use crate::tensor::TensorError;

/// Tensors a chunk of slots holds: a SmolLM2 decode step (210 tensors) fits in one.
const SLOTS_PER_CHUNK: usize = 512;

/// The smallest pinned staging chunk: 4 MiB.
const MIN_STAGING_BYTES: usize = 4 << 20;

thread_local! {
    /// This thread's batch per device (a session lives on one thread; so do its passes).
    static BATCHES: RefCell<HashMap<DeviceId, Rc<RefCell<Batch>>>> = RefCell::default();
}

/// The batch of `device` on this thread, created on first use.
pub(super) fn batch_of(device: &CudaDevice) -> Result<Rc<RefCell<Batch>>, TensorError> {
    BATCHES.with(|batches| {
        if let Some(batch) = batches.borrow().get(&device.id()) {
            return Ok(Rc::clone(batch));
        }
        let batch = Rc::new(RefCell::new(Batch::new(device)?));
        batches.borrow_mut().insert(device.id(), Rc::clone(&batch));
        Ok(batch)
    })
}

/// Where a read's result will be, once its batch is read back.
#[derive(Debug, Clone, Copy)]
pub(super) enum Place {
    /// A slot of statistics.
    Slot(usize),
    /// A range of staged bytes: the chunk and the byte range in it.
    Staged {
        chunk: usize,
        start: usize,
        len: usize,
    },
}

/// What a read gets back.
pub(super) enum ReadBack<'a> {
    Slot([u64; SLOT_WORDS]),
    Bytes(&'a [u8]),
}

struct SlotChunk {
    device: CudaSlice<u64>,
    host: PinnedHostSlice<u64>,
    /// Whether the device slots hold a previous batch's results (cleared before reuse).
    dirty: bool,
}

struct StagingChunk {
    host: PinnedHostSlice<u8>,
    used: usize,
}

pub(super) struct Batch {
    stream: Arc<CudaStream>,
    launcher: Launcher,
    slots: Vec<SlotChunk>,
    slots_used: usize,
    staging: Vec<StagingChunk>,
    /// Which batch this is: a read remembers its number, and is refused once its batch is gone.
    number: u64,
    /// Whether this batch was read back (the next start begins a new one).
    read_back: bool,
}

impl Batch {
    fn new(device: &CudaDevice) -> Result<Self, TensorError> {
        let stream = device.cuda_stream();
        let launcher = Launcher::new(device, &stream)?;
        Ok(Self {
            stream,
            launcher,
            slots: Vec::new(),
            slots_used: 0,
            staging: Vec::new(),
            number: 0,
            read_back: false,
        })
    }

    /// The batch reads started now join; a new one if the last was read back.
    fn current(&mut self) -> u64 {
        if self.read_back {
            self.read_back = false;
            self.number += 1;
            self.slots_used = 0;
            for chunk in &mut self.slots {
                chunk.dirty = true;
            }
            for chunk in &mut self.staging {
                chunk.used = 0;
            }
        }
        self.number
    }

    /// Queues the statistics kernel over `values`; `None` when it does not read their dtype.
    pub(super) fn start_stats(
        &mut self,
        values: &CudaStorageSlice,
        layout: &DeviceLayout,
    ) -> Option<Result<(u64, Place), TensorError>> {
        let number = self.current();
        let at = self.slots_used;
        let (chunk, index) = (at / SLOTS_PER_CHUNK, at % SLOTS_PER_CHUNK);
        if let Err(error) = self.ready_slot_chunk(chunk) {
            return Some(Err(error));
        }
        let slots = &mut self.slots[chunk].device;
        match self.launcher.launch(values, layout, slots, index)? {
            Ok(()) => {
                self.slots_used += 1;
                Some(Ok((number, Place::Slot(at))))
            }
            Err(error) => Some(Err(error)),
        }
    }

    /// Makes chunk `chunk` of slots exist and hold zeros.
    fn ready_slot_chunk(&mut self, chunk: usize) -> Result<(), TensorError> {
        if chunk == self.slots.len() {
            let device = self
                .stream
                .alloc_zeros::<u64>(SLOTS_PER_CHUNK * SLOT_WORDS)
                .map_err(backend)?;
            // SAFETY: the buffer is only read after a copy from the device has filled the part
            // that is read; page-locked without write-combining, so the host reads it fast.
            let host = unsafe {
                self.stream
                    .context()
                    .alloc_pinned_with_flags::<u64>(SLOTS_PER_CHUNK * SLOT_WORDS, 0)
            }
            .map_err(backend)?;
            self.slots.push(SlotChunk {
                device,
                host,
                dirty: false,
            });
        }
        let slot_chunk = &mut self.slots[chunk];
        if slot_chunk.dirty {
            self.stream
                .memset_zeros(&mut slot_chunk.device)
                .map_err(backend)?;
            slot_chunk.dirty = false;
        }
        Ok(())
    }

    /// Queues a copy of the elements `range` of `values` (contiguous) to pinned host memory.
    pub(super) fn start_copy(
        &mut self,
        values: &CudaStorageSlice,
        range: std::ops::Range<usize>,
    ) -> Result<(u64, Place), TensorError> {
        let number = self.current();
        let (pointer, width, _record) = device_bytes(values, &self.stream)?;
        let len = range.len() * width;
        let chunk = match self
            .staging
            .iter()
            .position(|c| c.host.len() - c.used >= len)
        {
            Some(chunk) => chunk,
            None => {
                let last = self.staging.last().map_or(0, |c| c.host.len());
                let size = len.max(2 * last).max(MIN_STAGING_BYTES);
                // SAFETY: bytes are only read after the copy that writes them has completed
                // (the readback waits for the stream).
                let host = unsafe { self.stream.context().alloc_pinned_with_flags::<u8>(size, 0) }
                    .map_err(backend)?;
                self.staging.push(StagingChunk { host, used: 0 });
                self.staging.len() - 1
            }
        };
        let staging = &mut self.staging[chunk];
        let start = staging.used;
        let host = staging.host.as_mut_slice().map_err(backend)?;
        let source = pointer + (range.start * width) as u64;
        // SAFETY: `source` addresses `len` bytes inside the tensor's storage (the range is the
        // tensor's own, in elements of `width` bytes); the destination is `len` bytes of pinned
        // memory that nothing else reads or writes until the batch is read back, after the
        // stream has been waited for. Ordered on candle's stream after the writes of the values.
        unsafe {
            result::memcpy_dtoh_async(
                &mut host[start..start + len],
                source,
                self.stream.cu_stream(),
            )
        }
        .map_err(backend)?;
        staging.used += len;
        Ok((number, Place::Staged { chunk, start, len }))
    }

    /// The result of a read of batch `number`: reads the batch back first if it has not been.
    pub(super) fn result(
        &mut self,
        number: u64,
        place: Place,
    ) -> Result<ReadBack<'_>, TensorError> {
        if number != self.number {
            return Err(TensorError::Backend(
                "a device read was finished after the next forward pass had begun".to_owned(),
            ));
        }
        if !self.read_back {
            self.read_back()?;
        }
        Ok(match place {
            Place::Slot(at) => {
                let (chunk, index) = (at / SLOTS_PER_CHUNK, at % SLOTS_PER_CHUNK);
                let host = self.slots[chunk].host.as_slice().map_err(backend)?;
                let mut slot = [0u64; SLOT_WORDS];
                slot.copy_from_slice(&host[index * SLOT_WORDS..(index + 1) * SLOT_WORDS]);
                ReadBack::Slot(slot)
            }
            Place::Staged { chunk, start, len } => {
                let host = self.staging[chunk].host.as_slice().map_err(backend)?;
                ReadBack::Bytes(&host[start..start + len])
            }
        })
    }

    /// Copies the used slots to the host and waits for the stream: the one wait of a pass.
    fn read_back(&mut self) -> Result<(), TensorError> {
        let mut left = self.slots_used;
        for chunk in &mut self.slots {
            if left == 0 {
                break;
            }
            let words = left.min(SLOTS_PER_CHUNK) * SLOT_WORDS;
            left = left.saturating_sub(SLOTS_PER_CHUNK);
            let (pointer, _record) = chunk.device.device_ptr(&self.stream);
            let host = chunk.host.as_mut_slice().map_err(backend)?;
            // SAFETY: `words` u64s from the start of the chunk's device slots into as many of
            // its pinned host slots; the stream is waited for below before they are read.
            unsafe {
                result::memcpy_dtoh_async(&mut host[..words], pointer, self.stream.cu_stream())
            }
            .map_err(backend)?;
        }
        self.stream.synchronize().map_err(backend)?;
        self.read_back = true;
        Ok(())
    }
}

/// The device address of `values`' storage, the width of its elements in bytes, and the guard
/// that records the use on candle's stream.
fn device_bytes<'a>(
    values: &'a CudaStorageSlice,
    stream: &'a Arc<CudaStream>,
) -> Result<(u64, usize, SyncOnDrop<'a>), TensorError> {
    let (pointer, record) = match values {
        CudaStorageSlice::F32(s) => s.device_ptr(stream),
        CudaStorageSlice::F64(s) => s.device_ptr(stream),
        CudaStorageSlice::F16(s) => s.device_ptr(stream),
        CudaStorageSlice::BF16(s) => s.device_ptr(stream),
        _ => return Err(TensorError::Backend("not a float dtype".to_owned())),
    };
    let width = match values {
        CudaStorageSlice::F32(_) => 4,
        CudaStorageSlice::F64(_) => 8,
        _ => 2,
    };
    Ok((pointer, width, record))
}

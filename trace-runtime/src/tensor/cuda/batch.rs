//! One device's reads of one forward pass, queued, run and read back together.
//!
//! A read started on the device becomes a task (see `kernel`): statistics into a slot, or the
//! values gathered into a staging buffer. Tasks wait on the host, with the tensors they read
//! held so that their memory stays theirs, until the batch is flushed: their table is copied to
//! the device and one kernel launch runs them all, followed by one copy of the staged values to
//! pinned host memory. A batch flushes when its queue is full or holds much memory, and when the
//! first of its reads is finished (at the end of the pass); that first finish then copies every
//! used slot back and waits for the stream, once. The other reads of the batch take their part
//! of what came back. The next read started begins a new batch, reusing every buffer (they only
//! ever grow, by whole chunks, so work in flight never sees its memory move).
//!
//! A tensor is read when its batch is flushed, not when it was traced: one written in place in
//! between (candle's `slice_set`, `inplace_op*`) is read with its new values. Within a forward
//! pass that is rare (a KV cache is written before it is read), and the batch of a pass is
//! flushed at its end at the latest.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use candle_core::cuda::cudarc::driver::{
    result, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use candle_core::cuda::{CudaDevice, CudaStorageSlice, DeviceId};
use candle_core::{DType, Tensor, TensorId};

use super::kernel::{
    backend, deal_blocks, device_address, Launcher, StorageAddress, Task, TaskKind, SLOT_WORDS,
};
use super::layout::DeviceLayout;
use super::values::{self, Gathered};
use crate::id_hash::IdMap;
use crate::summary::TensorSummary;
use crate::tensor::TensorError;

/// Tensors a chunk of slots holds: a SmolLM2 decode step (210 tensors) fits in one.
const SLOTS_PER_CHUNK: usize = 512;

/// Tasks queued before a flush, and the tasks a table chunk holds.
const TASKS_PER_FLUSH: usize = 1024;

/// Bytes of tensors the queue may hold before a flush lets them go.
const FLUSH_HELD_BYTES: usize = 256 << 20;

/// The smallest staging chunk: 4 MiB on the device and as much pinned on the host.
const MIN_STAGING_BYTES: usize = 4 << 20;

/// Staged values start on this boundary (the widest element is 8 bytes).
const STAGING_ALIGN: usize = 16;

thread_local! {
    /// This thread's batch per device (a session lives on one thread; so do its passes).
    static BATCHES: RefCell<IdMap<DeviceId, Rc<RefCell<Batch>>>> = RefCell::default();
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

/// A range of staged bytes: the chunk and the byte range in it.
#[derive(Debug, Clone, Copy)]
struct Staged {
    chunk: usize,
    start: usize,
    len: usize,
}

/// A read of gathered values: where they are, what to make of them, and how many reads of the
/// batch take the summary (a tensor read twice is gathered and summarised once).
struct GatherRead {
    staged: Staged,
    dtype: DType,
    shape: Vec<usize>,
    digest: bool,
    readers: usize,
}

/// Page-locked host memory, read and written through a pointer taken once: cudarc's accessors
/// wait on an event each time (a driver call per read finished), which only its own copies
/// record. Every copy into or out of this memory is queued on the batch's stream with the raw
/// driver functions and waited for by the readback before the host reads the bytes.
struct Pinned<T> {
    /// Owns the memory.
    _slice: PinnedHostSlice<T>,
    pointer: *mut T,
    len: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits> Pinned<T> {
    /// `len` elements, uninitialised: written (on the host, or by a copy) before they are read.
    fn alloc(stream: &CudaStream, len: usize) -> Result<Self, TensorError> {
        // SAFETY: see the type's invariant; page-locked without write-combining, so the host
        // reads it fast.
        let mut slice =
            unsafe { stream.context().alloc_pinned_with_flags::<T>(len, 0) }.map_err(backend)?;
        let pointer = slice.as_mut_ptr().map_err(backend)?;
        Ok(Self {
            _slice: slice,
            pointer,
            len,
        })
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_slice(&self) -> &[T] {
        // SAFETY: `pointer` addresses `len` elements that `_slice` owns for as long as `self`
        // lives; no copy writes them while the host reads (see the type).
        unsafe { std::slice::from_raw_parts(self.pointer, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.pointer, self.len) }
    }
}

struct SlotChunk {
    device: CudaSlice<u64>,
    /// `device`'s address, taken once.
    address: u64,
    host: Pinned<u64>,
    /// Whether the device slots hold a previous batch's results (cleared before reuse).
    dirty: bool,
}

/// Staged values: device bytes the kernel gathers into and pinned host bytes of the same size
/// they are copied to, filled in order.
struct StagingChunk {
    /// Held for `address`.
    _device: CudaSlice<u8>,
    address: u64,
    host: Pinned<u8>,
    used: usize,
    /// Bytes `0..copied` have their copy to the host queued.
    copied: usize,
}

/// Task tables: written on the host (pinned), copied to the device before the launch that
/// reads them. Filled in order within a batch, since a copy may still be pending when the next
/// flush writes its table.
struct TableChunk {
    host: Pinned<Task>,
    /// Held for `address`.
    _device: CudaSlice<Task>,
    address: u64,
    used: usize,
}

/// Tasks waiting for the next flush, with the tensors they read.
#[derive(Default)]
struct Queue {
    tasks: Vec<Task>,
    held: Vec<Tensor>,
    held_bytes: usize,
}

pub(super) struct Batch {
    stream: Arc<CudaStream>,
    launcher: Launcher,
    slots: Vec<SlotChunk>,
    slots_used: usize,
    staging: Vec<StagingChunk>,
    tables: Vec<TableChunk>,
    queue: Queue,
    /// The tensors already read in this batch, by the slot of their statistics and the gather
    /// read of their values (with a digest or not): a tensor read twice (a layer's output is the
    /// next layer's input) is read once.
    seen_stats: IdMap<TensorId, usize>,
    seen_gathers: IdMap<(TensorId, bool), usize>,
    /// The batch's gather reads, and once it is read back, their summaries (taken by the reads
    /// as they finish).
    gathers: Vec<GatherRead>,
    summaries: Vec<Option<Result<TensorSummary, TensorError>>>,
    /// Which batch this is: a read remembers its number, and is refused once its batch is gone.
    number: u64,
    /// Whether this batch was read back (the next start begins a new one).
    read_back: bool,
    /// Why a flush of this batch failed: its reads get this error.
    failed: Option<String>,
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
            tables: Vec::new(),
            queue: Queue::default(),
            seen_stats: IdMap::default(),
            seen_gathers: IdMap::default(),
            gathers: Vec::new(),
            summaries: Vec::new(),
            number: 0,
            read_back: false,
            failed: None,
        })
    }

    /// The batch reads started now join; a new one if the last was read back.
    fn current(&mut self) -> u64 {
        if self.read_back {
            self.read_back = false;
            self.failed = None;
            self.number += 1;
            self.slots_used = 0;
            for chunk in &mut self.slots {
                chunk.dirty = true;
            }
            for chunk in &mut self.staging {
                chunk.used = 0;
                chunk.copied = 0;
            }
            for chunk in &mut self.tables {
                chunk.used = 0;
            }
            self.seen_stats.clear();
            self.seen_gathers.clear();
            self.gathers.clear();
            self.summaries.clear();
        }
        self.number
    }

    /// Queues the statistics of `tensor` (whose storage is `values`, seen through `layout`);
    /// `None` when the kernel does not read its dtype. Returns the batch's number and the slot.
    pub(super) fn start_stats(
        &mut self,
        tensor: &Tensor,
        values: &CudaStorageSlice,
        layout: &DeviceLayout,
    ) -> Option<Result<(u64, usize), TensorError>> {
        let number = self.current();
        if let Some(&at) = self.seen_stats.get(&tensor.id()) {
            return Some(Ok((number, at)));
        }
        let storage = StorageAddress::of(values, &self.stream)?;
        let at = self.slots_used;
        let (chunk, index) = (at / SLOTS_PER_CHUNK, at % SLOTS_PER_CHUNK);
        if let Err(error) = self.ready_slot_chunk(chunk) {
            return Some(Err(error));
        }
        let slot = self.slots[chunk].address + (index * SLOT_WORDS * size_of::<u64>()) as u64;
        let task = Task::new(TaskKind::Stats, &storage, layout, slot);
        self.slots_used += 1;
        self.push(task, tensor, layout.count * storage.width);
        self.seen_stats.insert(tensor.id(), at);
        Some(Ok((number, at)))
    }

    /// Queues the gathering of `tensor`'s values (storage `values`, seen through `layout`), in
    /// row-major order and their own dtype, to be summarised on the host (with a digest if
    /// `digest`). Returns the batch's number and the read's index among its gathers.
    pub(super) fn start_gather(
        &mut self,
        tensor: &Tensor,
        values: &CudaStorageSlice,
        layout: &DeviceLayout,
        digest: bool,
    ) -> Result<(u64, usize), TensorError> {
        let number = self.current();
        if let Some(&index) = self.seen_gathers.get(&(tensor.id(), digest)) {
            self.gathers[index].readers += 1;
            return Ok((number, index));
        }
        let staged = self.queue_gather(tensor, values, layout)?;
        self.gathers.push(GatherRead {
            staged,
            dtype: tensor.dtype(),
            shape: tensor.dims().to_vec(),
            digest,
            readers: 1,
        });
        let index = self.gathers.len() - 1;
        self.seen_gathers.insert((tensor.id(), digest), index);
        Ok((number, index))
    }

    fn queue_gather(
        &mut self,
        tensor: &Tensor,
        values: &CudaStorageSlice,
        layout: &DeviceLayout,
    ) -> Result<Staged, TensorError> {
        let storage = StorageAddress::of(values, &self.stream).ok_or_else(|| {
            TensorError::Backend("the read kernel does not take this dtype".into())
        })?;
        let len = layout.count * storage.width;
        let (chunk, start) = self.staging_range(len)?;
        let target = self.staging[chunk].address + start as u64;
        self.push(
            Task::new(TaskKind::Gather, &storage, layout, target),
            tensor,
            len,
        );
        Ok(Staged { chunk, start, len })
    }

    /// Adds a task to the queue, holding its tensor; flushes a full queue.
    fn push(&mut self, task: Task, tensor: &Tensor, bytes: usize) {
        self.queue.tasks.push(task);
        self.queue.held.push(tensor.clone());
        self.queue.held_bytes += bytes;
        if self.queue.tasks.len() >= TASKS_PER_FLUSH || self.queue.held_bytes >= FLUSH_HELD_BYTES {
            self.flush();
        }
    }

    /// Makes chunk `chunk` of slots exist and hold zeros.
    fn ready_slot_chunk(&mut self, chunk: usize) -> Result<(), TensorError> {
        if chunk == self.slots.len() {
            let device = self
                .stream
                .alloc_zeros::<u64>(SLOTS_PER_CHUNK * SLOT_WORDS)
                .map_err(backend)?;
            let host = Pinned::alloc(&self.stream, SLOTS_PER_CHUNK * SLOT_WORDS)?;
            let address = device_address(&device, &self.stream);
            self.slots.push(SlotChunk {
                device,
                address,
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

    /// `len` bytes of staging (device and host): the chunk and the start in it.
    fn staging_range(&mut self, len: usize) -> Result<(usize, usize), TensorError> {
        let aligned = |used: usize| used.next_multiple_of(STAGING_ALIGN);
        if let Some(chunk) = self
            .staging
            .iter()
            .position(|c| c.host.len() >= aligned(c.used) + len)
        {
            let staging = &mut self.staging[chunk];
            let start = aligned(staging.used);
            staging.used = start + len;
            return Ok((chunk, start));
        }
        let last = self.staging.last().map_or(0, |c| c.host.len());
        let size = len.max(2 * last).max(MIN_STAGING_BYTES);
        // SAFETY: the device bytes are only read (by the copy to the host) after the kernel
        // that gathers into them; the host bytes only after that copy has completed (the
        // readback waits for the stream).
        let device = unsafe { self.stream.alloc::<u8>(size) }.map_err(backend)?;
        let host = Pinned::alloc(&self.stream, size)?;
        let address = device_address(&device, &self.stream);
        self.staging.push(StagingChunk {
            _device: device,
            address,
            host,
            used: len,
            copied: 0,
        });
        Ok((self.staging.len() - 1, 0))
    }

    /// Runs the queued tasks: their table to the device, one launch, the staged values to the
    /// host; then lets the held tensors go. A failure is kept for the batch's reads.
    fn flush(&mut self) {
        if self.queue.tasks.is_empty() {
            return;
        }
        let outcome = self.run_queue();
        self.queue.tasks.clear();
        self.queue.held.clear();
        self.queue.held_bytes = 0;
        if let Err(error) = outcome {
            self.failed.get_or_insert(error.to_string());
        }
    }

    fn run_queue(&mut self) -> Result<(), TensorError> {
        self.stream.context().bind_to_thread().map_err(backend)?;
        let launcher = &self.launcher;
        let blocks = deal_blocks(&mut self.queue.tasks, |count| launcher.blocks_for(count));
        let count = self.queue.tasks.len();
        let table = self.table_for(count)?;
        let chunk = &mut self.tables[table];
        let start = chunk.used;
        let host = chunk.host.as_mut_slice();
        host[start..start + count].copy_from_slice(&self.queue.tasks);
        let device = chunk.address + (start * size_of::<Task>()) as u64;
        // SAFETY: `count` tasks from pinned host memory that no later flush of this batch writes
        // (tables are filled in order), to as many tasks' room in the chunk's device table.
        unsafe {
            result::memcpy_htod_async(device, &host[start..start + count], self.stream.cu_stream())
        }
        .map_err(backend)?;
        chunk.used += count;
        let count = u32::try_from(count).map_err(backend)?;
        self.launcher.launch(device, count, blocks)?;
        for staging in &mut self.staging {
            if staging.copied == staging.used {
                continue;
            }
            let (from, to) = (staging.copied, staging.used);
            let host = staging.host.as_mut_slice();
            // SAFETY: the staged bytes `from..to` (gathered by the launch above, queued before
            // this copy on the same stream) into the same range of their pinned host twin, read
            // only after the readback has waited for the stream.
            unsafe {
                result::memcpy_dtoh_async(
                    &mut host[from..to],
                    staging.address + from as u64,
                    self.stream.cu_stream(),
                )
            }
            .map_err(backend)?;
            staging.copied = to;
        }
        Ok(())
    }

    /// A table chunk with room for `count` tasks (at most `TASKS_PER_FLUSH`).
    fn table_for(&mut self, count: usize) -> Result<usize, TensorError> {
        if let Some(chunk) = self
            .tables
            .iter()
            .position(|c| c.host.len() - c.used >= count)
        {
            return Ok(chunk);
        }
        let size = count.max(TASKS_PER_FLUSH);
        let host = Pinned::alloc(&self.stream, size)?;
        // SAFETY: the device table is read by the kernel only after the copy of the tasks into
        // it, on the same stream.
        let device = unsafe { self.stream.alloc::<Task>(size) }.map_err(backend)?;
        let address = device_address(&device, &self.stream);
        self.tables.push(TableChunk {
            host,
            _device: device,
            address,
            used: 0,
        });
        Ok(self.tables.len() - 1)
    }

    /// Runs and reads batch `number` back, unless that was done: the first read of a batch to
    /// finish does it.
    fn ready(&mut self, number: u64) -> Result<(), TensorError> {
        if number != self.number {
            return Err(TensorError::Backend(
                "a device read was finished after the next forward pass had begun".to_owned(),
            ));
        }
        if !self.read_back {
            self.flush();
            self.read_back()?;
            if self.failed.is_none() {
                self.summarise_gathers();
            }
        }
        match &self.failed {
            Some(error) => Err(TensorError::Backend(error.clone())),
            None => Ok(()),
        }
    }

    /// The statistics slot `at` of batch `number`.
    pub(super) fn slot(
        &mut self,
        number: u64,
        at: usize,
    ) -> Result<[u64; SLOT_WORDS], TensorError> {
        self.ready(number)?;
        let (chunk, index) = (at / SLOTS_PER_CHUNK, at % SLOTS_PER_CHUNK);
        let host = self.slots[chunk].host.as_slice();
        let mut slot = [0u64; SLOT_WORDS];
        slot.copy_from_slice(&host[index * SLOT_WORDS..(index + 1) * SLOT_WORDS]);
        Ok(slot)
    }

    /// The summary of gather read `index` of batch `number`: a copy for each of its readers
    /// but the last, which takes it.
    pub(super) fn gathered(
        &mut self,
        number: u64,
        index: usize,
    ) -> Result<TensorSummary, TensorError> {
        self.ready(number)?;
        let finished_twice = || TensorError::Backend("a gathered read was finished twice".into());
        let (Some(read), Some(summary)) =
            (self.gathers.get_mut(index), self.summaries.get_mut(index))
        else {
            return Err(finished_twice());
        };
        read.readers = read.readers.saturating_sub(1);
        if read.readers > 0 {
            summary.clone().ok_or_else(finished_twice)?
        } else {
            summary.take().ok_or_else(finished_twice)?
        }
    }

    /// Summarises every gather read of the batch (read back), on a few threads if they are many.
    fn summarise_gathers(&mut self) {
        let staging = &self.staging;
        let reads: Vec<Gathered<'_>> = self
            .gathers
            .iter()
            .map(|read| {
                let Staged { chunk, start, len } = read.staged;
                Gathered {
                    bytes: &staging[chunk].host.as_slice()[start..start + len],
                    dtype: read.dtype,
                    shape: &read.shape,
                    digest: read.digest,
                }
            })
            .collect();
        self.summaries = values::summarise(&reads).into_iter().map(Some).collect();
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
            let host = chunk.host.as_mut_slice();
            // SAFETY: `words` u64s from the start of the chunk's device slots into as many of
            // its pinned host slots; the stream is waited for below before they are read.
            unsafe {
                result::memcpy_dtoh_async(
                    &mut host[..words],
                    chunk.address,
                    self.stream.cu_stream(),
                )
            }
            .map_err(backend)?;
        }
        self.stream.synchronize().map_err(backend)?;
        self.read_back = true;
        Ok(())
    }
}

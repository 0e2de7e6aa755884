//! The trace file: a header line, then one event per line (newline-delimited JSON), and the
//! safetensors files that hold captured tensors beside it. `docs/trace-format.md` specifies it;
//! this module names files, reads traces back and writes captures. Writing events is the file
//! sink's ([`TraceFileSink`](crate::TraceFileSink)).

mod atomic;
mod capture;
mod naming;
mod reader;

pub use atomic::write_atomically;
pub(crate) use capture::CaptureWriter;
pub use capture::{
    read_capture, read_f32_tensor, CaptureError, CaptureFiles, DEFAULT_CAPTURE_CHUNK_BYTES,
};
pub(crate) use naming::{claim_path, ranked};
pub use reader::{ReadError, TraceReader};

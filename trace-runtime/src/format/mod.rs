//! The trace file: a header line, then one event per line (newline-delimited JSON), and the
//! safetensors files that hold captured tensors beside it. `docs/trace-format.md` specifies it;
//! this module names files, reads traces back (golden files too, the compact traces that tests
//! keep) and writes captures. Writing events is the file
//! sink's ([`TraceFileSink`](crate::TraceFileSink)).

mod atomic;
mod capture;
mod golden;
mod naming;
mod reader;

pub use atomic::write_atomically;
pub(crate) use capture::CaptureWriter;
pub use capture::{
    read_capture, read_f32_tensor, CaptureError, CaptureFiles, DEFAULT_CAPTURE_CHUNK_BYTES,
};
pub use golden::{machine, GoldenEncoder, GoldenHeader, GOLDEN_FORMAT_NAME, GOLDEN_VERSION};
pub(crate) use naming::{claim_path, ranked};
pub use reader::{ReadError, TraceReader};

//! Captured tensors: safetensors files beside the trace file, written whole one chunk at a time.
//!
//! A safetensors file starts with its header (every tensor's name, dtype, shape and offsets),
//! so a file cannot grow once written. Captured tensors are held in memory until a chunk's
//! worth is ready, then the chunk is written whole ([`write_atomically`]): a crash never leaves
//! a half-written chunk under a chunk's name, and the chunks already written stay.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::write_atomically;
use crate::summary::{canonical_bits, CaptureRef};

/// Default size of one capture chunk: 64 MiB of tensor data.
pub const DEFAULT_CAPTURE_CHUNK_BYTES: usize = 64 << 20;

/// A tensor waiting for its chunk to be written.
struct Pending {
    name: String,
    shape: Vec<usize>,
    values: Vec<f32>,
}

/// Writes captured tensors as `<trace stem>.tensors-NNNN.safetensors` beside the trace file.
pub(crate) struct CaptureWriter {
    dir: PathBuf,
    stem: String,
    chunk: usize,
    chunk_bytes: usize,
    pending: Vec<Pending>,
    pending_bytes: usize,
}

impl CaptureWriter {
    /// A writer for the captures of the trace file at `trace_path`.
    pub(crate) fn new(trace_path: &Path, chunk_bytes: usize) -> Self {
        let dir = trace_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let stem = trace_path
            .file_stem()
            .map_or_else(|| "trace".to_owned(), |s| s.to_string_lossy().into_owned());
        Self {
            dir,
            stem,
            chunk: 0,
            chunk_bytes: chunk_bytes.max(1),
            pending: Vec::new(),
            pending_bytes: 0,
        }
    }

    fn chunk_name(&self) -> String {
        format!("{}.tensors-{:04}.safetensors", self.stem, self.chunk)
    }

    /// Queues a tensor for the current chunk (writing the chunk first if this one would not
    /// fit) and says where it will be.
    pub(crate) fn add(
        &mut self,
        name: String,
        shape: Vec<usize>,
        values: Vec<f32>,
    ) -> io::Result<CaptureRef> {
        let bytes = values.len() * 4;
        if !self.pending.is_empty() && self.pending_bytes + bytes > self.chunk_bytes {
            self.flush()?;
        }
        let reference = CaptureRef {
            file: self.chunk_name(),
            tensor: name.clone(),
        };
        self.pending_bytes += bytes;
        self.pending.push(Pending {
            name,
            shape,
            values,
        });
        Ok(reference)
    }

    /// Writes the pending tensors as one chunk.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(self.chunk_name());
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        self.chunk += 1;
        write_atomically(&path, |out| write_safetensors(out, &pending))
    }

    /// Writes what is pending; called once at the session's end.
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        self.flush()
    }
}

impl Drop for CaptureWriter {
    fn drop(&mut self) {
        // The session's end flushes and reports errors; this only keeps tensors of a session
        // that never reached it.
        let _ = self.flush();
    }
}

fn write_safetensors(out: &mut impl Write, tensors: &[Pending]) -> io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for tensor in tensors {
        let end = offset + tensor.values.len() * 4;
        header.insert(
            tensor.name.clone(),
            serde_json::json!({ "dtype": "F32", "shape": tensor.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    header.insert(
        "__metadata__".to_owned(),
        serde_json::json!({ "format": "pt", "writer": concat!("model-trace ", env!("CARGO_PKG_VERSION")) }),
    );
    let mut text = serde_json::to_vec(&header).map_err(io::Error::other)?;
    // The data starts 8-byte aligned, as the format recommends.
    while (8 + text.len()) % 8 != 0 {
        text.push(b' ');
    }
    out.write_all(&(text.len() as u64).to_le_bytes())?;
    out.write_all(&text)?;
    for tensor in tensors {
        for &value in &tensor.values {
            out.write_all(&canonical_bits(value).to_le_bytes())?;
        }
    }
    Ok(())
}

/// A captured tensor that cannot be read back.
#[derive(Debug)]
#[non_exhaustive]
pub enum CaptureError {
    /// The file cannot be read.
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file is not a safetensors file this crate can read, or lacks the tensor.
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Self::Invalid { path, reason } => write!(f, "{}: {reason}", path.display()),
        }
    }
}

impl CaptureError {
    /// An I/O error of the file at `path`.
    fn io(path: &Path) -> impl Fn(io::Error) -> Self + Copy + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// What is wrong with the file at `path`.
    fn invalid(path: &Path) -> impl Fn(String) -> Self + Copy + '_ {
        move |reason| Self::Invalid {
            path: path.to_path_buf(),
            reason,
        }
    }
}

impl std::error::Error for CaptureError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::Invalid { .. } => None,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// Largest safetensors header accepted, as the reference implementation does (100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Reads the captured tensor `reference` of the trace file at `trace_path`: its shape and its
/// values (an `F32` safetensors entry, as this crate and the Python writer save them). To read
/// many, use a [`CaptureFiles`], which reads each file's header once.
pub fn read_capture(
    trace_path: &Path,
    reference: &CaptureRef,
) -> Result<(Vec<usize>, Vec<f32>), CaptureError> {
    CaptureFiles::default().read_capture(trace_path, reference)
}

/// Reads the `F32` tensor `name` of the safetensors file at `path` (`None`: the file's only
/// tensor): its shape and values.
pub fn read_f32_tensor(
    path: &Path,
    name: Option<&str>,
) -> Result<(Vec<usize>, Vec<f32>), CaptureError> {
    CaptureFiles::default().read_f32_tensor(path, name)
}

/// Reads captured tensors, keeping each safetensors file's index (its header: every tensor's
/// dtype, shape and offsets) after the first read from it. A capture file of a long run holds
/// thousands of tensors, and its header is parsed once instead of once a tensor.
#[derive(Debug, Default)]
pub struct CaptureFiles {
    indexes: HashMap<PathBuf, FileIndex>,
}

/// A safetensors file's header, parsed.
#[derive(Debug)]
struct FileIndex {
    /// Where the tensors' data begins in the file.
    data_start: u64,
    entries: HashMap<String, Entry>,
}

impl CaptureFiles {
    /// [`read_capture`], with the file's index kept.
    pub fn read_capture(
        &mut self,
        trace_path: &Path,
        reference: &CaptureRef,
    ) -> Result<(Vec<usize>, Vec<f32>), CaptureError> {
        let dir = trace_path.parent().unwrap_or_else(|| Path::new(""));
        self.read_f32_tensor(&dir.join(&reference.file), Some(&reference.tensor))
    }

    /// [`read_f32_tensor`], with the file's index kept.
    pub fn read_f32_tensor(
        &mut self,
        path: &Path,
        name: Option<&str>,
    ) -> Result<(Vec<usize>, Vec<f32>), CaptureError> {
        let (io, invalid) = (CaptureError::io(path), CaptureError::invalid(path));
        let mut file = File::open(path).map_err(io)?;
        let index = match self.indexes.entry(path.to_path_buf()) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(new) => {
                new.insert(FileIndex::read(&mut file, path)?)
            }
        };
        let tensor = match name {
            Some(name) => name,
            None if index.entries.len() == 1 => {
                index.entries.keys().next().map_or("", String::as_str)
            }
            None => {
                let mut names: Vec<&String> = index.entries.keys().collect();
                names.sort();
                return Err(invalid(format!(
                    "{} tensors ({names:?}): name the one to read",
                    names.len()
                )));
            }
        };
        let entry = index
            .entries
            .get(tensor)
            .ok_or_else(|| invalid(format!("no tensor named {tensor:?}")))?;
        if entry.dtype != "F32" {
            return Err(invalid(format!(
                "tensor {tensor:?} is {}, not F32",
                entry.dtype
            )));
        }
        let [start, end] = entry.data_offsets;
        let count: usize = entry.shape.iter().product();
        if end < start || end - start != count * 4 {
            return Err(invalid(format!(
                "tensor {tensor:?}: offsets {start}..{end} do not hold shape {:?}",
                entry.shape
            )));
        }
        file.seek(SeekFrom::Start(index.data_start + start as u64))
            .map_err(io)?;
        let mut bytes = vec![0u8; end - start];
        file.read_exact(&mut bytes).map_err(io)?;
        let values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((entry.shape.clone(), values))
    }
}

impl FileIndex {
    /// The header of the safetensors file `file` (at `path`, for errors).
    fn read(file: &mut File, path: &Path) -> Result<Self, CaptureError> {
        let (io, invalid) = (CaptureError::io(path), CaptureError::invalid(path));
        let mut size = [0u8; 8];
        file.read_exact(&mut size).map_err(io)?;
        let header_len = u64::from_le_bytes(size);
        if header_len > MAX_HEADER_BYTES {
            return Err(invalid(format!(
                "header of {header_len} bytes is too large"
            )));
        }
        let mut header =
            vec![0u8; usize::try_from(header_len).map_err(|e| invalid(e.to_string()))?];
        file.read_exact(&mut header).map_err(io)?;
        let mut raw: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|e| invalid(format!("header: {e}")))?;
        raw.remove("__metadata__");
        let entries = raw
            .into_iter()
            .map(
                |(name, value)| match serde_json::from_value::<Entry>(value) {
                    Ok(entry) => Ok((name, entry)),
                    Err(e) => Err(invalid(format!("tensor {name:?}: {e}"))),
                },
            )
            .collect::<Result<_, _>>()?;
        Ok(Self {
            data_start: 8 + header_len,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_written_whole_and_read_back_exactly() {
        let dir = std::env::temp_dir().join(format!("capture-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("run.ndjson");
        let mut writer = CaptureWriter::new(&trace, 40);
        let negative_nan = f32::from_bits(0xffc0_0001);
        let a: Vec<f32> = vec![1.0, f32::NAN, -0.0, f32::INFINITY, negative_nan, 6.0];
        let b: Vec<f32> = (0..8).map(|i| i as f32 * 0.25).collect();
        let ra = writer
            .add("p0.l0.input.s1".into(), vec![2, 3], a.clone())
            .unwrap();
        assert_eq!(ra.file, "run.tensors-0000.safetensors");
        // nothing on disk until the chunk is full
        assert!(!dir.join(&ra.file).exists());
        let rb = writer
            .add("p0.l0.output.s2".into(), vec![8], b.clone())
            .unwrap();
        assert_eq!(
            rb.file, "run.tensors-0001.safetensors",
            "b does not fit in chunk 0"
        );
        assert!(dir.join(&ra.file).exists());
        writer.finish().unwrap();
        let (shape, values) = read_capture(&trace, &ra).unwrap();
        assert_eq!(shape, [2, 3]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // Every NaN is saved as the canonical one.
        let canonical = [1.0, f32::NAN, -0.0, f32::INFINITY, f32::NAN, 6.0];
        assert_eq!(bits(&values), bits(&canonical));
        assert_eq!(read_capture(&trace, &rb).unwrap().1, b);
        let missing = CaptureRef {
            file: rb.file.clone(),
            tensor: "nope".into(),
        };
        assert!(read_capture(&trace, &missing)
            .unwrap_err()
            .to_string()
            .contains("no tensor named"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn capture_files_read_many_tensors_of_one_file_from_its_index() {
        let dir = std::env::temp_dir().join(format!("capture-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("run.ndjson");
        let mut writer = CaptureWriter::new(&trace, DEFAULT_CAPTURE_CHUNK_BYTES);
        let tensors: Vec<(CaptureRef, Vec<f32>)> = (0..5)
            .map(|i| {
                let values: Vec<f32> = (0..3 + i).map(|j| (i * 10 + j) as f32).collect();
                let name = format!("p0.l{i}.output.s{i}");
                let shape = vec![values.len()];
                (writer.add(name, shape, values.clone()).unwrap(), values)
            })
            .collect();
        writer.finish().unwrap();
        let mut files = CaptureFiles::default();
        // Out of the order written, each twice: the same values as a fresh read gives.
        for (reference, values) in tensors.iter().rev().chain(&tensors) {
            assert_eq!(reference.file, "run.tensors-0000.safetensors");
            let (shape, read) = files.read_capture(&trace, reference).unwrap();
            assert_eq!((shape, &read), (vec![values.len()], values));
            assert_eq!(read_capture(&trace, reference).unwrap().1, read);
        }
        assert_eq!(files.indexes.len(), 1);
        let only = files.read_f32_tensor(&dir.join(&tensors[0].0.file), None);
        assert!(only.unwrap_err().to_string().contains("5 tensors"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

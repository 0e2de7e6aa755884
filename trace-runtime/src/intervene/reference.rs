//! A reference run's captured tensors, found by where they were seen: what `replace(FILE)`
//! and isolation feed the program.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::analysis::compare::{full_name, split_full_name, NameMap};
use crate::format::{CaptureFiles, TraceReader};
use crate::record::Event;
use crate::summary::CaptureRef;

/// The captured tensors of a trace file (Rust- or Python-written), by (pass, layer, stage).
///
/// Captures are matched by where the tensor was seen, through the layer events' `capture`
/// pointers, never by the tensor's name inside the safetensors file (which differs between
/// writers). A trace that the Python writer recorded with its modules' names
/// (`names="modules"`) has its stages renamed into the stage vocabulary with the preset of its
/// architecture, as `model-trace diff --map` does.
pub struct ReferenceCaptures {
    path: PathBuf,
    /// The reference's pass every replacement comes from; `None`: the pass of the same number.
    pass: Option<usize>,
    captures: HashMap<(usize, usize, String), CaptureRef>,
    /// The capture files read so far (each header parsed once: isolation reads one tensor a
    /// layer call).
    files: Mutex<CaptureFiles>,
}

impl fmt::Debug for ReferenceCaptures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReferenceCaptures")
            .field("path", &self.path)
            .field("pass", &self.pass)
            .field("captures", &self.captures.len())
            .finish()
    }
}

impl ReferenceCaptures {
    /// Reads the layer events of the trace at `path` and keeps where each captured tensor is.
    /// `Err`: the file cannot be read, or it holds no captured tensor (it was written without
    /// `MODEL_TRACE_CAPTURE` / `capture=`), which is said with how to write one.
    pub fn open(path: &Path) -> Result<Self, String> {
        let mut reader = TraceReader::open(path).map_err(|e| e.to_string())?;
        let extra = &reader.header().metadata.extra;
        let map = match (extra.get("names"), extra.get("architecture")) {
            (Some(names), Some(architecture)) if names == "modules" => {
                NameMap::preset(architecture).unwrap_or_default()
            }
            _ => NameMap::identity(),
        };
        let mut captures = HashMap::new();
        for event in &mut reader {
            let event = match event {
                Ok(event) => event,
                Err(crate::format::ReadError::Truncated { .. }) => break,
                Err(error) => return Err(error.to_string()),
            };
            let Event::Layer(layer) = event else {
                continue;
            };
            for stage in layer.stages {
                let Some(capture) = stage.tensor.capture else {
                    continue;
                };
                let renamed = map.rename(&full_name(layer.layer, &stage.name));
                let (index, name) = split_full_name(&renamed)
                    .map_or((layer.layer, stage.name.to_string()), |(i, n)| {
                        (i, n.to_owned())
                    });
                captures.entry((layer.pass, index, name)).or_insert(capture);
            }
        }
        if captures.is_empty() {
            return Err(format!(
                "{} holds no captured layer tensors to replay: record the reference with \
                 captures (MODEL_TRACE_CAPTURE=layer:* for a Rust program, \
                 model_trace.torch.trace(..., capture=\"layer:*\") in Python)",
                path.display()
            ));
        }
        Ok(Self {
            path: path.to_owned(),
            pass: None,
            captures,
            files: Mutex::default(),
        })
    }

    /// Every replacement from the reference's pass `pass`, whatever pass the program is in
    /// (patching one clean run into many corrupted ones). `Err`: that pass captured nothing.
    pub fn from_pass(mut self, pass: usize) -> Result<Self, String> {
        if !self.captures.keys().any(|&(p, _, _)| p == pass) {
            return Err(format!(
                "{} captured nothing in pass {pass}",
                self.path.display()
            ));
        }
        self.pass = Some(pass);
        Ok(self)
    }

    /// The trace file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fixed pass of [`from_pass`](Self::from_pass), if any.
    pub fn pass(&self) -> Option<usize> {
        self.pass
    }

    /// The values of the tensor `stage` that the reference captured in `pass` at `layer`, and
    /// where they came from (`FILE p0.l3.input`). `Err`: there is none, or it cannot be read.
    pub(crate) fn values(
        &self,
        pass: Option<usize>,
        layer: Option<usize>,
        stage: &str,
    ) -> Result<(Vec<f32>, String), String> {
        let (Some(pass), Some(layer)) = (self.pass.or(pass), layer) else {
            return Err("a replayed tensor needs a pass and a layer".to_owned());
        };
        let source = format!("{} p{pass}.l{layer}.{stage}", self.path.display());
        // Without the layer, so that a pass the reference did not capture is one error, not
        // one a layer.
        let capture = self
            .captures
            .get(&(pass, layer, stage.to_owned()))
            .ok_or_else(|| {
                format!(
                    "{} has no captured `{stage}` of pass {pass} for this layer (record the \
                     reference with those tensors captured)",
                    self.path.display()
                )
            })?;
        let mut files = self
            .files
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (_, values) = files
            .read_capture(&self.path, capture)
            .map_err(|e| e.to_string())?;
        Ok((values, source))
    }
}

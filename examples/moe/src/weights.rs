//! The model's weights: `model.safetensors` as transformers' `save_pretrained` writes it
//! (transformers' names, one tensor per expert and projection), every tensor F32, read onto the
//! CPU.

use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The tensors of one safetensors file, by name.
pub struct Weights {
    path: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    /// Reads `dir/model.safetensors`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("model.safetensors");
        if !path.is_file() {
            return Err(Error::Weights(format!(
                "{} not found (the model directory holds config.json and model.safetensors, as \
                 transformers' save_pretrained writes them)",
                path.display()
            )));
        }
        let tensors = candle_core::safetensors::load(&path, &Device::Cpu)
            .map_err(|e| Error::Weights(format!("{}: {e}", path.display())))?;
        Ok(Self { path, tensors })
    }

    /// The tensor `name`, which must have `shape` and be F32.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let tensor = self.tensors.get(name).ok_or_else(|| {
            Error::Weights(format!("{} has no tensor {name}", self.path.display()))
        })?;
        if tensor.dims() != shape {
            return Err(Error::Weights(format!(
                "{name} has shape {:?}, expected {shape:?}",
                tensor.dims()
            )));
        }
        if tensor.dtype() != DType::F32 {
            return Err(Error::Weights(format!(
                "{name} is {:?}: this port reads F32 weights",
                tensor.dtype()
            )));
        }
        Ok(tensor.clone())
    }

    /// Whether the file has a tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

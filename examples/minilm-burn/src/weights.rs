//! The safetensors file of all-MiniLM-L6-v2 read into burn tensors (f32, on the model's device).

use std::collections::HashMap;
use std::path::Path;

use burn_tensor::{DType, Device, Tensor, TensorData};
use safetensors::SafeTensors;

/// Why the weights could not be loaded.
#[derive(Debug)]
pub struct WeightsError(pub String);

impl std::fmt::Display for WeightsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WeightsError {}

/// The file's f32 tensors by name, as burn tensors on `device`, taken out one by one by the
/// model; the names of the others (the file's `position_ids` buffer is i64), which the model
/// does not read.
pub struct Weights {
    device: Device,
    tensors: HashMap<String, TensorData>,
    not_f32: HashMap<String, safetensors::Dtype>,
}

impl Weights {
    /// Reads `path`.
    pub fn read(path: &Path, device: &Device) -> Result<Self, WeightsError> {
        let bytes = std::fs::read(path)
            .map_err(|e| WeightsError(format!("cannot read {}: {e}", path.display())))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| WeightsError(format!("{}: {e}", path.display())))?;
        let mut tensors = HashMap::new();
        let mut not_f32 = HashMap::new();
        for (name, view) in file.tensors() {
            if view.dtype() != safetensors::Dtype::F32 {
                not_f32.insert(name, view.dtype());
                continue;
            }
            let data =
                TensorData::from_bytes_vec(view.data().to_vec(), view.shape().to_vec(), DType::F32);
            tensors.insert(name, data);
        }
        Ok(Weights {
            device: device.clone(),
            tensors,
            not_f32,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The tensor `name` of rank `D`, moved out of the file.
    pub fn take<const D: usize>(&mut self, name: &str) -> Result<Tensor<D>, WeightsError> {
        let data = self
            .tensors
            .remove(name)
            .ok_or_else(|| match self.not_f32.get(name) {
                Some(dtype) => WeightsError(format!("{name} is {dtype:?}; this model reads f32")),
                None => WeightsError(format!("the weights have no tensor {name}")),
            })?;
        if data.rank() != D {
            return Err(WeightsError(format!(
                "{name} has shape {:?}, not rank {D}",
                data.shape()
            )));
        }
        Ok(Tensor::from_data(data, &self.device))
    }
}

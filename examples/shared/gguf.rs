//! Typed access to a GGUF file: metadata with errors that name the key, tensors by name. Shared by
//! the GGUF examples (`#[path]`); each has an `error` module with `Error::{Weights, Gguf}`.

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

pub struct Gguf {
    pub path: PathBuf,
    pub content: Content,
    reader: BufReader<File>,
}

impl Gguf {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path)
            .map_err(|e| Error::Weights(format!("cannot open {}: {e}", path.display())))?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader)
            .map_err(|e| Error::Gguf(format!("{} is not a readable GGUF: {e}", path.display())))?;
        Ok(Self {
            path: path.to_owned(),
            content,
            reader,
        })
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    pub fn qtensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(Error::Gguf(format!("no tensor {name}")));
        }
        Ok(self.content.tensor(&mut self.reader, name, device)?)
    }

    /// Every tensor's name, ggml type and shape (ggml order: innermost dimension last here, as
    /// candle reports it), sorted by name.
    pub fn tensor_types(&self) -> Vec<(String, GgmlDType, Vec<usize>)> {
        let mut all: Vec<_> = self
            .content
            .tensor_infos
            .iter()
            .map(|(name, info)| (name.clone(), info.ggml_dtype, info.shape.dims().to_vec()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    pub fn value(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| Error::Gguf(format!("missing metadata key {key}")))
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.value(key)?;
        as_i64(v)
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| Error::Gguf(format!("{key} is {v:?}, not a non-negative integer")))
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        match *self.value(key)? {
            Value::F32(x) => Ok(x),
            Value::F64(x) => Ok(x as f32),
            ref other => Err(Error::Gguf(format!("{key} is {other:?}, not a float"))),
        }
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            other => Err(Error::Gguf(format!("{key} is {other:?}, not a string"))),
        }
    }

    pub fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.value(key)? {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(Error::Gguf(format!("{key} holds {other:?}, not a string"))),
                })
                .collect(),
            other => Err(Error::Gguf(format!("{key} is {other:?}, not an array"))),
        }
    }

    pub fn floats(&self, key: &str) -> Result<Vec<f32>> {
        match self.value(key)? {
            Value::Array(items) => items
                .iter()
                .map(|item| match *item {
                    Value::F32(x) => Ok(x),
                    Value::F64(x) => Ok(x as f32),
                    ref other => Err(Error::Gguf(format!("{key} holds {other:?}, not a float"))),
                })
                .collect(),
            other => Err(Error::Gguf(format!("{key} is {other:?}, not an array"))),
        }
    }

    pub fn bool(&self, key: &str) -> Result<bool> {
        match *self.value(key)? {
            Value::Bool(x) => Ok(x),
            ref other => Err(Error::Gguf(format!("{key} is {other:?}, not a boolean"))),
        }
    }

    pub fn integers(&self, key: &str) -> Result<Vec<i64>> {
        match self.value(key)? {
            Value::Array(items) => items
                .iter()
                .map(|item| {
                    as_i64(item)
                        .ok_or_else(|| Error::Gguf(format!("{key} holds {item:?}, not an integer")))
                })
                .collect(),
            other => Err(Error::Gguf(format!("{key} is {other:?}, not an array"))),
        }
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::I8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::I16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::I32(x) => Some(x.into()),
        Value::U64(x) => i64::try_from(x).ok(),
        Value::I64(x) => Some(x),
        _ => None,
    }
}

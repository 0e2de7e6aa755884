//! One error type for everything a user can hit (missing weights, a GGUF that is not the model we
//! expect, tokenizer failures) so `main` can print one message and exit non-zero.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// The weights are not on disk and could not be fetched; the message says what to run by hand.
    Weights(String),
    /// The GGUF lacks a key or tensor this implementation needs, or has an unexpected value.
    Gguf(String),
    /// The tokenizer could not be built or could not encode/decode.
    Tokenizer(String),
    Candle(candle_core::Error),
    Io(std::io::Error),
    /// The tracing session could not start (a trace file that cannot be created, a bad filter).
    Trace(model_trace::SessionError),
    /// The run's trace file could not be read back.
    ReadTrace(model_trace::ReadError),
    /// The model run as a pipeline failed: a stage's computation, session or thread.
    Pipeline(crate::pipeline::PipelineError),
    /// An intervention (causal tracing's patches) could not be made or did not apply.
    Intervention(String),
    /// A prompt file could not be read.
    PromptFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// `len` tokens cannot be cut into passes as `split` says (a prefill longer than the
    /// tokens, chunks of none, no tokens).
    Split {
        split: crate::passes::Split,
        len: usize,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Weights(msg) => write!(f, "{msg}"),
            Error::Gguf(msg) => write!(f, "gguf: {msg}"),
            Error::Tokenizer(msg) => write!(f, "tokenizer: {msg}"),
            Error::Candle(err) => write!(f, "candle: {err}"),
            Error::Io(err) => write!(f, "io: {err}"),
            Error::Trace(err) => write!(f, "trace: {err}"),
            Error::ReadTrace(err) => write!(f, "trace file: {err}"),
            Error::Pipeline(err) => write!(f, "pipeline: {err}"),
            Error::Intervention(msg) => write!(f, "intervention: {msg}"),
            Error::PromptFile { path, source } => {
                write!(f, "prompt file {}: {source}", path.display())
            }
            Error::Split { split, len } => {
                write!(f, "{len} tokens cannot run as {split}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Candle(err) => Some(err),
            Error::Io(err) => Some(err),
            Error::Trace(err) => Some(err),
            Error::ReadTrace(err) => Some(err),
            Error::Pipeline(err) => Some(err),
            Error::PromptFile { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<candle_core::Error> for Error {
    fn from(err: candle_core::Error) -> Self {
        Error::Candle(err)
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Error::Io(err)
    }
}

impl From<model_trace::SessionError> for Error {
    fn from(err: model_trace::SessionError) -> Self {
        Error::Trace(err)
    }
}

impl From<model_trace::ReadError> for Error {
    fn from(err: model_trace::ReadError) -> Self {
        Error::ReadTrace(err)
    }
}

impl From<crate::pipeline::PipelineError> for Error {
    fn from(err: crate::pipeline::PipelineError) -> Self {
        Error::Pipeline(err)
    }
}

//! One error type for everything a user can hit (a model directory that cannot be read, a
//! config this port does not run, a missing or misshapen weight, token ids that cannot run), so
//! that `main` prints one message and exits non-zero.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// `config.json` is missing, unreadable, or asks for something this port does not run.
    Config(String),
    /// `model.safetensors` is missing, or lacks a tensor, or has one of another shape.
    Weights(String),
    /// Token ids that cannot run as asked (empty, outside the vocabulary, past the context).
    Tokens(String),
    Candle(candle_core::Error),
    /// The tracing session could not start (a trace file that cannot be created, a bad filter).
    Trace(model_trace::SessionError),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(msg) => write!(f, "config: {msg}"),
            Error::Weights(msg) => write!(f, "weights: {msg}"),
            Error::Tokens(msg) => write!(f, "tokens: {msg}"),
            Error::Candle(err) => write!(f, "candle: {err}"),
            Error::Trace(err) => write!(f, "trace: {err}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Candle(err) => Some(err),
            Error::Trace(err) => Some(err),
            _ => None,
        }
    }
}

impl From<candle_core::Error> for Error {
    fn from(err: candle_core::Error) -> Self {
        Error::Candle(err)
    }
}

impl From<model_trace::SessionError> for Error {
    fn from(err: model_trace::SessionError) -> Self {
        Error::Trace(err)
    }
}

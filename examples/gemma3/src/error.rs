//! One error type for everything a user can hit (missing weights, a GGUF that is not Gemma 3,
//! tokenizer failures, a split or a batch that cannot run), so that `main` prints one message
//! and exits non-zero.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// The weights are not on disk and could not be fetched; the message says what to run by hand.
    Weights(String),
    /// The GGUF lacks a key or tensor this implementation needs, or has an unexpected value.
    Gguf(String),
    /// The tokenizer could not be built or could not encode/decode.
    Tokenizer(String),
    /// Token ids that cannot be run as asked: a split that does not fit the prompt, a batch with
    /// an empty prompt.
    Passes(String),
    Candle(candle_core::Error),
    /// The tracing session could not start (a trace file that cannot be created, a bad filter).
    Trace(model_trace::SessionError),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Weights(msg) => write!(f, "{msg}"),
            Error::Gguf(msg) => write!(f, "gguf: {msg}"),
            Error::Tokenizer(msg) => write!(f, "tokenizer: {msg}"),
            Error::Passes(msg) => write!(f, "{msg}"),
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

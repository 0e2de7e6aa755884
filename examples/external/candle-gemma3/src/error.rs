//! One error type for what a run can hit (weights not found, a GGUF the tokenizer cannot read,
//! prompts a batch cannot hold, candle's errors), so that `main` prints one message.

use std::fmt;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// The weights are not on disk; the message says how to fetch them.
    Weights(String),
    /// The GGUF lacks a key the tokenizer needs, or has an unexpected value.
    Gguf(String),
    /// The tokenizer could not be built or could not encode.
    Tokenizer(String),
    /// Token ids the model cannot run as asked (a split that does not fit, prompts of
    /// different lengths in a batch: the model has no padding mask).
    Input(String),
    /// An error of candle's: of the model, or of reading the GGUF.
    Candle(candle_core::Error),
    /// The tracing session could not start (a trace file that cannot be created).
    Trace(model_trace::SessionError),
    /// A file that cannot be written.
    Io(std::io::Error),
}

/// A result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Weights(msg) | Error::Input(msg) => write!(f, "{msg}"),
            Error::Gguf(msg) => write!(f, "gguf: {msg}"),
            Error::Tokenizer(msg) => write!(f, "tokenizer: {msg}"),
            // Without the backtrace candle attaches under RUST_BACKTRACE (`source` keeps it).
            Error::Candle(candle_core::Error::WithBacktrace { inner, .. }) => {
                write!(f, "candle: {inner}")
            }
            Error::Candle(err) => write!(f, "candle: {err}"),
            Error::Trace(err) => write!(f, "trace: {err}"),
            Error::Io(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Candle(err) => Some(err),
            Error::Trace(err) => Some(err),
            Error::Io(err) => Some(err),
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

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Error::Io(err)
    }
}

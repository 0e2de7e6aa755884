use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong before or around a forward pass; the tensor code itself returns
/// `candle_core::Result` so that its functions read like any candle model.
#[derive(Debug)]
pub enum Error {
    /// The weights are missing or could not be fetched; the message says what to run.
    Weights(String),
    /// `config.json` is unreadable or describes a model this implementation does not cover.
    Config(String),
    Tokenizer(String),
    Candle(candle_core::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Weights(message) => f.write_str(message),
            Error::Config(message) => write!(f, "model config: {message}"),
            Error::Tokenizer(message) => write!(f, "tokenizer: {message}"),
            Error::Candle(error) => write!(f, "candle: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Candle(error) => Some(error),
            _ => None,
        }
    }
}

impl From<candle_core::Error> for Error {
    fn from(error: candle_core::Error) -> Self {
        Error::Candle(error)
    }
}

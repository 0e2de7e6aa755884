//! all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder) written out by hand on candle, so that each
//! place a tracer wants to look at is a function or a binding of its own.

#[doc(hidden)]
pub mod bugs;
mod error;
pub mod model;
pub mod report;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
pub use model::{Config, Model};
pub use weights::ModelFiles;

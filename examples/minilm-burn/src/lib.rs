//! all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder) written in burn, annotated for model-trace
//! as a burn user would: the attributes on the forward methods, tensors taken by value.
//!
//! The weights, `config.json`, the tokenizer and the porting-bug switch are the candle port's
//! (`minilm`): both run the same model from the same files, so their traces line up with each
//! other and with transformers' `BertModel`.

pub mod device;
pub mod model;
pub mod weights;

pub use device::Backend;
pub use model::{l2_normalize, mean_pool, Model};

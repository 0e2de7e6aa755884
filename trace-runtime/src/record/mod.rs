//! The records: what tracing keeps of a run. Statistics of layers and their stages, sparse
//! attention rows, logit ranks, KV-cache steps, quantization errors and experts' routing, the events that carry
//! them from a session to its sinks, and the header that describes a session.

mod activation;
mod attention;
mod error_kind;
mod event;
mod header;
mod kv_cache;
mod logit;
mod precision;
mod quant;
mod quant_type;
mod router;
mod routing;
mod stage;

pub use activation::*;
pub use attention::*;
pub use error_kind::RecordErrorKind;
pub use event::*;
pub use header::*;
pub use kv_cache::*;
pub use logit::*;
pub use precision::*;
pub use quant::*;
pub use quant_type::QuantType;
pub use router::*;
pub use routing::{expert_load, RoutingRule};
pub use stage::Stage;

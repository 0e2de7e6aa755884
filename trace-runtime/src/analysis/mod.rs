//! Analyses over records: the anomaly rules of a forward pass, what a pass keeps to be judged
//! when it ends, what the attention heads do, and the comparison of two traces.

mod anomaly;
pub mod attention;
pub mod compare;
mod histogram;
mod pass;

pub use anomaly::find_anomalies;
pub use attention::{analyze_attention, AttentionAnalysis, AttentionAnalyzer, Specialization};
pub(crate) use pass::PassRecorder;

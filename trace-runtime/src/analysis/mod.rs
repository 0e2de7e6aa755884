//! Analyses over records: the anomaly rules of a forward pass, what a pass keeps to be judged
//! when it ends, what the attention heads do, the comparison of two traces, and the stage
//! check (whether a layer's stages obey the identities their names promise).

mod anomaly;
pub mod attention;
pub mod compare;
mod histogram;
mod pass;
pub mod stage_check;

pub use anomaly::find_anomalies;
pub use attention::{analyze_attention, AttentionAnalysis, AttentionAnalyzer, Specialization};
pub(crate) use pass::PassRecorder;

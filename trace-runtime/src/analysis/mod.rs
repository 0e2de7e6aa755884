//! Analyses over records: the anomaly rules of a forward pass, what a pass keeps to be judged
//! when it ends, and the comparison of two traces.

mod anomaly;
pub mod compare;
mod pass;

pub use anomaly::find_anomalies;
pub(crate) use pass::PassRecorder;

//! Analyses over records: the anomaly rules of a forward pass, and what a pass keeps to be
//! judged when it ends.

mod anomaly;
mod pass;

pub use anomaly::find_anomalies;
pub(crate) use pass::PassRecorder;

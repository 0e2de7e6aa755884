//! Which tensors get a digest besides their statistics: [`DigestPolicy`].

use serde::{Deserialize, Serialize};

/// When tensors get a fingerprint, a sketch and sample values (their digest), besides statistics.
///
/// Digests need every value on the host. A tensor on a device (a GPU) gets its statistics
/// reduced where it lives, but its digest costs a copy to the host and a synchronisation, so by
/// default it has none. Digests are only computed for sessions with a sink that keeps them (the
/// trace file does; the in-memory [`ModelTracer`](crate::ModelTracer) does not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DigestPolicy {
    /// Never: statistics only.
    Off,
    /// For tensors already on the host (every CPU tensor); device tensors get statistics only.
    #[default]
    HostOnly,
    /// For every tensor, copying device tensors to the host.
    Always,
}

//! The clock of a trace, and the numbering of the threads that record.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::record::ThreadInfo;

/// The zero of every `*_ns` time in this process, taken when the first session starts, with
/// the wall-clock time at that moment in ns since the Unix epoch.
fn epoch() -> &'static (Instant, u64) {
    static EPOCH: OnceLock<(Instant, u64)> = OnceLock::new();
    EPOCH.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        (Instant::now(), unix)
    })
}

/// Nanoseconds since the process's clock zero (monotonic).
pub(crate) fn now_ns() -> u64 {
    u64::try_from(epoch().0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The wall-clock time of the clock's zero, in ns since the Unix epoch.
pub(crate) fn epoch_unix_ns() -> u64 {
    epoch().1
}

/// This thread, numbered from 1 in the order threads first ask.
pub(crate) fn this_thread() -> ThreadInfo {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: Cell<u64> = const { Cell::new(0) };
    }
    let id = ID.with(|id| {
        if id.get() == 0 {
            id.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        id.get()
    });
    ThreadInfo {
        id,
        name: std::thread::current().name().map(str::to_owned),
    }
}

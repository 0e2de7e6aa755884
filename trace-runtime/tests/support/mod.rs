//! What the GPU tests share: the CUDA device, or a visible skip where there is none.
//!
//! A test binary built with `cuda` runs on machines without a GPU too (CI compiles and runs it
//! against a stub driver, `scripts/cuda-check`), so a GPU test asks [`cuda_device`] first and
//! returns early when it gives `None`. On a GPU machine, `MODEL_TRACE_REQUIRE_GPU=1` turns the
//! skip into a failure, so that a broken driver set-up cannot pass as "no GPU".
// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::io::Write;

use candle_core::Device;
use trace_runtime::TensorStats;

/// Whether the environment variable `name` is set to `1`.
pub fn env_flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| value == "1")
}

/// The first CUDA device; `None`, after saying so on stderr, when there is none, unless
/// `MODEL_TRACE_REQUIRE_GPU=1`, which makes that a panic.
pub fn cuda_device(test: &str) -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(device) => Some(device),
        Err(error) if env_flag("MODEL_TRACE_REQUIRE_GPU") => {
            panic!("{test}: MODEL_TRACE_REQUIRE_GPU=1 but no CUDA device: {error}")
        }
        Err(error) => {
            // Straight to stderr: the test harness keeps what `eprintln!` prints to itself
            // unless the test fails, and a skipped GPU test must show in CI's log. One line:
            // candle appends a backtrace to the error when RUST_BACKTRACE is set.
            let error = error.to_string();
            let error = error.lines().next().unwrap_or_default();
            let message = format!("{test}: skipped: no CUDA device ({error})\n");
            let _ = std::io::stderr().write_all(message.as_bytes());
            None
        }
    }
}

/// The device's min and max are the host's, as numbers: where the extremum is a zero, which of
/// −0 and +0 the CPU keeps depends on the order of its SIMD lanes, while the device orders −0
/// below +0.
pub fn assert_same_extremes(what: &str, device: &TensorStats, host: &TensorStats) {
    assert!(
        device.min == host.min,
        "{what}: min {} vs {}",
        device.min,
        host.min
    );
    assert!(
        device.max == host.max,
        "{what}: max {} vs {}",
        device.max,
        host.max
    );
}

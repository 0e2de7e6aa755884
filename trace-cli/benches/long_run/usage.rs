//! What a process used: CPU time and peak resident set, of a child (`wait4`) or of this process.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// Waits for the child `pid` and returns its exit status and resource usage.
///
/// `wait4`, not `Child::wait`: only the call that reaps the child gets its resource usage.
pub(crate) fn wait_with_usage(pid: u32) -> io::Result<(ExitStatus, libc::rusage)> {
    use std::os::unix::process::ExitStatusExt as _;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain data, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid places for the results and outlive the call,
        // which keeps neither pointer; `pid` is our own child, not yet reaped.
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    Ok((ExitStatus::from_raw(status), usage))
}

/// The peak resident set in bytes (what `/usr/bin/time -v` reports as the maximum resident
/// set size).
pub(crate) fn peak_rss_bytes(usage: &libc::rusage) -> u64 {
    // Linux counts `ru_maxrss` in KiB, macOS in bytes.
    let unit = if cfg!(target_os = "macos") { 1 } else { 1024 };
    u64::try_from(usage.ru_maxrss).unwrap_or(0) * unit
}

/// User plus system time.
pub(crate) fn cpu_time(usage: &libc::rusage) -> Duration {
    let time = |t: libc::timeval| {
        let seconds = u64::try_from(t.tv_sec).unwrap_or(0);
        let micros = u32::try_from(t.tv_usec).unwrap_or(0);
        Duration::from_secs(seconds) + Duration::from_micros(micros.into())
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The CPU time this process has used so far, all its threads together.
pub(crate) fn own_cpu_time() -> io::Result<Duration> {
    // SAFETY: `rusage` is plain data, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid place for the result and outlives the call, which keeps no
    // pointer to it.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cpu_time(&usage))
}

#[allow(clippy::cast_precision_loss)]
pub(crate) fn mebibytes(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

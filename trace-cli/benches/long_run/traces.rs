//! The two traces: written by the runtime from the toy model (or reused), and removed.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use model_trace::{ModelTracerConfig, Session, TraceReader};
use serde::{Deserialize, Serialize};

use crate::model::{Model, Step, Variant, PROMPT_TOKENS};
use crate::usage::own_cpu_time;
use crate::{megabytes, BenchError, Settings, BYTES_PER_PASS_BOUND, SPARE_BYTES};

/// The two trace files and what writing them took.
#[derive(Debug)]
pub(crate) struct Traces {
    pub(crate) dir: PathBuf,
    /// Whether this run made `dir` (and so removes it when it is left empty).
    made_dir: bool,
    /// A.
    pub(crate) reference: PathBuf,
    /// B.
    pub(crate) perturbed: PathBuf,
    /// Where `report A` writes its page.
    pub(crate) report: PathBuf,
    /// `None` when reused.
    pub(crate) generation: Option<Generation>,
    /// Whether the traces and the report are removed at the end.
    remove: bool,
}

/// How long the generator took (what its process prints for the measuring one).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Generation {
    /// Both files, written at once on two threads.
    pub(crate) wall: Duration,
    /// The CPU time of both (user and system, the two threads together).
    pub(crate) cpu: Duration,
    /// Each file by itself, on its thread.
    pub(crate) reference: Duration,
    pub(crate) perturbed: Duration,
}

impl Traces {
    /// Where the traces go: `--dir`, made if missing, or a new temporary directory.
    pub(crate) fn new(settings: &Settings) -> Result<Self, BenchError> {
        let (dir, made_dir) = match &settings.dir {
            Some(dir) => (dir.clone(), !dir.exists()),
            None => (
                std::env::temp_dir().join(format!("model-trace-long-run-{}", std::process::id())),
                true,
            ),
        };
        std::fs::create_dir_all(&dir).map_err(BenchError::io("create", &dir))?;
        Ok(Self {
            reference: dir.join("a.ndjson"),
            perturbed: dir.join("b.ndjson"),
            report: dir.join("a.html"),
            dir,
            made_dir,
            generation: None,
            remove: !settings.keep && !settings.reuse,
        })
    }

    /// Writes A and B (or finds them, with `--reuse`) in the chosen directory.
    pub(crate) fn prepare(settings: &Settings) -> Result<Self, BenchError> {
        let mut traces = Self::new(settings)?;
        if settings.reuse {
            check_reusable(&traces.reference, Variant::Reference, settings)?;
            let perturbed = Variant::Perturbed {
                diverge_at: settings.diverge_at,
            };
            check_reusable(&traces.perturbed, perturbed, settings)?;
            return Ok(traces);
        }
        check_space(&traces.dir, settings.passes)?;
        eprintln!(
            "long_run: writing two traces of {} passes to {} ...",
            settings.passes,
            traces.dir.display()
        );
        // From here on the files are ours: removed on error too, unless --keep.
        match traces.run_generator(settings) {
            Ok(generation) => traces.generation = Some(generation),
            Err(error) => {
                let _ = traces.clean_up(true);
                return Err(error);
            }
        }
        Ok(traces)
    }

    /// Writes A and B in a process of their own, this program run with `--generator`.
    ///
    /// Not in this process: Linux charges a process's peak resident set to the children it
    /// starts afterwards (at `exec`), so the commands' figures would include the generator's.
    fn run_generator(&self, settings: &Settings) -> Result<Generation, BenchError> {
        let program =
            std::env::current_exe().map_err(BenchError::io("find", Path::new("the bench")))?;
        let mut command = Command::new(&program);
        command
            .arg("--generator")
            .args(["--passes", &settings.passes.to_string()])
            .arg("--dir")
            .arg(&self.dir);
        if let Some(pass) = settings.diverge_at {
            command.args(["--diverge-at", &pass.to_string()]);
        }
        let output = command
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(BenchError::io("run", &program))?;
        if !output.status.success() {
            return Err(BenchError::Generator(output.status));
        }
        serde_json::from_slice(&output.stdout).map_err(BenchError::GeneratorOutput)
    }

    /// A and B at once, one session on each of two threads: what `--generator` does.
    pub(crate) fn write_both(&self, settings: &Settings) -> Result<Generation, BenchError> {
        let cpu_before =
            own_cpu_time().map_err(BenchError::io("read the CPU time of", &self.dir))?;
        let started = Instant::now();
        let perturbed = Variant::Perturbed {
            diverge_at: settings.diverge_at,
        };
        let (reference, perturbed) = std::thread::scope(|scope| {
            let reference =
                scope.spawn(|| write_trace(&self.reference, Variant::Reference, settings.passes));
            let perturbed = write_trace(&self.perturbed, perturbed, settings.passes);
            let reference = reference.join().unwrap_or_else(|panic| {
                std::panic::resume_unwind(panic);
            });
            (reference, perturbed)
        });
        let wall = started.elapsed();
        let cpu_after =
            own_cpu_time().map_err(BenchError::io("read the CPU time of", &self.dir))?;
        Ok(Generation {
            wall,
            cpu: cpu_after.saturating_sub(cpu_before),
            reference: reference?,
            perturbed: perturbed?,
        })
    }

    pub(crate) fn size(path: &Path) -> Result<u64, BenchError> {
        std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(BenchError::io("read the size of", path))
    }

    /// Removes the traces and the report unless they are to be kept, and the directory when
    /// this run made it and `succeeded` (after a failure it holds the failed command's stderr).
    pub(crate) fn clean_up(&self, succeeded: bool) -> Result<(), BenchError> {
        if !self.remove {
            eprintln!("long_run: the traces are in {}", self.dir.display());
            return Ok(());
        }
        for path in [&self.reference, &self.perturbed, &self.report] {
            match std::fs::remove_file(path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => {
                    return Err(BenchError::io("remove", path)(error));
                }
                _ => {}
            }
        }
        if self.made_dir && succeeded {
            // Left where something else was put in it meanwhile.
            let _ = std::fs::remove_dir(&self.dir);
        }
        Ok(())
    }
}

/// Fails unless `dir` has room for two traces of `passes` passes.
fn check_space(dir: &Path, passes: usize) -> Result<(), BenchError> {
    let needed = 2 * BYTES_PER_PASS_BOUND * passes as u64 + SPARE_BYTES;
    let available = free_space(dir).map_err(BenchError::io("read the free space of", dir))?;
    eprintln!(
        "long_run: the traces need about {}; {} has {} free",
        megabytes(needed),
        dir.display(),
        megabytes(available)
    );
    if available < needed {
        return Err(BenchError::Space {
            dir: dir.to_path_buf(),
            needed,
            available,
        });
    }
    Ok(())
}

/// Bytes an unprivileged process can still write in the file system of `dir`.
fn free_space(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    // SAFETY: `statvfs` is plain data, for which all zeroes is a valid value.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stats` a valid place for the result; both
    // outlive the call, which keeps neither pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion)] // the field types differ between platforms
    Ok(u64::from(stats.f_bavail) * u64::from(stats.f_frsize))
}

/// The `metadata.extra` keys through which a trace says how it was generated, for `--reuse`.
const EXTRA_PASSES: &str = "long_run.passes";
const EXTRA_VARIANT: &str = "long_run.variant";

/// Fails unless `path` is a complete trace written by this bench as `variant` of `passes`.
fn check_reusable(path: &Path, variant: Variant, settings: &Settings) -> Result<(), BenchError> {
    let reject = |reason: String| BenchError::Reuse {
        path: path.to_path_buf(),
        reason,
    };
    let reader =
        TraceReader::open(path).map_err(|error| reject(format!("is unreadable: {error}")))?;
    let extra = &reader.header().metadata.extra;
    let said = |key: &str| extra.get(key).map_or("nothing", String::as_str).to_owned();
    let (passes, written_as) = (said(EXTRA_PASSES), said(EXTRA_VARIANT));
    if passes != settings.passes.to_string() || written_as != variant.to_string() {
        return Err(reject(format!(
            "was written with {passes} passes as {written_as}, not {} passes as {variant}",
            settings.passes
        )));
    }
    if !ends_with_session_end(path).map_err(|error| reject(format!("is unreadable: {error}")))? {
        return Err(reject("was cut short (no session_end at its end)".into()));
    }
    Ok(())
}

/// Whether the last line of `path` is a `session_end` event.
fn ends_with_session_end(path: &Path) -> io::Result<bool> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(64 << 10)))?;
    let mut end = Vec::new();
    file.read_to_end(&mut end)?;
    let last = end
        .strip_suffix(b"\n")
        .unwrap_or(&end)
        .rsplit(|&byte| byte == b'\n')
        .next()
        .unwrap_or_default();
    Ok(last.starts_with(br#"{"event":"session_end""#))
}

/// Runs the toy model for `passes` passes under a full session writing `path`.
fn write_trace(path: &Path, variant: Variant, passes: usize) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let session = Session::builder(ModelTracerConfig::full())
        .trace_file(path)
        .model("SmolLM2-135M-Instruct (synthetic: trace-cli's long_run bench)")
        .prompt(format!(
            "{PROMPT_TOKENS} tokens, then {} decoded",
            passes - 1
        ))
        .extra(EXTRA_PASSES, passes.to_string())
        .extra(EXTRA_VARIANT, variant.to_string())
        .start()
        .map_err(BenchError::Session)?;
    if session.trace_file() != Some(path) {
        return Err(BenchError::TraceFile {
            asked: path.to_path_buf(),
            got: session.trace_file().map(Path::to_path_buf),
        });
    }
    let mut model = Model::new();
    for pass in 0..passes {
        let (tokens, position) = match pass {
            0 => (PROMPT_TOKENS, 0),
            _ => (1, PROMPT_TOKENS + pass - 1),
        };
        model.forward(tokens, position, Step { pass, variant });
    }
    let (_, errors) = session.finish_with_errors();
    if !errors.is_empty() {
        return Err(BenchError::Record {
            path: path.to_path_buf(),
            errors,
        });
    }
    Ok(started.elapsed())
}

//! What the command's tests share: scratch directories and running the binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// An empty directory of this test process, `name` telling the tests apart.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("model-trace-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `model-trace` with `args`, without colour.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_model-trace"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs")
}

/// What the command printed, stdout then stderr.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The JSON a report page embeds.
#[allow(dead_code)] // the tests of `report` only
pub fn embedded_data(page: &str) -> serde_json::Value {
    let start = page
        .find(r#"<script type="application/json" id="report-data">"#)
        .expect("the data element");
    let rest = &page[start..];
    let json = &rest[rest.find('>').unwrap() + 1..rest.find("</script>").unwrap()];
    serde_json::from_str(json).expect("the embedded data is JSON")
}

/// Runs `forward` in a session that writes the trace file `path`, every tensor captured if
/// `capture`, every layer fed the inputs `isolate` captured if given.
#[allow(dead_code)] // the tests that write traces of their own models only
pub fn write_run(path: &Path, capture: bool, isolate: Option<&Path>, forward: impl FnOnce()) {
    write_session(
        path,
        model_trace::ModelTracerConfig::lightweight(),
        |mut builder| {
            if capture {
                builder = builder.capture("*");
            }
            if let Some(reference) = isolate {
                builder = builder.isolate(reference);
            }
            builder
        },
        forward,
    );
}

/// Runs `forward` in a session of `config` that writes the trace file `path`, its builder
/// (the file set) finished by `configure`.
#[allow(dead_code)] // the tests that write traces of their own models only
pub fn write_session(
    path: &Path,
    config: model_trace::ModelTracerConfig,
    configure: impl FnOnce(model_trace::SessionBuilder) -> model_trace::SessionBuilder,
    forward: impl FnOnce(),
) {
    let builder = configure(model_trace::Session::builder(config).trace_file(path));
    let session = builder.start().expect("the trace file can be created");
    forward();
    session.finish();
}

//! Writing results on stdout: a closed pipe (`model-trace summary … | head`) ends the output
//! quietly instead of panicking.

use std::io::{ErrorKind, Write as _};

/// Writes `text` on stdout; a reader that went away is not an error.
pub(crate) fn emit(text: &str) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() != ErrorKind::BrokenPipe => {
            Err(format!("writing the output: {error}"))
        }
        _ => Ok(()),
    }
}

/// `value` as pretty JSON and a newline, on stdout.
pub(crate) fn emit_json(value: &impl serde::Serialize) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    text.push('\n');
    emit(&text)
}

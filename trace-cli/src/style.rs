//! Colour on a terminal: green for what matched, red for what diverged, dim for detail.

use std::io::IsTerminal as _;

/// Whether to colour, and the colours.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Colors {
    on: bool,
}

impl Colors {
    /// `force`: `Some` from `--color always/never`, `None` for auto (a terminal on stdout and
    /// `NO_COLOR` unset).
    pub(crate) fn new(force: Option<bool>) -> Self {
        let auto = || std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        Self {
            on: force.unwrap_or_else(auto),
        }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub(crate) fn good(self, text: &str) -> String {
        self.paint("32", text)
    }

    pub(crate) fn bad(self, text: &str) -> String {
        self.paint("1;31", text)
    }

    pub(crate) fn warn(self, text: &str) -> String {
        self.paint("33", text)
    }

    pub(crate) fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    pub(crate) fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }
}

//! `model-trace`: read trace files written by the model-trace runtime or its Python package.
//!
//! Exit codes: 0 when everything matched (or the command succeeded), 1 when `diff` found a
//! divergence or `check` a stage identity that fails, 2 for bad input (an unreadable or
//! malformed file, bad options).
//!
//! Modules import downwards only: this file parses and dispatches; the subcommands (`list`,
//! `summary`, `check`, `diff`, `report`, `chrome`) use the arguments (`args`), the result
//! (`outcome`) and what two of them share (`header`, `compared`), which use the bottom layer:
//! reading files (`load`), writing output (`output`) and colour (`style`).

#![forbid(unsafe_code)]

mod args;
mod check;
mod checked;
mod chosen;
mod chrome;
mod compared;
mod diff;
mod header;
mod input;
mod list;
mod load;
mod outcome;
mod output;
mod report;
mod style;
mod summary;

use std::process::ExitCode;

use clap::Parser as _;

use crate::args::{Cli, Command};
use crate::outcome::Outcome;
use crate::style::Colors;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let colors = Colors::new(cli.color.forced());
    let result = match cli.command {
        Command::List { files } => list::run(&files, &colors),
        Command::Summary { files, json } => summary::run(&files, json, &colors),
        Command::Check { files, json } => check::run(&files, json, &colors),
        Command::Diff(args) => diff::run(&args, &colors),
        Command::Report(args) => report::run(&args),
        Command::Chrome { files, output } => chrome::run(&files, &output),
    };
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Diverged | Outcome::Failed) => ExitCode::from(1),
        Err(error) => {
            eprintln!("model-trace: {error}");
            ExitCode::from(2)
        }
    }
}

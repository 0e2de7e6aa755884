//! `model-trace`: read trace files written by the model-trace runtime or its Python package.
//!
//! Exit codes: 0 when everything matched (or the command succeeded), 1 when `diff` found a
//! divergence or a flagged routing layer, or `check` a stage identity that fails, 2 for bad input (an unreadable or
//! malformed file, bad options).
//!
//! Modules import downwards only: this file parses the arguments (`args`) and dispatches to
//! the subcommands (`command/`, one file each, with the exit outcome); they do their work
//! through what two of them share: two traces compared (`comparison/`, for `diff` and
//! `report --against`), the stage check (`stage_check`, for `check` and `diff`) and the lines
//! about a trace's header (`header`, for `list` and `summary`), what a header says of its
//! precision (`precision`, for the tolerance `diff` chooses); all of them stand on the
//! bottom layer: reading trace files (`input/`), writing output (`output`) and colour
//! (`style`).

#![forbid(unsafe_code)]

mod args;
mod command;
mod comparison;
mod header;
mod input;
mod output;
mod precision;
mod router_load;
mod stage_check;
mod style;

use std::process::ExitCode;

use clap::Parser as _;

use crate::args::{Cli, Command};
use crate::command::{check, chrome, diff, list, report, summary, Outcome};
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

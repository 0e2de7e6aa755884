//! `model-trace diff REFERENCE OTHER`: where OTHER starts to differ from REFERENCE.

use crate::args::DiffArgs;
use crate::compared::Diffed;
use crate::load::InputError;
use crate::outcome::Outcome;
use crate::style::Colors;

pub(crate) fn run(args: &DiffArgs, colors: &Colors) -> Result<Outcome, InputError> {
    let options = args.compare.options()?;
    let diffed = Diffed::read(&args.reference, &args.other, options, args.pass)?;
    let report = diffed.report();
    if args.json {
        crate::output::emit_json(&report)?;
    } else {
        diffed.warn_unused_overrides();
        crate::output::emit(&report.text(colors))?;
    }
    Ok(if diffed.diverged() {
        Outcome::Diverged
    } else {
        Outcome::Ok
    })
}

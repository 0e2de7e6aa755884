//! The input: which trace files the paths on the command line name, as the files of one run
//! (`files`), and the events of a run, its ranks merged pass by pass (`events`).

mod events;
mod files;

pub(crate) use events::{read, ReadNotes};
pub(crate) use files::{files, TraceFile, TraceRun};

/// A problem with the input: the message names the file (and line).
pub(crate) type InputError = String;

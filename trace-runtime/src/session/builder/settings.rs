//! Each setting of a [`SessionBuilder`], turned into what the running session uses: one step a
//! setting (the filter, the rank, the capture filter, `MODEL_TRACE_PATCH`'s interventions,
//! isolation, the trace file, the capture writer), in that order, then the warnings about
//! patterns that select nothing and the header.
//!
//! A step takes its value from the builder or, when the builder reads the environment, from
//! its variable, and remembers which ([`Origin`]); a value it cannot use goes to
//! [`Refusals`], which either stops the start with the error or reports it and lets the step go
//! on without the value, as the way the session was started ([`Unusable`]) says.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{RankSetting, SessionBuilder, Setting};
use crate::format::{self, CaptureWriter};
use crate::intervene::{Action, Intervention};
use crate::record::{
    CandleDequantize, RecordErrorKind, RunMetadata, TraceHeader, TracepointInfo, FORMAT_NAME,
    SCHEMA_VERSION,
};
use crate::select::{CaptureFilter, TraceFilter};
use crate::session::registry;
use crate::session::state::{SessionSetup, SessionState};
use crate::session::{
    clock, Session, SessionError, CAPTURE_ENV_VAR, FILTER_ENV_VAR, ISOLATE_ENV_VAR, OUT_ENV_VAR,
    PATCH_ENV_VAR, RUN_ENV_VAR,
};
use crate::sink::TraceFileSink;
use crate::tracepoint::tracepoints;

/// What starting a session does with a value it cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unusable {
    /// An error, wherever the value came from ([`SessionBuilder::try_start`]).
    Error,
    /// An error when the value was given in code; one read from the environment is reported
    /// and skipped ([`SessionBuilder::start`]).
    ErrorIfGiven,
    /// Reported and skipped ([`SessionBuilder::start_lenient`]).
    Skipped,
}

/// Where the value of a setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Given to the builder in code (or not set at all).
    Given,
    /// Read from the environment variable(s) named.
    Env(&'static str),
    /// Read from the environment variable(s) named because the program asked for them
    /// (`rank_from_env`): named like [`Origin::Env`], refused like [`Origin::Given`].
    EnvAskedFor(&'static str),
}

/// The values that cannot be used, as the steps find them: the error that stops the start, or
/// the reports that the session starts with.
struct Refusals {
    unusable: Unusable,
    /// What the session reports as its own errors and warnings when it starts.
    reports: Vec<(RecordErrorKind, String)>,
}

impl Refusals {
    fn new(unusable: Unusable) -> Self {
        Self {
            unusable,
            reports: Vec::new(),
        }
    }

    /// `Err(error)` when `error` stops the start; else it is reported (on stderr, and as the
    /// session's error) with `instead`, what the session does without the value, said so
    /// nobody has to guess.
    fn refuse(
        &mut self,
        error: SessionError,
        origin: Origin,
        instead: &str,
    ) -> Result<(), SessionError> {
        let stops = match self.unusable {
            Unusable::Error => true,
            Unusable::ErrorIfGiven => !matches!(origin, Origin::Env(_)),
            Unusable::Skipped => false,
        };
        if stops {
            return Err(error);
        }
        // `MODEL_TRACE_PATCH`'s error names its variable itself.
        let prefix = match origin {
            Origin::Env(var) | Origin::EnvAskedFor(var)
                if !matches!(error, SessionError::Patch(_)) =>
            {
                format!("{var}: ")
            }
            _ => String::new(),
        };
        let message = format!("{prefix}{error}; {instead}");
        self.reports.push((RecordErrorKind::Config, message));
        Ok(())
    }

    /// Says on stderr each value the session goes on without, once nothing can stop it from
    /// starting (not as they are found: a later error would stop the start, and "going on"
    /// would be untrue).
    fn print_skipped(&self) {
        for (kind, message) in &self.reports {
            if *kind == RecordErrorKind::Config {
                eprintln!("model-trace: {message}");
            }
        }
    }

    /// Warns about each pattern of the filter and of the interventions that matches none of
    /// the program's tracepoints.
    fn warn_unmatched(
        &mut self,
        filter: &TraceFilter,
        filter_origin: Origin,
        interventions: &[Intervention],
    ) {
        let origin = match filter_origin {
            Origin::Env(var) | Origin::EnvAskedFor(var) => var,
            Origin::Given => "filter",
        };
        for pattern in filter.unmatched(&tracepoints()) {
            let effect = if pattern.starts_with('-') {
                "excludes"
            } else {
                "selects"
            };
            self.reports.push((
                RecordErrorKind::UnmatchedPattern,
                format!(
                    "{origin} pattern `{pattern}` matches none of the program's tracepoints, so \
                     it {effect} nothing (model_trace::tracepoints() lists them)"
                ),
            ));
        }
        for intervention in interventions {
            for pattern in intervention.selector().unmatched(&tracepoints()) {
                self.reports.push((
                    RecordErrorKind::UnmatchedPattern,
                    format!(
                        "intervention `{intervention}`: pattern `{pattern}` matches none of the \
                         program's tracepoints, so it changes nothing"
                    ),
                ));
            }
        }
    }
}

impl SessionBuilder {
    /// Starts the session: each setting in turn, then the session's state on this thread.
    pub(super) fn build(mut self, unusable: Unusable) -> Result<Session, SessionError> {
        let mut refusals = Refusals::new(unusable);
        let (filter, filter_origin) = self.resolve_filter(&mut refusals)?;
        if !cfg!(feature = "enabled") {
            return Ok(Session::inert(self.config));
        }
        let rank = self.resolve_rank(&mut refusals)?;
        let (capture, capture_origin) = self.resolve_capture(&mut refusals)?;
        let mut interventions = self.resolve_patch(&mut refusals)?;
        let isolation = self.resolve_isolation(&mut refusals)?;
        // The replay of the reference comes first, before `MODEL_TRACE_PATCH`'s interventions.
        let isolate = isolation.map(|(replay, reference)| {
            interventions.insert(0, replay);
            reference
        });
        let (trace_file, file_origin) = self.resolve_trace_file(rank, &mut refusals)?;
        // Captures without their file: the environment's fault when the file it named could not
        // be created, else the capture's.
        let missing_file_origin = match file_origin {
            Origin::Env(_) => file_origin,
            Origin::Given | Origin::EnvAskedFor(_) => capture_origin,
        };
        let capture_writer = self.resolve_capture_writer(
            capture.as_ref(),
            missing_file_origin,
            trace_file.as_deref(),
            &mut refusals,
        )?;
        interventions.append(&mut self.interventions);
        refusals.warn_unmatched(&filter, filter_origin, &interventions);
        // Nothing below can fail: the session starts.
        refusals.print_skipped();
        let mut header = self.header(&filter, capture.as_ref(), rank, &interventions);
        header.isolate = isolate;
        let setup = SessionSetup {
            config: self.config,
            filter,
            keep_in_memory: self.keep_in_memory.unwrap_or(trace_file.is_none()),
            sinks: self.sinks,
            capture: capture_writer,
            header,
            setup_errors: refusals.reports,
            interventions,
        };
        let generation = registry::push(SessionState::new(setup));
        Ok(Session {
            generation,
            trace_file,
            // Not reached without `enabled` (returned above); the field exists only then.
            #[cfg(not(feature = "enabled"))]
            config: crate::config::ModelTracerConfig::default(),
            _not_send: PhantomData,
        })
    }

    /// The filter: parsed already, given as text, or `MODEL_TRACE`; none records everything.
    fn resolve_filter(
        &mut self,
        refusals: &mut Refusals,
    ) -> Result<(TraceFilter, Origin), SessionError> {
        let (text, origin) = self.setting(&self.filter, FILTER_ENV_VAR);
        if let Some(filter) = self.parsed_filter.take() {
            return Ok((filter, origin));
        }
        let filter = match TraceFilter::parse(text.as_deref().unwrap_or("")) {
            Ok(filter) => filter,
            Err(error) => {
                refusals.refuse(
                    SessionError::Filter(error),
                    origin,
                    "going on without the whole filter: every tracepoint is traced",
                )?;
                TraceFilter::all()
            }
        };
        Ok((filter, origin))
    }

    /// The rank and world size: given, or from `RANK` and `WORLD_SIZE`; none without either.
    /// An unusable one from the environment is refused like one given in code (an error of
    /// `start`, reported and skipped by `start_lenient` only): the program asked for a rank
    /// (`rank_from_env`), and ranks going on without one would all write the same file, each
    /// over the others'.
    fn resolve_rank(
        &self,
        refusals: &mut Refusals,
    ) -> Result<Option<(usize, usize)>, SessionError> {
        match self.rank_and_world_size() {
            Ok(rank) => Ok(rank),
            Err(error) => {
                let origin = match self.rank {
                    RankSetting::FromEnv => Origin::EnvAskedFor("RANK and WORLD_SIZE"),
                    _ => Origin::Given,
                };
                refusals.refuse(error, origin, "going on without a rank")?;
                Ok(None)
            }
        }
    }

    /// The rank and world size the builder was given or the environment says.
    fn rank_and_world_size(&self) -> Result<Option<(usize, usize)>, SessionError> {
        let (rank, world_size) = match self.rank {
            RankSetting::None => return Ok(None),
            RankSetting::Given { rank, world_size } => (rank, world_size),
            RankSetting::FromEnv => {
                let var = |name: &str| std::env::var(name).ok();
                match rank_from_vars(var("RANK").as_deref(), var("WORLD_SIZE").as_deref())
                    .map_err(SessionError::Rank)?
                {
                    Some(pair) => pair,
                    None => return Ok(None),
                }
            }
        };
        if rank >= world_size {
            return Err(SessionError::Rank(format!(
                "rank {rank} is not below the world size {world_size}"
            )));
        }
        Ok(Some((rank, world_size)))
    }

    /// The capture filter: given, or `MODEL_TRACE_CAPTURE`; one that selects nothing is none.
    fn resolve_capture(
        &self,
        refusals: &mut Refusals,
    ) -> Result<(Option<CaptureFilter>, Origin), SessionError> {
        let (text, origin) = self.setting(&self.capture, CAPTURE_ENV_VAR);
        let capture = match text.as_deref().map(CaptureFilter::parse).transpose() {
            Ok(capture) => capture.filter(|c| !c.is_empty()),
            Err(error) => {
                refusals.refuse(
                    SessionError::Capture(error),
                    origin,
                    "going on without captures",
                )?;
                None
            }
        };
        Ok((capture, origin))
    }

    /// The interventions of `MODEL_TRACE_PATCH`, when the builder reads the environment.
    fn resolve_patch(&self, refusals: &mut Refusals) -> Result<Vec<Intervention>, SessionError> {
        if !self.from_env {
            return Ok(Vec::new());
        }
        let Ok(text) = std::env::var(PATCH_ENV_VAR) else {
            return Ok(Vec::new());
        };
        match Intervention::parse_list(&text) {
            Ok(parsed) => Ok(parsed),
            Err(error) => {
                refusals.refuse(
                    SessionError::Patch(error),
                    Origin::Env(PATCH_ENV_VAR),
                    "going on without interventions",
                )?;
                Ok(Vec::new())
            }
        }
    }

    /// Isolation: given, or `MODEL_TRACE_ISOLATE`; the intervention that replays the
    /// reference's layer inputs, and the reference's path for the header.
    fn resolve_isolation(
        &self,
        refusals: &mut Refusals,
    ) -> Result<Option<(Intervention, String)>, SessionError> {
        let (text, origin) = self.setting(&self.isolate, ISOLATE_ENV_VAR);
        let Some(path) = text.filter(|path| !path.is_empty()) else {
            return Ok(None);
        };
        let replay = Action::replace(&path)
            .and_then(|action| Intervention::new("stage=input", action).map_err(|e| e.to_string()));
        match replay {
            Ok(replay) => Ok(Some((replay, path))),
            Err(reason) => {
                refusals.refuse(
                    SessionError::Isolate(reason),
                    origin,
                    "going on without isolation: the layers get their own inputs",
                )?;
                Ok(None)
            }
        }
    }

    /// The trace file: given, or `MODEL_TRACE_OUT`, named by the rank and the naming rule
    /// ([`SessionBuilder::trace_file`]); created, and its writer made the first sink. With it,
    /// where it was asked for.
    fn resolve_trace_file(
        &mut self,
        rank: Option<(usize, usize)>,
        refusals: &mut Refusals,
    ) -> Result<(Option<PathBuf>, Origin), SessionError> {
        let (text, origin) = self.setting(&self.trace_file, OUT_ENV_VAR);
        let Some(requested) = text.filter(|path| !path.is_empty()) else {
            return Ok((None, Origin::Given));
        };
        let requested = Path::new(&requested);
        let path = format::claim_path(&match rank {
            Some((rank, _)) => format::ranked(requested, rank),
            None => requested.to_path_buf(),
        });
        match TraceFileSink::create(&path) {
            Ok(sink) => {
                self.sinks.insert(0, Box::new(sink));
                Ok((Some(path), origin))
            }
            Err(source) => {
                refusals.refuse(
                    SessionError::CreateFile { path, source },
                    origin,
                    "going on without a trace file",
                )?;
                Ok((None, origin))
            }
        }
    }

    /// Where the captured tensors go: beside the trace file, which they need.
    fn resolve_capture_writer(
        &self,
        capture: Option<&CaptureFilter>,
        capture_origin: Origin,
        trace_file: Option<&Path>,
        refusals: &mut Refusals,
    ) -> Result<Option<(CaptureFilter, CaptureWriter)>, SessionError> {
        let Some(capture) = capture else {
            return Ok(None);
        };
        match trace_file {
            Some(path) => Ok(Some((
                capture.clone(),
                CaptureWriter::new(path, self.capture_chunk_bytes),
            ))),
            None => {
                refusals.refuse(
                    SessionError::CaptureWithoutFile,
                    capture_origin,
                    "going on without captures",
                )?;
                Ok(None)
            }
        }
    }

    /// The value of a setting: given, else from `var` when reading the environment; and where
    /// it came from.
    fn setting(&self, given: &Setting, var: &'static str) -> (Option<String>, Origin) {
        match given {
            Setting::Given(value) => (Some(value.clone()), Origin::Given),
            Setting::Unset if self.from_env => match std::env::var(var) {
                Ok(value) => (Some(value), Origin::Env(var)),
                Err(std::env::VarError::NotPresent) => (None, Origin::Given),
                Err(std::env::VarError::NotUnicode(raw)) => {
                    (Some(raw.to_string_lossy().into_owned()), Origin::Env(var))
                }
            },
            Setting::Unset => (None, Origin::Given),
        }
    }

    /// The run the header names: given, else `MODEL_TRACE_RUN` when the environment is read,
    /// else the process's own id.
    fn run_id(&self) -> String {
        let reads_env = self.from_env || self.rank == RankSetting::FromEnv;
        self.run
            .clone()
            .or_else(|| {
                reads_env
                    .then(|| std::env::var(RUN_ENV_VAR).ok())
                    .flatten()
                    .filter(|run| !run.is_empty())
            })
            .unwrap_or_else(process_run_id)
    }

    /// The metadata, its precision as candle's environment variables make it: what a candle
    /// model computes in, even if it says nothing.
    fn metadata_under_candle(&self) -> RunMetadata {
        let mut metadata = self.metadata.clone();
        let dequantize = CandleDequantize::from_env();
        if dequantize != CandleDequantize::Off || metadata.precision.is_some() {
            let said = metadata.precision.take().unwrap_or_default();
            metadata.precision = Some(said.under_candle(dequantize));
        }
        metadata
    }

    /// The header the session's sinks start with (its `isolate` is set by the caller).
    fn header(
        &self,
        filter: &TraceFilter,
        capture: Option<&CaptureFilter>,
        rank: Option<(usize, usize)>,
        interventions: &[Intervention],
    ) -> TraceHeader {
        static SESSIONS: AtomicU64 = AtomicU64::new(1);
        TraceHeader {
            format: FORMAT_NAME.to_owned(),
            schema: SCHEMA_VERSION,
            writer: format!("model-trace {}", env!("CARGO_PKG_VERSION")),
            session: SESSIONS.fetch_add(1, Ordering::Relaxed),
            process_id: std::process::id(),
            thread: clock::this_thread(),
            clock: crate::record::Clock {
                session_start_ns: clock::now_ns(),
                epoch_unix_ns: clock::epoch_unix_ns(),
            },
            config: self.config.clone(),
            filter: filter.to_string(),
            capture: capture.map(ToString::to_string).unwrap_or_default(),
            tracepoints: TracepointInfo::all(),
            metadata: self.metadata_under_candle(),
            run: self.run_id(),
            rank: rank.map(|(rank, _)| rank),
            world_size: rank.map(|(_, world_size)| world_size),
            interventions: interventions.iter().map(ToString::to_string).collect(),
            isolate: None,
        }
    }
}

/// `RANK` and `WORLD_SIZE` as a launcher sets them: both or neither.
fn rank_from_vars(
    rank: Option<&str>,
    world_size: Option<&str>,
) -> Result<Option<(usize, usize)>, String> {
    let number = |name: &str, value: &str| {
        value
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("{name}={value:?} is not a number"))
    };
    match (rank, world_size) {
        (None, None) => Ok(None),
        (Some(rank), Some(world_size)) => Ok(Some((
            number("RANK", rank)?,
            number("WORLD_SIZE", world_size)?,
        ))),
        (Some(_), None) => {
            Err("RANK is set but WORLD_SIZE is not (set both or neither)".to_owned())
        }
        (None, Some(_)) => {
            Err("WORLD_SIZE is set but RANK is not (set both or neither)".to_owned())
        }
    }
}

/// This process's run id: the wall-clock time of its first session and its process id.
fn process_run_id() -> String {
    format!("{:x}-{}", clock::epoch_unix_ns(), std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelTracerConfig;

    #[test]
    fn rank_and_world_size_come_together_as_numbers() {
        assert_eq!(rank_from_vars(None, None), Ok(None));
        assert_eq!(rank_from_vars(Some("1"), Some(" 4 ")), Ok(Some((1, 4))));
        let only_rank = rank_from_vars(Some("1"), None).unwrap_err();
        assert!(only_rank.contains("WORLD_SIZE is not"), "{only_rank}");
        let only_world = rank_from_vars(None, Some("2")).unwrap_err();
        assert!(only_world.contains("RANK is not"), "{only_world}");
        let bad = rank_from_vars(Some("one"), Some("2")).unwrap_err();
        assert_eq!(bad, "RANK=\"one\" is not a number");
    }

    #[test]
    fn a_rank_must_be_below_the_world_size() {
        let builder = Session::builder(ModelTracerConfig::lightweight()).rank(2, 2);
        let error = builder.rank_and_world_size().unwrap_err();
        assert_eq!(
            error.to_string(),
            "rank: rank 2 is not below the world size 2"
        );
        let builder = Session::builder(ModelTracerConfig::lightweight()).rank(1, 2);
        assert_eq!(builder.rank_and_world_size().unwrap(), Some((1, 2)));
    }

    #[test]
    fn sessions_of_one_process_share_a_run_unless_given_one() {
        let builder = || Session::builder(ModelTracerConfig::lightweight());
        assert_eq!(builder().run_id(), builder().run_id());
        assert_eq!(builder().run("launch-7").run_id(), "launch-7");
    }
}

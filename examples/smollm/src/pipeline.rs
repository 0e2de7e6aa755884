//! The model cut into pipeline stages: runs of consecutive blocks, each stage on a thread of its
//! own, hidden states handed from stage to stage through channels, as a model too large for one
//! device is served across several. Each stage is one rank of the run and records its own trace.
//!
//! # Tracing a pipeline-parallel model
//!
//! A session records on the thread that started it, so a model split across threads (or
//! processes) is traced one rank at a time: a session and a trace file per stage, which the
//! `model-trace` tools read together. Three things make the ranks' traces line up with the trace
//! of the whole model run on one thread:
//!
//! 1. **Each rank's stage function is a forward pass of its own**, annotated
//!    `#[trace_model(position = position, name = "stage")]` ([`Stage::forward`]; the name only
//!    tells its passes from [`Model::forward`]'s in a listing). A rank's thread never enters
//!    the whole model's `#[trace_model]` function ([`Model::forward`]); without an annotation of
//!    its own, every layer the rank records would fall into one implicit pass, with a warning,
//!    where the one-rank trace has a pass per forward step. With it, every rank numbers its
//!    passes 0, 1, 2, ... in step with the others, at the positions the model gives.
//! 2. **Layers carry their index**: `#[trace_layer(index = self.index)]` on
//!    [`Block::forward`](crate::model::Block::forward). Without `index`, a layer is numbered by
//!    its call order within the pass, and the second of two stages would record SmolLM2's blocks
//!    15 to 29 as layers 0 to 14.
//! 3. **A session per rank**, started on the rank's thread with
//!    [`SessionBuilder::rank`](model_trace::SessionBuilder::rank)`(rank, stages)`: a trace file
//!    asked for as `STEM.EXT` is written as `STEM.rank{rank}.EXT`, and the header says the rank,
//!    the world size and the `run` the ranks share (the sessions of one process share one by
//!    default). With one process per rank, as distributed launchers start them,
//!    [`SessionBuilder::rank_from_env`](model_trace::SessionBuilder::rank_from_env) reads `RANK`
//!    and `WORLD_SIZE` instead, and `MODEL_TRACE_RUN` names the run.
//!
//! The logits (`#[trace_logits]` on [`OutputHead::logits`]) are recorded outside any layer, as
//! the layer one past the highest layer index of their pass: 30 on the last of SmolLM2's stages,
//! as in the one-rank trace, because the stage's blocks carry their model-wide indices. Attention,
//! KV-cache and quantization records take their enclosing layer's index, so they need nothing
//! more. The logit lens is not computed here: it reads every layer through the final head, which
//! only the last stage holds.
//!
//! ```no_run
//! use model_trace::{ModelTracerConfig, Session};
//! use smollm::generate::{greedy, load};
//! use smollm::pipeline::Pipeline;
//!
//! let (model, tokenizer) = load(&smollm::weights::find_gguf()?)?;
//! // Blocks 0-14 on one thread and 15-29 on another, writing smollm.rank0.ndjson and
//! // smollm.rank1.ndjson.
//! let mut pipeline = Pipeline::spawn_traced(model, 2, |rank, stages| {
//!     Session::builder(ModelTracerConfig::lightweight())
//!         .trace_file("smollm.ndjson")
//!         .rank(rank, stages)
//!         .start()
//! })?;
//! let generation = greedy(&mut pipeline, &tokenizer, "The capital of France is", 8)?;
//! println!("{}", generation.text);
//! for stage in pipeline.finish()? {
//!     println!("rank {} (layers {:?}): {:?}", stage.rank, stage.layers, stage.trace_file);
//! }
//! # Ok::<(), smollm::Error>(())
//! ```

use crate::batch::Columns;
use crate::model::{continue_sequence, embed, last_position, Block, KvCache, Model, OutputHead};
use candle_core::{Result, Tensor};
use model_trace::{trace_model, ModelTracer, RecordError, Session, SessionError};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

/// What flows through the pipeline: token ids into the first stage, hidden states between
/// stages, logits out of the last.
#[derive(Debug, Clone)]
pub enum Activation {
    /// The sequence's tokens from the pass's position on.
    Tokens(Vec<u32>),
    /// The residual stream `[1, seq, hidden]` after the previous stage's last block.
    Hidden(Tensor),
    /// The logits `[vocab]` for the token after the last one.
    Logits(Tensor),
}

impl Activation {
    fn describe(&self) -> &'static str {
        match self {
            Self::Tokens(_) => "token ids",
            Self::Hidden(_) => "hidden states",
            Self::Logits(_) => "logits",
        }
    }
}

/// A run of consecutive blocks with their KV caches: one rank of a pipeline. The first stage also
/// embeds the tokens, the last one also computes the logits.
pub struct Stage {
    rank: usize,
    stages: usize,
    layers: Range<usize>,
    /// The token embeddings, on the first stage only.
    embeddings: Option<Tensor>,
    blocks: Vec<Block>,
    caches: Vec<KvCache>,
    /// The final norm and head, on the last stage only.
    output: Option<OutputHead>,
}

impl Stage {
    /// One forward pass of this stage over the sequence's positions from `position` on: token
    /// ids in on the first stage and the previous stage's hidden states on the others; hidden
    /// states out, logits out of the last. `position == 0` starts a new sequence (the stage's
    /// KV caches are cleared); otherwise `position` must equal the number of positions cached.
    ///
    /// Traced as a forward pass at `position` of the thread it runs on (see the module docs).
    #[trace_model(position = position, name = "stage")]
    pub fn forward(&mut self, input: Activation, position: usize) -> Result<Activation> {
        let mut x = match (input, &self.embeddings) {
            (Activation::Tokens(tokens), Some(embeddings)) => embed(embeddings, &tokens, 1)?,
            (Activation::Hidden(hidden), None) => hidden,
            (input, _) => candle_core::bail!(
                "stage {} (layers {}) does not take {}",
                self.rank,
                LayerSpan(&self.layers),
                input.describe()
            ),
        };
        continue_sequence(&mut self.caches, position)?;
        for (block, cache) in self.blocks.iter().zip(&mut self.caches) {
            x = block.forward(&x, Columns::unpadded(position), cache)?;
        }
        match &self.output {
            Some(output) => Ok(Activation::Logits(
                output.logits(&last_position(&x)?)?.squeeze(0)?,
            )),
            None => Ok(Activation::Hidden(x)),
        }
    }

    /// The indices of the blocks it runs.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// [`Stage::forward`] on a step, its failure said with the stage's name.
    fn step(&mut self, step: Step) -> Message {
        let position = step.position;
        match self.forward(step.activation, position) {
            Ok(activation) => Ok(Step {
                position,
                activation,
            }),
            Err(source) => Err(PipelineError::Stage {
                rank: self.rank,
                layers: self.layers(),
                source,
            }),
        }
    }
}

/// Cuts `model` into `stages` stages of consecutive blocks, as evenly as they go: of `L` blocks,
/// stage `r` holds blocks `r·L/stages` up to, not including, `(r+1)·L/stages`. Two stages of
/// SmolLM2's 30 blocks hold blocks 0-14 and 15-29.
///
/// # Errors
///
/// `stages` is 0 or more than the model's blocks, or the model's logit lens is on.
pub fn split(model: Model, stages: usize) -> std::result::Result<Vec<Stage>, PipelineError> {
    if model.logit_lens {
        return Err(PipelineError::LogitLens);
    }
    let parts = model.into_parts();
    let layers = parts.blocks.len();
    if stages == 0 || stages > layers {
        return Err(PipelineError::Stages { stages, layers });
    }
    let mut blocks = parts.blocks.into_iter();
    let mut caches = parts.caches.into_iter();
    let mut embeddings = Some(parts.embeddings);
    let mut output = Some(parts.output);
    Ok((0..stages)
        .map(|rank| {
            let range = rank * layers / stages..(rank + 1) * layers / stages;
            Stage {
                rank,
                stages,
                embeddings: if rank == 0 { embeddings.take() } else { None },
                blocks: blocks.by_ref().take(range.len()).collect(),
                caches: caches.by_ref().take(range.len()).collect(),
                output: if rank + 1 == stages {
                    output.take()
                } else {
                    None
                },
                layers: range,
            }
        })
        .collect())
}

/// Starts a rank's session, on the rank's thread, given the rank and the number of stages.
type StartSession =
    dyn Fn(usize, usize) -> std::result::Result<Session, SessionError> + Send + Sync;

/// One forward step as it goes from stage to stage.
struct Step {
    position: usize,
    activation: Activation,
}

/// What a stage hands on: the step, or why it failed (passed on to the end by the later stages).
type Message = std::result::Result<Step, PipelineError>;

/// The model run as a pipeline: each [`Stage`] on a thread of its own, for as long as the
/// pipeline lives. [`Pipeline::forward`] is [`Model::forward`]'s counterpart and computes the
/// same logits, bit for bit; [`crate::generate::greedy`] decodes with either. One step is in
/// flight at a time, so the stages take turns: the pipeline shows how such a model is traced,
/// not how it is made fast.
///
/// A stage that fails returns its error from `forward`; a stage's thread that panics stops the
/// pipeline, and `forward` returns [`PipelineError::Panicked`] rather than waiting. Dropping the
/// pipeline ends the stages' threads and their sessions (their trace files are complete);
/// [`Pipeline::finish`] does the same and returns what each recorded.
pub struct Pipeline {
    /// Into the first stage; `None` once the pipeline stopped.
    input: Option<Sender<Message>>,
    /// Out of the last stage.
    output: Receiver<Message>,
    workers: Vec<Worker>,
}

/// A stage's thread.
struct Worker {
    rank: usize,
    layers: Range<usize>,
    thread: JoinHandle<StageReport>,
}

/// What a stage's thread leaves when the pipeline ends.
pub struct StageReport {
    pub rank: usize,
    /// The indices of the blocks it ran.
    pub layers: Range<usize>,
    /// The trace file its session wrote, if any.
    pub trace_file: Option<PathBuf>,
    /// Its session's tracer and the errors it did not record
    /// ([`Session::finish_with_errors`]); `None` for an untraced pipeline.
    pub traced: Option<(ModelTracer, Vec<RecordError>)>,
}

impl Pipeline {
    /// Cuts `model` into `stages` stages ([`split`]) and starts a thread for each, untraced.
    ///
    /// # Errors
    ///
    /// As [`split`], or a thread that cannot be started.
    pub fn spawn(model: Model, stages: usize) -> std::result::Result<Self, PipelineError> {
        Self::start(model, stages, None)
    }

    /// As [`Pipeline::spawn`], each stage's thread starting its own session first:
    /// `start_session(rank, stages)` is called on the thread of stage `rank`, and should give
    /// the session its rank ([`SessionBuilder::rank`](model_trace::SessionBuilder::rank)).
    /// Returns once every session has started.
    ///
    /// # Errors
    ///
    /// As [`Pipeline::spawn`], or a session that did not start ([`PipelineError::Session`];
    /// the other stages are stopped).
    pub fn spawn_traced(
        model: Model,
        stages: usize,
        start_session: impl Fn(usize, usize) -> std::result::Result<Session, SessionError>
            + Send
            + Sync
            + 'static,
    ) -> std::result::Result<Self, PipelineError> {
        Self::start(model, stages, Some(Arc::new(start_session)))
    }

    fn start(
        model: Model,
        stages: usize,
        start_session: Option<Arc<StartSession>>,
    ) -> std::result::Result<Self, PipelineError> {
        let (input, mut inbox) = mpsc::channel();
        let (ready, started) = mpsc::channel();
        let mut workers = Vec::with_capacity(stages);
        for stage in split(model, stages)? {
            let (outbox, next_inbox) = mpsc::channel();
            let (rank, layers) = (stage.rank, stage.layers());
            let start_session = start_session.clone();
            let ready = ready.clone();
            let spawned = thread::Builder::new()
                .name(format!("stage-{rank}"))
                .spawn(move || run_stage(stage, start_session, ready, inbox, outbox));
            match spawned {
                Ok(thread) => workers.push(Worker {
                    rank,
                    layers,
                    thread,
                }),
                Err(error) => {
                    drop(input);
                    join(workers);
                    return Err(PipelineError::Spawn(error));
                }
            }
            inbox = next_inbox;
        }
        drop(ready);
        let mut pipeline = Self {
            input: Some(input),
            output: inbox,
            workers,
        };
        for _ in 0..pipeline.workers.len() {
            match started.recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    pipeline.stop();
                    return Err(error);
                }
                Err(mpsc::RecvError) => return Err(pipeline.stop()),
            }
        }
        Ok(pipeline)
    }

    /// Runs `tokens`, the sequence's tokens from `position` on, through every stage and returns
    /// the logits `[vocab]` for the token after the last one. `position == 0` starts a new
    /// sequence; otherwise `position` must equal the number of positions already cached.
    ///
    /// # Errors
    ///
    /// A stage's computation failed ([`PipelineError::Stage`]: the pipeline can go on, from
    /// position 0), a stage's thread panicked ([`PipelineError::Panicked`]: the pipeline is
    /// stopped) or the pipeline was stopped before ([`PipelineError::Stopped`]).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        position: usize,
    ) -> std::result::Result<Tensor, PipelineError> {
        let Some(input) = &self.input else {
            return Err(PipelineError::Stopped);
        };
        let step = Step {
            position,
            activation: Activation::Tokens(tokens.to_vec()),
        };
        if input.send(Ok(step)).is_err() {
            return Err(self.stop());
        }
        match self.output.recv() {
            Ok(Ok(Step {
                activation: Activation::Logits(logits),
                ..
            })) => Ok(logits),
            Ok(Ok(step)) => Err(self.last_stage_error(format!(
                "the last stage returned {}, not logits",
                step.activation.describe()
            ))),
            Ok(Err(error)) => Err(error),
            Err(mpsc::RecvError) => Err(self.stop()),
        }
    }

    /// Ends every stage's thread and session, and returns what each recorded, by rank.
    ///
    /// # Errors
    ///
    /// A stage's thread panicked, or the pipeline had already stopped.
    pub fn finish(mut self) -> std::result::Result<Vec<StageReport>, PipelineError> {
        if self.input.take().is_none() {
            return Err(PipelineError::Stopped);
        }
        join(std::mem::take(&mut self.workers))
            .into_iter()
            .collect()
    }

    /// Stops every stage after one stopped answering, and says why: the first stage whose
    /// thread panicked.
    fn stop(&mut self) -> PipelineError {
        self.input = None;
        join(std::mem::take(&mut self.workers))
            .into_iter()
            .find_map(std::result::Result::err)
            .unwrap_or(PipelineError::Stopped)
    }

    fn last_stage_error(&self, message: String) -> PipelineError {
        let (rank, layers) = self
            .workers
            .last()
            .map_or((0, 0..0), |worker| (worker.rank, worker.layers.clone()));
        PipelineError::Stage {
            rank,
            layers,
            source: candle_core::Error::Msg(message),
        }
    }
}

impl Drop for Pipeline {
    /// Ends the stages' threads, so that their sessions have written their trace files whole
    /// before the program goes on (or exits).
    fn drop(&mut self) {
        self.input = None;
        join(std::mem::take(&mut self.workers));
    }
}

/// A stage's thread: starts the rank's session, says whether it started, then runs every step
/// that arrives until the pipeline closes its input or the next stage is gone.
fn run_stage(
    mut stage: Stage,
    start_session: Option<Arc<StartSession>>,
    ready: Sender<std::result::Result<(), PipelineError>>,
    inbox: Receiver<Message>,
    outbox: Sender<Message>,
) -> StageReport {
    let (rank, layers) = (stage.rank, stage.layers());
    let session = match start_session
        .map(|start| start(rank, stage.stages))
        .transpose()
    {
        Ok(session) => session,
        Err(source) => {
            // The pipeline waits for this answer; if it is gone, there is nobody to tell.
            let _ = ready.send(Err(PipelineError::Session { rank, source }));
            return StageReport {
                rank,
                layers,
                trace_file: None,
                traced: None,
            };
        }
    };
    let _ = ready.send(Ok(()));
    drop(ready);
    let trace_file = session
        .as_ref()
        .and_then(|session| session.trace_file().map(Path::to_path_buf));
    for message in inbox {
        let message = message.and_then(|step| stage.step(step));
        if outbox.send(message).is_err() {
            break;
        }
    }
    StageReport {
        rank,
        layers,
        trace_file,
        traced: session.map(Session::finish_with_errors),
    }
}

/// Waits for the threads of `workers` (whose input must be closed) and says how each ended.
fn join(workers: Vec<Worker>) -> Vec<std::result::Result<StageReport, PipelineError>> {
    workers
        .into_iter()
        .map(|worker| {
            worker
                .thread
                .join()
                .map_err(|panic| PipelineError::Panicked {
                    rank: worker.rank,
                    layers: worker.layers,
                    message: panic_message(panic.as_ref()),
                })
        })
        .collect()
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Why a pipeline could not start or could not compute.
#[derive(Debug)]
pub enum PipelineError {
    /// `stages` is 0 or more than the model's `layers` blocks.
    Stages { stages: usize, layers: usize },
    /// The model's logit lens is on: it needs every layer and the final head in one place.
    LogitLens,
    /// A stage's thread could not be started.
    Spawn(std::io::Error),
    /// A rank's session did not start.
    Session { rank: usize, source: SessionError },
    /// A stage's forward pass failed.
    Stage {
        rank: usize,
        layers: Range<usize>,
        source: candle_core::Error,
    },
    /// A stage's thread panicked; the pipeline is stopped.
    Panicked {
        rank: usize,
        layers: Range<usize>,
        message: String,
    },
    /// The pipeline had stopped, after an earlier failure.
    Stopped,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stages { stages, layers } => write!(
                f,
                "cannot cut {layers} layers into {stages} stages: a pipeline of them has 1 to {layers}"
            ),
            Self::LogitLens => f.write_str(
                "the logit lens needs every layer and the final head in one place; \
                 it is not computed by a pipeline",
            ),
            Self::Spawn(error) => write!(f, "cannot start a stage's thread: {error}"),
            Self::Session { rank, source } => {
                write!(f, "the session of rank {rank} did not start: {source}")
            }
            Self::Stage {
                rank,
                layers,
                source,
            } => write!(f, "stage {rank} (layers {}): {source}", LayerSpan(layers)),
            Self::Panicked {
                rank,
                layers,
                message,
            } => write!(
                f,
                "stage {rank} (layers {}) panicked: {message}",
                LayerSpan(layers)
            ),
            Self::Stopped => f.write_str("the pipeline stopped after an earlier failure"),
        }
    }
}

impl std::error::Error for PipelineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Spawn(error) => Some(error),
            Self::Session { source, .. } => Some(source),
            Self::Stage { source, .. } => Some(source),
            Self::Stages { .. } | Self::LogitLens | Self::Panicked { .. } | Self::Stopped => None,
        }
    }
}

/// A range of layer indices as people write it: `15-29`.
struct LayerSpan<'a>(&'a Range<usize>);

impl fmt::Display for LayerSpan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => f.write_str("none"),
            1 => write!(f, "{}", self.0.start),
            _ => write!(f, "{}-{}", self.0.start, self.0.end - 1),
        }
    }
}

//! See what a transformer computes, layer by layer, by annotating the forward functions it
//! already has.
//!
//! Put an attribute on each forward function ([`trace_model`], [`trace_layer`],
//! [`trace_attention`], [`trace_logits`], [`trace_kv_cache`], [`trace_quant`],
//! [`trace_router`]) and an inline macro where a value has no function of its own
//! ([`trace_tensor!`], [`trace_attention_value!`], [`trace_logits_value!`],
//! [`trace_router_value!`]). Then run the model inside a
//! [`Session`]: every annotated call on that thread records tensor statistics, and at the end of
//! each forward pass the session flags NaN, Inf, exploding and vanishing activations. What it
//! records goes to its sinks: the in-memory [`ModelTracer`] that [`Session::finish`] returns,
//! a trace file ([`SessionBuilder::trace_file`], or `MODEL_TRACE_OUT=path` with no code change)
//! that [`TraceReader`] and the `model-trace` tools read back, and sinks of your own
//! ([`TraceSink`]). A session that writes a file keeps only the summary in memory, so a long
//! run costs no more memory than a short one ([`SessionBuilder::in_memory`] keeps the records
//! too). (A layer that barely changes its input, residual dominance, is flagged only
//! from an exact ratio that code recording by hand computes with
//! [`LayerActivationTrace::record_residual`]; the annotations record statistics only.)
//!
//! # Compiled out unless asked for
//!
//! Tracing is compiled in by this crate's `enabled` feature. A crate that uses the macros
//! forwards a feature of its own and leaves it off by default; a binary or a test turns it on:
//!
//! ```toml
//! [dependencies]
//! model-trace = "0.1"   # not on crates.io yet: `{ path = "../model-trace" }`, a checkout of it
//!
//! [features]
//! trace = ["model-trace/enabled"]
//! ```
//!
//! Without `enabled`, every attribute returns the function it was given, and the inline macros
//! expand to code that never runs: the program is the same as one without the annotations. An
//! attribute with expressions among its arguments adds one statement in front of the body, a
//! closure that is never called and holds those expressions, converted as the traced build
//! converts them. So the arguments are checked alike in both builds (a misspelt variable or a
//! `position` that is not an integer is a compile error either way), and what only they use
//! (`capacity = self.max_len`, `bytes = self.bytes()`) counts as used, with no `dead_code` or
//! `unused_variables` warning, while no code is generated for them. The session and registry
//! API exists either way, so `main` compiles either way; a session then records nothing,
//! [`tracepoints()`] is empty, the summary of a session's tracer says in one line that tracing
//! is compiled out, and [`ENABLED`] is `false`.
//!
//! A function whose body does not parse yet (a missing `;` while editing) is handed back to the
//! compiler as it is, so the compiler's error is the only one.
//!
//! # A model, annotated
//!
//! A two-block model on `Vec<f32>`. [`TraceTensor`] reads `[f32]`, `Vec<f32>`, arrays,
//! [`TensorRef`] (a flat slice with a shape), and, with the `candle`, `burn` and `ndarray`
//! features, `candle_core::Tensor`, burn's float `burn_tensor::Tensor<D>` (any backend; taken by
//! value as burn code takes it) and `ndarray` arrays. Arguments that are not tensors (the position,
//! a config) are ignored without being listed. With the `cuda` feature, candle's CUDA tensors are
//! summarised on the GPU and read back once per forward pass, when the `#[trace_model]` function
//! returns (see [`TraceTensor::start_summary`]); the pass's records reach the sinks then.
//!
//! ```
//! use model_trace::{
//!     trace_attention, trace_layer, trace_logits, trace_model, trace_tensor, ModelTracerConfig,
//!     Session,
//! };
//!
//! struct Block {
//!     gain: f32,
//! }
//!
//! impl Block {
//!     /// Input: `x`, the first tensor argument. Output: the returned vector.
//!     #[trace_layer]
//!     fn forward(&self, x: &[f32]) -> Vec<f32> {
//!         let normed = rms_norm(x);
//!         trace_tensor!("attn_in", &normed); // a stage of this layer's record
//!         let probs = self.attention(&normed);
//!         let mixed: f32 = probs.iter().zip(&normed).map(|(p, v)| p * v).sum();
//!         x.iter().map(|v| v + self.gain * mixed).collect()
//!     }
//!
//!     /// One query row over four keys; recorded as attention of the enclosing layer.
//!     #[trace_attention]
//!     fn attention(&self, x: &[f32]) -> Vec<f32> {
//!         let exp: Vec<f32> = x.iter().map(|v| v.exp()).collect();
//!         let sum: f32 = exp.iter().sum();
//!         exp.iter().map(|v| v / sum).collect()
//!     }
//! }
//!
//! fn rms_norm(x: &[f32]) -> Vec<f32> {
//!     let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
//!     x.iter().map(|v| v / (rms + 1e-6)).collect()
//! }
//!
//! struct Model {
//!     blocks: Vec<Block>,
//! }
//!
//! impl Model {
//!     /// One forward pass: layers called inside it are numbered 0, 1, ... in call order.
//!     #[trace_model(position = position)]
//!     fn forward(&self, tokens: &[f32], position: usize) -> Vec<f32> {
//!         let mut hidden = tokens.to_vec();
//!         for block in &self.blocks {
//!             hidden = block.forward(&hidden);
//!         }
//!         self.head(&hidden, position)
//!     }
//!
//!     /// The logits `[vocab]`: ranks of the tracked tokens (the top 5 when none are given).
//!     #[trace_logits]
//!     fn head(&self, hidden: &[f32], position: usize) -> Vec<f32> {
//!         hidden.iter().map(|v| v * (1 + position) as f32).collect()
//!     }
//! }
//!
//! let model = Model { blocks: vec![Block { gain: 0.5 }, Block { gain: 0.25 }] };
//! # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
//! # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
//! let session = Session::start(ModelTracerConfig::full()); // this thread only
//! let logits = model.forward(&[0.5, -1.0, 2.0, 0.1], 0);
//! let tracer = session.finish();
//!
//! // Tracing never changes what the model computes.
//! assert_eq!(logits.len(), 4);
//! println!("{}", tracer.summary());
//!
//! if model_trace::ENABLED {
//!     let pass = &tracer.activation_traces()[0];
//!     assert_eq!(pass.layers.len(), 2);
//!     assert_eq!(pass.layers[1].layer_idx, 1);
//!     assert_eq!(pass.layers[0].input_stats.count, 4);
//!     assert_eq!(pass.layers[0].stage("attn_in").map(|s| s.count), Some(4));
//!     assert!(!pass.has_anomaly);
//!     // One attention row per layer, with the layer it was recorded in.
//!     let attention_layers: Vec<usize> =
//!         tracer.attention_traces().iter().map(|t| t.layer_idx).collect();
//!     assert_eq!(attention_layers, [0, 1]);
//!     assert_eq!(tracer.logit_traces().len(), 1);
//!     // Every annotation is a tracepoint, listed before anything runs.
//!     assert_eq!(model_trace::tracepoints().len(), 5);
//! } else {
//!     assert!(tracer.activation_traces().is_empty());
//!     assert!(model_trace::tracepoints().is_empty());
//! }
//! ```
//!
//! # Tracepoints
//!
//! Each annotation registers one static tracepoint (kind, name, function, module, file, line).
//! [`tracepoints()`] lists them sorted, one line each, so a program can show what it can trace
//! at startup:
//!
//! ```text
//! model      model:forward  (my_model::model::forward at src/model.rs:40)
//! layer      layer:forward@model.rs:12  (my_model::model::forward at src/model.rs:12)
//! layer      layer:forward@model.rs:25  (my_model::model::forward at src/model.rs:25)
//! tensor     attn_in  (my_model::model::forward at src/model.rs:15)
//! ```
//!
//! A session can be limited to some of them: [`Session::with_filter`] takes patterns such as
//! `layer:*` or `attention:*` or a name, and [`Session::start`] reads the same patterns from the
//! `MODEL_TRACE` environment variable (the syntax and its rules are [`TraceFilter`]'s: `layer:*`
//! keeps the stages of the layers it admits, `-model:draft` suspends tracing while the `draft`
//! model's forward pass runs). A pattern that matches no tracepoint is reported when the
//! session starts.
//!
//! # Golden traces in tests
//!
//! With `enabled`, `golden::check` answers "did my change move the numbers, and where?" in
//! `cargo test`: it runs a closure (a forward pass, a few greedy tokens) in a session of its
//! own, compares every layer's stages, attention probabilities and logits with a golden file
//! committed beside the test, and panics naming the first tensor that differs (pass, layer,
//! stage), with this run's trace written beside the golden file and the `model-trace diff`
//! command that compares them. `MODEL_TRACE_BLESS=1 cargo test` writes the golden files; a
//! missing one is written and fails the test, except under CI. Bit-exact on the machine that
//! blessed the file, by statistics within a stated tolerance on another one (the `golden`
//! module, with `enabled`):
//!
//! ```no_run
//! # #[cfg(feature = "enabled")] {
//! # fn generate(_: &str, _: usize) -> String { String::new() }
//! let text = model_trace::golden::check("tests/golden/paris.ndjson", || {
//!     generate("The capital of France is", 4)
//! });
//! # }
//! ```
//!
//! # The model against itself
//!
//! With `enabled`, `consistency::Consistency` checks, in `cargo test` and with no reference
//! model, what any correct transformer obeys: the same tokens computed two ways agree to
//! rounding, position by position. One prefill pass against a prefill and decode steps, a
//! prompt whole against in chunks, a batch of left-padded prompts against each prompt alone:
//! each closure runs in a session that records every layer tensor row by row
//! (`ModelTracerConfig::row_summaries`), and the check panics naming the first position, layer
//! and stage past tolerance (with the pass of each side), which is where a KV-cache, rotary
//! offset, mask or padding bug first shows. The model says where each pass begins
//! (`#[trace_model(position = ..)]`) and its tokens (`tokens = ..`), and records its layer
//! tensors as `[seq, width]` or `[batch, seq, width]` (the module's docs say why and how).
//! `model-trace diff` does the same with two trace
//! files written with rows (by position by itself when their passes differ; `--batch` for a
//! batch):
//!
//! ```no_run
//! # #[cfg(feature = "enabled")] {
//! # struct Model;
//! # impl Model { fn clear_cache(&mut self) {} fn forward(&mut self, _: &[u32], _: usize) {} }
//! # let model = std::cell::RefCell::new(Model);
//! # let tokens = vec![0_u32; 600];
//! use model_trace::consistency::Consistency;
//!
//! let agreement = Consistency::new("prefill 590 + 10 decode steps = one pass").check(
//!     || {
//!         let mut model = model.borrow_mut();
//!         model.clear_cache();
//!         model.forward(&tokens, 0);
//!     },
//!     || {
//!         let mut model = model.borrow_mut();
//!         model.clear_cache();
//!         model.forward(&tokens[..590], 0);
//!         for (i, &token) in tokens[590..].iter().enumerate() {
//!             model.forward(&[token], 590 + i);
//!         }
//!     },
//! );
//! assert!(agreement.comparison.max_error() < 1e-5);
//! # }
//! ```
//!
//! # What goes wrong is said
//!
//! Tracing never panics and never changes what the model computes, so what it cannot do is
//! reported instead: a value it cannot read (a `trace_tensor!` outside any layer, a shape it
//! cannot interpret) is a record error, counted by the summary, listed by [`Session::errors`]
//! and reported in one line on stderr when the session ends with [`Session::finish`]
//! ([`Session::finish_with_errors`] returns them and prints nothing). What was recorded but
//! probably not as meant is a warning, printed on stderr when it first happens and listed by
//! [`Session::warnings`]: layers recorded outside any `#[trace_model]` function (they are
//! counted as one implicit pass), a filter pattern that matches nothing. Logits with a NaN, Inf
//! or exploding value are an anomaly of their pass, like a broken layer.
//!
//! A setting of the environment that cannot be used (a `MODEL_TRACE` that does not parse, a
//! `MODEL_TRACE_OUT` that cannot be created, ...) does not stop the program either:
//! [`Session::start`] reports it in one line on stderr and in [`Session::errors`], and the
//! session goes on without it. A [`SessionBuilder`]'s `start` does the same with what it reads
//! from the environment, and returns an error only for what the program gave it in code;
//! `try_start` ([`Session::try_start`], [`SessionBuilder::try_start`]) refuses the
//! environment's values too.
//!
//! An attribute cannot see the type of its `impl` block, so `Model::forward` and
//! `Block::forward` are both the function `forward` of their module. The second column of the
//! listing is what tells tracepoints apart: the [selector](Tracepoint::selector), the shortest
//! pattern that selects that tracepoint alone, which is its name when no other tracepoint has
//! it, else `kind:name`, else `kind:name@file:line`. Copy it into `MODEL_TRACE`, or give the
//! annotation a name of its own (`#[trace_layer(name = "mlp")]`).
//!
//! An inline macro cannot see its function either: its tracepoint's `function` is the innermost
//! annotated function whose lines (from `fn` to the last identifier of its body) hold the macro,
//! closures included, and is empty for a macro outside any annotated function. (A function
//! without an annotation nested inside an annotated one is not told apart from it.)
//!
//! # Which functions can be annotated
//!
//! Free functions, inherent and trait-impl methods (`self`, `&self`, `&mut self`,
//! `self: Box<Self>`), trait default methods, generic functions (a generic `T` is traced when
//! it is bounded by [`TraceTensor`] and skipped otherwise), `impl Trait` and `mut` parameters,
//! lifetimes, `where` clauses, `unsafe fn` and `extern "C" fn`. The output is the return value
//! seen through `Result` and `Option` (also an alias such as `candle_core::Result<T>`): an
//! `Err` or `None` records no output.
//!
//! The body stays in the function: it is never moved into a closure. An early `return` becomes
//! a `break` out of the block that holds the body, so its value is recorded too; `?` leaves
//! directly, and a drop guard still closes the layer or the pass, also when the body panics.
//!
//! Rejected at compile time:
//! - `async fn`. A session is per thread, and a future may move between threads between two
//!   polls; annotate the synchronous functions the future calls.
//! - `const fn`: recording happens at run time.
//!
//! Limits worth knowing:
//! - Parameters named `_x` and parameters bound by a pattern (`(a, b): (f32, f32)`) are not
//!   looked at for the input.
//! - A `return` written inside a macro's arguments (`my_macro!(return x)`) leaves without
//!   recording the output; the guard still closes the record.
//! - Generated code names this crate `::model_trace`: depend on it under that name.

pub use trace_runtime::*;

/// Marks one forward pass of a model: begins a pass on entry, ends it on return (also on `?`
/// or a panic) and then runs anomaly detection over the layers recorded inside it.
///
/// Arguments, all optional:
/// - `position = EXPR`: the position of the pass (any integer type); by default the passes of
///   the session are counted 0, 1, 2, ...
/// - `tokens = EXPR`: the token ids the pass consumes, a borrow of them ([`PassTokens`]:
///   `&[u32]`, `&Vec<i64>`, an array of any integer type, and with the `candle` or `burn`
///   feature an integer `&Tensor` (burn's `&Tensor<1, Int>` or `&Tensor<2, Int>`: a burn model
///   that takes its ids by value writes `tokens = &ids`), `[seq]` or `[batch, seq]`, whose rows
///   are taken one after another),
///   written as `tokens` in the pass's `pass_begin` event, so that a reference implementation
///   can be run on exactly these tokens; absent when not given. Read when the pass begins, and
///   only when it is traced (a device's tensor is copied to the host then). Ids that cannot be
///   read (a float candle tensor, another rank, an id outside `u32`) are an error of the
///   session, [`Session::errors`], and the pass begins without them; a float burn tensor is a
///   compile error (`PassTokens` is implemented for burn's `Int` tensors only).
/// - `name = "..."`: the tracepoint's name; by default the function's name.
///
/// Compiled out, `position` and `tokens` are type-checked and never evaluated.
///
/// A `#[trace_model]` nested in another joins the pass already open. Layers recorded without
/// one are counted as one implicit pass, with a warning: annotate the forward function.
///
/// ```
/// use model_trace::{trace_layer, trace_model, Event, ModelTracerConfig, Session, TraceReader};
///
/// #[trace_layer]
/// fn block(x: &[f32]) -> Vec<f32> {
///     x.iter().map(|v| v * 0.5).collect()
/// }
///
/// #[trace_model(position = start, tokens = ids, name = "decoder")]
/// fn decode(embeddings: &[f32], ids: &[u32], start: usize) -> Vec<f32> {
///     assert!(start < 2048);
///     block(&block(embeddings))
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// # let dir = std::env::temp_dir().join(format!("model-trace-doc-tokens-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let path = dir.join("decode.ndjson");
/// let session = Session::builder(ModelTracerConfig::lightweight())
///     .trace_file(&path)
///     .in_memory(true)
///     .start()
///     .expect("the file can be created");
/// decode(&[1.0, 2.0], &[1, 9152], 7);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     assert_eq!(tracer.activation_traces()[0].position, 7);
///     assert_eq!(tracer.activation_traces()[0].layers.len(), 2);
///     // {"event":"pass_begin",...,"position":7,...,"tokens":[1,9152]}
///     let tokens = TraceReader::open(&path).unwrap().find_map(|event| match event {
///         Ok(Event::PassBegin(begin)) => begin.tokens,
///         _ => None,
///     });
///     assert_eq!(tokens, Some(vec![1, 9152]));
/// }
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
///
/// # Pipeline parallelism
///
/// A model whose layers are split across threads or processes, each rank running a stage of
/// consecutive layers and handing its hidden states to the next, is traced one rank at a time:
/// a session per rank, started on the rank's thread with [`SessionBuilder::rank`] (or
/// [`SessionBuilder::rank_from_env`] with one process per rank), so each rank writes its own
/// file (`STEM.rank{r}.EXT`) and says its rank in the header. For the ranks' traces to line up
/// with the trace of the whole model on one thread:
/// - annotate each rank's stage function, the function that runs the rank's share of a forward
///   step, with its own `#[trace_model(position = ...)]`, at the position the whole model's
///   forward function would have. The rank's thread never enters that function, and without an
///   annotation of its own every layer it records would fall into one implicit pass;
/// - give the layers their `index` ([`trace_layer`]): numbered by call order, the layers of a
///   rank that runs layers 2 and 3 would be recorded as 0 and 1.
///
/// Logits outside any layer then belong to the layer one past the highest index of the rank's
/// pass, as on one thread.
///
/// ```
/// use model_trace::{trace_layer, trace_model, ModelTracer, ModelTracerConfig, Session};
///
/// struct Block {
///     index: usize,
/// }
///
/// impl Block {
///     #[trace_layer(index = self.index)]
///     fn forward(&self, x: &[f32]) -> Vec<f32> {
///         x.iter().map(|v| v + 1.0).collect()
///     }
/// }
///
/// /// One rank's share of a forward step: two of the model's four blocks.
/// #[trace_model(position = position)]
/// fn stage(blocks: &[Block], x: &[f32], position: usize) -> Vec<f32> {
///     blocks.iter().fold(x.to_vec(), |x, block| block.forward(&x))
/// }
///
/// // Rank `rank` of 2 on a thread of its own, with its own session.
/// let run_rank = |rank: usize, x: Vec<f32>| {
///     std::thread::spawn(move || {
///         let blocks: Vec<Block> = (2 * rank..2 * rank + 2).map(|index| Block { index }).collect();
///         let session = Session::builder(ModelTracerConfig::lightweight())
///             .rank(rank, 2)
///             .start()
///             .expect("rank below the world size");
///         let hidden = stage(&blocks, &x, 0);
///         (hidden, session.finish())
///     })
///     .join()
///     .expect("the rank's thread")
/// };
/// let (hidden, rank_0) = run_rank(0, vec![1.0, 2.0]);
/// let (output, rank_1) = run_rank(1, hidden);
/// assert_eq!(output, [5.0, 6.0]);
/// if model_trace::ENABLED {
///     let layers = |tracer: &ModelTracer| -> Vec<usize> {
///         let pass = &tracer.activation_traces()[0];
///         pass.layers.iter().map(|layer| layer.layer_idx).collect()
///     };
///     assert_eq!(layers(&rank_0), [0, 1]);
///     assert_eq!(layers(&rank_1), [2, 3]);
/// }
/// ```
pub use trace_macros::trace_model;

/// Records one layer: statistics of its input and output, plus the stages
/// ([`trace_tensor!`]), attention and logits recorded while it runs, in one
/// [`LayerActivationTrace`].
///
/// Arguments, all optional:
/// - `index = EXPR`: the layer index (any integer type); by default the layer calls of the
///   current forward pass are numbered 0, 1, 2, ... in the order they are entered. Give it
///   when a forward pass may not run every layer from the first: a rank of a pipeline-parallel
///   model that runs layers 15 to 29 would otherwise record them as layers 0 to 14 (see
///   [`trace_model`] on pipeline parallelism). A
///   `#[trace_layer]` called inside another is a layer call of its own (the outer one is
///   numbered first) and takes the stages recorded while it runs; layers are filed when they
///   return, so the inner one comes first in the records. Give sub-blocks another annotation
///   (`trace_tensor!` stages) unless you want them counted as layers.
/// - `input = EXPR`: the input tensor; by default the first argument that is a tensor
///   (`self` is never the input).
/// - `name = "..."`: the tracepoint's name; by default the function's name.
///
/// ```
/// use model_trace::{trace_layer, ModelTracerConfig, Session};
///
/// struct Block {
///     index: u32,
///     weight: Vec<f32>,
/// }
///
/// impl Block {
///     #[trace_layer(index = self.index)]
///     fn forward(&self, x: &[f32]) -> Result<Vec<f32>, String> {
///         if x.len() != self.weight.len() {
///             return Err(format!("expected {} values", self.weight.len()));
///         }
///         Ok(x.iter().zip(&self.weight).map(|(a, w)| a * w).collect())
///     }
/// }
///
/// let block = Block { index: 3, weight: vec![2.0, 2.0] };
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::lightweight());
/// block.forward(&[1.0, 2.0]).unwrap();
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let layer = &tracer.activation_traces()[0].layers[0];
///     assert_eq!(layer.layer_idx, 3);
///     assert_eq!(layer.input_stats.mean, 1.5);
///     assert_eq!(layer.output_stats.mean, 3.0);
/// }
/// ```
pub use trace_macros::trace_layer;

/// Records the returned attention probabilities, read as `[.., heads, q_len, k_len]`:
/// per query row the top-k keys and their weights, the tail mass and the entropy (see
/// [`AttentionTraceConfig`]).
///
/// Arguments, all optional:
/// - `layer = EXPR`: the layer index (any integer type), evaluated after the body; by default
///   the enclosing [`trace_layer`] call.
/// - `name = "..."`: the tracepoint's name; by default the function's name.
///
/// A function that returns nothing is a compile error.
///
/// ```
/// use model_trace::{trace_attention, ModelTracerConfig, Session, TensorRef};
///
/// /// Two heads, one query, three keys.
/// #[trace_attention(layer = 0)]
/// fn attention<'a>(probs: &'a [f32], shape: &'a [usize]) -> Option<TensorRef<'a>> {
///     TensorRef::new(probs, shape).ok()
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::full());
/// attention(&[0.7, 0.2, 0.1, 0.1, 0.1, 0.8], &[2, 1, 3]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let rows = tracer.attention_traces();
///     assert_eq!(rows.len(), 2);
///     assert_eq!(rows[1].head_idx, 1);
///     assert_eq!(rows[1].top_k_positions[0], 2);
/// }
/// ```
pub use trace_macros::trace_attention;

/// Records the returned logits, read as `[.., vocab]`: the rank and logit of the tracked tokens
/// ([`ModelTracerConfig::tracked_tokens`], or the final top-k), so the layer where the
/// prediction was decided shows up across layers.
///
/// Arguments, all optional:
/// - `layer = EXPR`: the layer the logits belong to (any integer type), evaluated after the
///   body; by default the enclosing [`trace_layer`] call, or the final layer outside any.
/// - `name = "..."`: the tracepoint's name; by default the function's name.
///
/// A function that returns nothing is a compile error.
///
/// ```
/// use model_trace::{trace_logits, ModelTracerConfig, Session};
///
/// #[trace_logits]
/// fn lm_head(hidden: &[f32]) -> Vec<f32> {
///     hidden.iter().map(|v| v * 10.0).collect()
/// }
///
/// let mut config = ModelTracerConfig::full();
/// config.tracked_tokens = Some(vec![2]);
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(config);
/// lm_head(&[0.1, 0.3, 0.2]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let token = &tracer.logit_traces()[0].tracked_tokens[0];
///     assert_eq!(token.final_rank(), Some(1));
/// }
/// ```
pub use trace_macros::trace_logits;

/// Records a mixture-of-experts router's choice from the returned `(logits, weights, experts)`
/// (or an `Ok`/`Some` of it): per token the experts chosen and their weights, the runner-up
/// and how close the choice was (`margin` in scores, `logit_margin` in the logits' own units),
/// per call the tokens each expert received. One [`RouterEvent`] a call, in
/// [`ModelTracer::routers`] and the trace file (`router` events); recorded when
/// [`ModelTracerConfig::trace_router`] is on (in `full()` and `lightweight()`).
///
/// The three values are tensors ([`TraceTensor`]): the router logits `[.., experts]` (a
/// `[batch, seq, experts]` tensor is read batch-major, as transformers does), the weights and
/// the expert ids `[.., top_k]` with as many rows; ids may be integer tensors (candle's `U32`,
/// `I64`) or floats holding integers. Give the logits as the gate computed them, before any
/// softmax or sigmoid (`diff` compares a softmax router's logits up to a shift per token).
/// Shapes come from the tensors: a flat `Vec` or slice is one row, so give several tokens as a
/// [`TensorRef`] with their shape (`TensorRef::new(&logits, &[tokens, experts])`). A shape that
/// does not fit, an id that is no expert's, a row that names an expert twice or a value that is
/// not a tensor is a record error of the tracepoint, and the call is not recorded; an `Err` or
/// `None` records nothing.
///
/// Arguments, all optional, evaluated after the body:
/// - `scoring = softmax | sigmoid`: how the logits become the scores experts are chosen by
///   (default `softmax`; DeepSeek-V3 and GLM-4.5 use `sigmoid`).
/// - `bias = EXPR`: the selection bias, a tensor of one value per expert added to the scores to
///   choose experts and never to weight them (DeepSeek-V3's `e_score_correction_bias`).
/// - `groups = (GROUPS, TOP_GROUPS)`: grouped top-k (DeepSeek-V3's `n_group`, `topk_group`):
///   groups of consecutive expert ids, each scored by the sum of its two best scores, experts
///   chosen among the `TOP_GROUPS` best groups. Two integers of any type.
/// - `layer = EXPR`: the layer index (any integer type); by default the enclosing
///   [`trace_layer`] call.
/// - `name = "..."`: the tracepoint's name; by default the function's name.
///
/// The tracepoint's kind is `router` (`MODEL_TRACE_FILTER=router:*`). A function that returns
/// nothing is a compile error.
///
/// ```
/// use model_trace::{trace_router, ModelTracerConfig, Session, TensorRef};
///
/// /// Two tokens, four experts, two chosen per token (ids as `f32`, as a slice holds them).
/// #[trace_router(layer = 0)]
/// fn route<'a>(
///     logits: &'a [f32],
///     weights: &'a [f32],
///     experts: &'a [f32],
/// ) -> Option<(TensorRef<'a>, TensorRef<'a>, TensorRef<'a>)> {
///     let logits = TensorRef::new(logits, &[2, 4]).ok()?;
///     let weights = TensorRef::new(weights, &[2, 2]).ok()?;
///     let experts = TensorRef::new(experts, &[2, 2]).ok()?;
///     Some((logits, weights, experts))
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::full());
/// let logits = [2.0, 1.0, 0.5, -1.0, 0.0, 0.1, 3.0, 0.2];
/// route(&logits, &[0.7, 0.3, 0.8, 0.2], &[0.0, 1.0, 2.0, 3.0]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let call = &tracer.routers()[0];
///     assert_eq!((call.num_experts, call.top_k, call.load.clone()), (4, 2, vec![1, 1, 1, 1]));
///     let first = &call.tokens[0];
///     assert_eq!(first.runner_up, Some(2));
///     // softmax without a bias: half the logit gap of the weakest chosen and the runner-up
///     assert_eq!(first.logit_margin, 0.25);
/// }
/// ```
pub use trace_macros::trace_router;

/// Records one KV-cache step from expressions evaluated after the body, with `self` and the
/// arguments in scope.
///
/// Arguments, all optional, each an expression: `len` (valid positions), `capacity`, `bytes`,
/// `evictions` (during this call), of any integer type (converted to `usize` as `as` does),
/// `layer` (any integer type; by default the enclosing [`trace_layer`] call), and `hit_rate` in
/// `[0, 1]`, an `f32` or `f64`; `name = "..."` names the tracepoint. A value of another type is
/// a compile error naming the argument.
///
/// ```
/// use model_trace::{trace_kv_cache, ModelTracerConfig, Session};
///
/// struct KvCache {
///     keys: Vec<[f32; 4]>,
///     max_len: usize,
/// }
///
/// impl KvCache {
///     #[trace_kv_cache(
///         len = self.keys.len(),
///         capacity = self.max_len,
///         bytes = self.keys.len() * std::mem::size_of::<[f32; 4]>(),
///     )]
///     fn append(&mut self, key: [f32; 4]) {
///         self.keys.push(key);
///     }
/// }
///
/// let mut cache = KvCache { keys: Vec::new(), max_len: 8 };
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::lightweight());
/// cache.append([0.0; 4]);
/// cache.append([1.0; 4]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let steps = &tracer.kv_trace().steps;
///     assert_eq!(steps[1].valid_positions, 2);
///     assert_eq!(steps[1].cache_size_bytes, 32);
/// }
/// ```
pub use trace_macros::trace_kv_cache;

/// Records the error of a quantized computation against a full-precision reference: MSE, max
/// absolute error, cosine similarity and SNR of the returned value against what `reference`
/// returns for the same arguments.
///
/// Arguments:
/// - `reference = PATH` (required): a function taking the same arguments (`self` first for a
///   method, as in `Self::forward_f32`). It is called before the body, and only when
///   quantization tracing is on, so it costs nothing otherwise. What the function takes by
///   value (`self`, a burn tensor) the reference receives as a clone, so that the body still
///   has it: such an argument must be `Clone`.
/// - `quant = Q4_1`: the [`QuantType`] of the computation, by its ggml name; by default it is
///   guessed from the output's element type.
/// - `name = "..."`: the site's name in the record; by default the function's name.
///
/// ```
/// use model_trace::{trace_quant, ModelTracerConfig, QuantType, Session};
///
/// struct Linear {
///     weight: Vec<f32>,
/// }
///
/// impl Linear {
///     fn forward_f32(&self, x: &[f32]) -> Vec<f32> {
///         x.iter().zip(&self.weight).map(|(a, w)| a * w).collect()
///     }
///
///     /// Weights rounded to a 1/8 grid, standing in for a 4-bit kernel.
///     #[trace_quant(reference = Self::forward_f32, quant = Q4_1, name = "blk.0.ffn_up")]
///     fn forward(&self, x: &[f32]) -> Vec<f32> {
///         let q = |w: f32| (w * 8.0).round() / 8.0;
///         x.iter().zip(&self.weight).map(|(a, w)| a * q(*w)).collect()
///     }
/// }
///
/// let linear = Linear { weight: vec![0.3, -0.7, 0.05] };
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::full());
/// linear.forward(&[1.0, 1.0, 1.0]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let site = &tracer.quant_traces()[0].traces[0];
///     assert_eq!(site.site, "blk.0.ffn_up");
///     assert_eq!(site.quant_type, QuantType::Q4_1);
///     assert!(site.cosine_similarity > 0.99);
/// }
/// ```
pub use trace_macros::trace_quant;

/// Records an intermediate tensor as a stage of the enclosing [`trace_layer`] call:
/// `trace_tensor!("stage", &value)`.
///
/// The names of [`Stage`] have a fixed meaning that every trace shares (`attn_in`, `q_norm`,
/// `k_norm`, `attn_out`, `attn_post_norm`, `resid_mid`, `mlp_in`, `mlp_out`, `mlp_post_norm`:
/// where `attn_post_norm` or `mlp_post_norm` is recorded, it is what joins the residual stream);
/// any other name is the user's own. `model-trace check TRACE` checks that a trace's stages obey
/// the identities their names promise (`resid_mid = input + attention branch`, a norm stage a
/// norm of the stage before it), so a stage recorded on the wrong line is an error, not a
/// divergence. Stages are kept by name
/// in [`LayerActivationTrace::stages`], in recording order; `input` and `output` belong to the
/// layer itself and are a compile error. The stage must be a string literal.
/// Compiled out, the macro only borrows the value in code that never runs, so the value is
/// still used and nothing is computed.
///
/// ```
/// use model_trace::{trace_layer, trace_tensor, ModelTracerConfig, Session};
///
/// #[trace_layer]
/// fn block(x: &[f32]) -> Vec<f32> {
///     let normed: Vec<f32> = x.iter().map(|v| v / 2.0).collect();
///     trace_tensor!("attn_in", &normed);
///     let gate: Vec<f32> = normed.iter().map(|v| v.max(0.0)).collect();
///     trace_tensor!("gate", &gate);
///     gate
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::lightweight());
/// block(&[2.0, -4.0]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let layer = &tracer.activation_traces()[0].layers[0];
///     assert_eq!(layer.stage("attn_in").map(|s| s.mean), Some(-0.5));
///     assert_eq!(layer.stages[1].0, "gate");
/// }
/// ```
pub use trace_macros::trace_tensor;

/// Records a stage like [`trace_tensor!`] and returns the value, so that the session's
/// interventions can change it: `let h = trace_stage!("attn_out", h);`.
///
/// The value is taken by value and handed back; an intervention that selects the stage
/// (`SessionBuilder::intervene`, `MODEL_TRACE_PATCH`; `stage=attn_out` in the selector)
/// changes it before it is recorded and returned, so the trace shows what the program went on
/// with. The result is `#[must_use]`: a call whose result is dropped would let the program go
/// on with the value as it was, and the change would be lost without a word.
///
/// Why a macro of its own and not a form of `trace_tensor!`: `trace_tensor!("s", h)` already
/// compiles, borrowing `h` (the macro adds the `&`), and means "record, change nothing";
/// giving it a return value would change what existing code does. Compiled out,
/// `trace_stage!("s", h)` is `h`.
///
/// ```
/// use model_trace::{trace_layer, trace_stage, Action, ModelTracerConfig, Session};
///
/// #[trace_layer]
/// fn block(x: &[f32]) -> Vec<f32> {
///     let attn: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
///     let attn = trace_stage!("attn_out", attn);
///     x.iter().zip(&attn).map(|(a, b)| a + b).collect()
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # use model_trace::PATCH_ENV_VAR as P;
/// # [F, O, C, P].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::builder(ModelTracerConfig::lightweight())
///     .intervene("stage=attn_out", Action::Zero) // ablate the attention
///     .start()?;
/// let out = block(&[1.0, 2.0]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     assert_eq!(out, [1.0, 2.0]); // only the residual is left
///     let layer = &tracer.activation_traces()[0].layers[0];
///     assert_eq!(layer.stage("attn_out").map(|s| s.max), Some(0.0));
/// } else {
///     assert_eq!(out, [3.0, 6.0]);
/// }
/// # Ok::<(), model_trace::SessionError>(())
/// ```
pub use trace_macros::trace_stage;

/// Records attention probabilities computed inline, like [`trace_attention`] does for a
/// returned value: `trace_attention_value!(&probs)`, optionally with `layer = EXPR` and
/// `name = "..."`.
///
/// Its name differs from the attribute's because Rust cannot export an attribute macro and a
/// function-like macro under one name.
///
/// ```
/// use model_trace::{trace_attention_value, trace_layer, ModelTracerConfig, Session};
///
/// #[trace_layer(index = 2)]
/// fn block(x: &[f32]) -> Vec<f32> {
///     let probs = vec![0.9_f32, 0.1];
///     trace_attention_value!(&probs);
///     x.to_vec()
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::full());
/// block(&[1.0]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     assert_eq!(tracer.attention_traces()[0].layer_idx, 2);
/// }
/// ```
pub use trace_macros::trace_attention_value;

/// Records logits computed inline, like [`trace_logits`] does for a returned value:
/// `trace_logits_value!(&logits)`, optionally with `layer = EXPR` and `name = "..."`.
///
/// ```
/// use model_trace::{trace_logits_value, ModelTracerConfig, Session};
///
/// fn early_exit(hidden: &[f32], layer: usize) {
///     let logits: Vec<f32> = hidden.iter().map(|v| v * 3.0).collect();
///     trace_logits_value!(&logits, layer = layer);
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::full());
/// early_exit(&[0.2, 0.1], 4);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     assert_eq!(tracer.logit_traces().len(), 1);
/// }
/// ```
pub use trace_macros::trace_logits_value;

/// Records a router's choice computed inline, like [`trace_router`] does for a returned value:
/// `trace_router_value!(&logits, &weights, &experts)`, the three values first, then any of
/// `scoring`, `bias`, `groups`, `layer` and `name` as [`trace_router`] takes them. Its
/// tracepoint is named `router` unless `name` says otherwise.
///
/// ```
/// use model_trace::{trace_layer, trace_router_value, ModelTracerConfig, Session, TensorRef};
///
/// #[trace_layer(index = 3)]
/// fn moe_block(x: &[f32]) -> Vec<f32> {
///     // one token, four experts scored by sigmoid, a selection bias, two chosen
///     let logits = [0.2_f32, 1.5, 1.0, -0.5];
///     let bias = [0.0_f32, 0.0, 0.6, 0.0];
///     let (weights, experts) = ([0.6_f32, 0.4], [2.0_f32, 1.0]);
///     let logits = TensorRef::new(&logits, &[1, 4]).unwrap();
///     let weights = TensorRef::new(&weights, &[1, 2]).unwrap();
///     let experts = TensorRef::new(&experts, &[1, 2]).unwrap();
///     trace_router_value!(&logits, &weights, &experts, scoring = sigmoid, bias = &bias);
///     x.to_vec()
/// }
///
/// # use model_trace::{CAPTURE_ENV_VAR as C, FILTER_ENV_VAR as F, OUT_ENV_VAR as O};
/// # [F, O, C].into_iter().for_each(|var| std::env::remove_var(var)); // not the caller's settings
/// let session = Session::start(ModelTracerConfig::full());
/// moe_block(&[1.0]);
/// let tracer = session.finish();
/// if model_trace::ENABLED {
///     let call = &tracer.routers()[0];
///     assert_eq!((call.layer, call.selection_bias), (3, true));
///     assert_eq!(call.tokens[0].runner_up, Some(0));
/// }
/// ```
pub use trace_macros::trace_router_value;

// The lists the macro crate keeps of runtime names, for `tests/macro_lists.rs`.
#[doc(hidden)]
pub use trace_macros::{__quant_types, __reserved_stages, __tracepoint_kinds};

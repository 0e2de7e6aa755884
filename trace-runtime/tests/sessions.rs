//! Sessions driven through `__private` by hand, the way the macros' generated code calls it.
//! The `enabled` feature decides which half runs: recording with it, the inert API without.
//!
//! Only the test of the environment variables reads them (it sets each one and restores what
//! the caller had); every other session is started with its filter given.

/// With the feature off the API exists and records nothing, whatever is called.
#[cfg(not(feature = "enabled"))]
mod disabled {
    use trace_runtime::__private::{
        self, probe, Callsite, LayerGuard, ModelGuard, Registered, TracepointKind,
    };
    use trace_runtime::{ModelTracerConfig, Session};

    static LAYER: Callsite = Callsite::new(
        TracepointKind::Layer,
        "block",
        "block",
        module_path!(),
        file!(),
        line!(),
    );
    __private::inventory::submit! { Registered(&LAYER) }

    #[test]
    fn sessions_record_nothing_and_tracepoints_are_empty() {
        let session = Session::start(ModelTracerConfig::full());
        assert!(!Session::is_active());
        assert!(!LAYER.is_active());
        let x = vec![1.0f32; 4];
        let model = ModelGuard::enter(&LAYER, None, None);
        let mut layer = LayerGuard::enter(&LAYER, None, probe!(&x));
        layer.output(probe!(&x));
        __private::record_stage(&LAYER, "post_norm", probe!(&x));
        drop((layer, model));
        assert!(session.errors().is_empty());
        let tracer = session.finish();
        assert!(
            tracer.config().trace_attention,
            "finish returns the configuration"
        );
        assert!(tracer.activation_traces().is_empty());
        assert!(trace_runtime::tracepoints().is_empty());
        assert!(Session::with_filter(ModelTracerConfig::full(), "nope:*").is_err());
    }
}

#[cfg(feature = "enabled")]
mod enabled {
    use std::cell::RefCell;
    use std::ffi::OsString;
    use std::rc::Rc;
    use std::sync::Barrier;

    use trace_runtime::__private::{
        self, probe, Callsite, KvCacheStep, LayerGuard, ModelGuard, QuantType, Registered,
        TraceTensor, TracepointKind,
    };
    use trace_runtime::{
        ActivationAnomalyKind, Event, ModelTracer, ModelTracerConfig, RecordErrorKind, Session,
        TensorRef, TraceSink, CAPTURE_ENV_VAR, FILTER_ENV_VAR, OUT_ENV_VAR,
    };

    /// A session that reads no environment variable, recording everything `config` asks for.
    fn session(config: ModelTracerConfig) -> Session {
        Session::with_filter(config, "").unwrap()
    }

    /// Sets the session's environment variables for as long as it lives, and restores what the
    /// caller had when dropped (also when the test fails).
    struct Environment(Vec<(&'static str, Option<OsString>)>);

    impl Environment {
        /// `MODEL_TRACE` set to `filter`; `MODEL_TRACE_OUT` and `MODEL_TRACE_CAPTURE` unset.
        fn with_filter(filter: &str) -> Self {
            let saved = [FILTER_ENV_VAR, OUT_ENV_VAR, CAPTURE_ENV_VAR]
                .into_iter()
                .map(|var| (var, std::env::var_os(var)))
                .collect();
            std::env::remove_var(OUT_ENV_VAR);
            std::env::remove_var(CAPTURE_ENV_VAR);
            std::env::set_var(FILTER_ENV_VAR, filter);
            Self(saved)
        }
    }

    impl Drop for Environment {
        fn drop(&mut self) {
            for (var, value) in &self.0 {
                match value {
                    Some(value) => std::env::set_var(var, value),
                    None => std::env::remove_var(var),
                }
            }
        }
    }

    /// A static callsite registered with inventory, as each annotation generates one.
    macro_rules! callsite {
        ($kind:ident, $name:literal) => {{
            static CALLSITE: Callsite = Callsite::new(
                TracepointKind::$kind,
                $name,
                "test_fn",
                module_path!(),
                file!(),
                line!(),
            );
            __private::inventory::submit! { Registered(&CALLSITE) }
            &CALLSITE
        }};
    }

    /// `#[trace_layer] fn block(x: &[f32]) -> Vec<f32>` with a `trace_tensor!("post_attn", &h)`.
    fn block(x: &[f32], panic: bool) -> Vec<f32> {
        let cs = callsite!(Layer, "block");
        let mut guard = if cs.is_active() {
            LayerGuard::enter(cs, None, probe!(&x))
        } else {
            LayerGuard::inactive()
        };
        let h: Vec<f32> = x.iter().map(|v| v * 1.5 + 0.25).collect();
        let stage = callsite!(Tensor, "post_attn");
        if stage.is_active() {
            __private::record_stage(stage, "post_attn", probe!(&h));
        }
        assert!(!panic, "layer panics on purpose");
        let out = h;
        if cs.is_active() {
            guard.output(probe!(&out));
        }
        out
    }

    /// `#[trace_model] fn forward(x, layers)`; the layer at `panic_at` panics.
    fn forward(x: &[f32], layers: usize, panic_at: Option<usize>) -> Vec<f32> {
        let cs = callsite!(Model, "forward");
        let _guard = if cs.is_active() {
            ModelGuard::enter(cs, None, None)
        } else {
            ModelGuard::inactive()
        };
        let mut h = x.to_vec();
        for layer in 0..layers {
            h = block(&h, panic_at == Some(layer));
        }
        h
    }

    fn layer_indices(tracer: &ModelTracer) -> Vec<Vec<usize>> {
        tracer
            .activation_traces()
            .iter()
            .map(|pass| pass.layers.iter().map(|l| l.layer_idx).collect())
            .collect()
    }

    const X: [f32; 8] = [0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 0.25, 3.0];

    #[test]
    fn nothing_is_recorded_without_a_session() {
        assert!(!Session::is_active());
        let cs = callsite!(Layer, "probe_no_session");
        assert!(!cs.is_active());
        forward(&X, 3, None);
        let tracer = session(ModelTracerConfig::full()).finish();
        assert!(tracer.activation_traces().is_empty());
    }

    #[test]
    fn layers_are_numbered_per_pass_and_record_input_output_and_stages() {
        let session = session(ModelTracerConfig::lightweight());
        assert!(Session::is_active());
        forward(&X, 3, None);
        forward(&X, 3, None);
        let tracer = session.finish();
        assert!(!Session::is_active());
        assert_eq!(layer_indices(&tracer), vec![vec![0, 1, 2], vec![0, 1, 2]]);
        let first = &tracer.activation_traces()[0].layers[0];
        assert_eq!(first.input_stats.count, 8);
        assert_eq!(first.output_stats.count, 8);
        assert_eq!(first.stage("post_attn"), Some(&first.output_stats));
        assert!((first.input_stats.max - 3.0).abs() < 1e-6);
    }

    #[test]
    fn sessions_on_two_threads_do_not_mix() {
        let barrier = Barrier::new(2);
        let run = |layers: usize, passes: usize| {
            let session = Session::with_filter(ModelTracerConfig::lightweight(), "").unwrap();
            barrier.wait();
            for _ in 0..passes {
                forward(&X, layers, None);
                barrier.wait();
            }
            session.finish()
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| run(2, 3));
            let b = s.spawn(|| run(5, 3));
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(layer_indices(&a), vec![vec![0, 1]; 3]);
        assert_eq!(layer_indices(&b), vec![vec![0, 1, 2, 3, 4]; 3]);
    }

    #[test]
    fn nothing_is_recorded_after_finish() {
        let first = session(ModelTracerConfig::lightweight());
        let cs = callsite!(Layer, "outlives_session");
        // A guard still open when the session finishes: its layer is closed and kept by `finish`.
        let mut open = LayerGuard::enter(cs, Some(7), probe!(&X));
        let first = first.finish();
        assert_eq!(layer_indices(&first), vec![vec![7]]);

        forward(&X, 2, None);
        let second = session(ModelTracerConfig::lightweight());
        open.output(probe!(&X));
        drop(open);
        let second = second.finish();
        assert!(second.activation_traces().is_empty());
        assert_eq!(layer_indices(&first), vec![vec![7]]);
    }

    #[test]
    fn guards_close_on_panic_and_the_next_pass_is_clean() {
        let session = session(ModelTracerConfig::lightweight());
        let panicked = std::panic::catch_unwind(|| forward(&X, 3, Some(1)));
        assert!(panicked.is_err());
        forward(&X, 3, None);
        let tracer = session.finish();
        assert_eq!(layer_indices(&tracer), vec![vec![0, 1], vec![0, 1, 2]]);
        let interrupted = &tracer.activation_traces()[0].layers[1];
        assert_eq!(interrupted.input_stats.count, 8);
        assert_eq!(
            interrupted.output_stats.count, 0,
            "the panicking layer has no output"
        );
    }

    #[test]
    fn layers_outside_a_model_pass_open_an_implicit_pass_with_a_warning() {
        let session = session(ModelTracerConfig::lightweight());
        block(&X, false);
        block(&X, false);
        forward(&X, 1, None);
        block(&X, false);
        let warnings = session.warnings();
        let (tracer, errors) = session.finish_with_errors();
        assert_eq!(layer_indices(&tracer), vec![vec![0, 1], vec![0], vec![0]]);
        // Once per session, naming the layer, apart from the errors.
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].kind, RecordErrorKind::ImplicitPass);
        assert_eq!(warnings[0].tracepoint.map(|tp| tp.name), Some("block"));
        assert!(
            warnings[0].message.starts_with(
                "layers recorded outside any #[trace_model] function: they are counted as one \
                 implicit pass; annotate the forward function with #[trace_model]"
            ),
            "{}",
            warnings[0]
        );
        assert!(errors.is_empty(), "{errors:?}");
        let summary = tracer.summary();
        assert_eq!((summary.warnings, summary.record_errors), (1, 0));
        assert!(summary
            .to_string()
            .contains("Warnings: 1 (first: layers recorded outside"));

        // Inside `#[trace_model]` there is nothing to warn about.
        let session = self::session(ModelTracerConfig::lightweight());
        forward(&X, 2, None);
        assert!(session.warnings().is_empty());
    }

    #[test]
    fn config_kinds_gate_tracepoints() {
        let session = self::session(ModelTracerConfig::default());
        assert!(!callsite!(Layer, "gate_layer").is_active());
        assert!(!callsite!(Model, "gate_model").is_active());
        drop(session);

        let session = self::session(ModelTracerConfig::lightweight());
        assert!(callsite!(Layer, "gate_layer2").is_active());
        assert!(callsite!(KvCache, "gate_kv").is_active());
        assert!(!callsite!(Attention, "gate_attn").is_active());
        assert!(!callsite!(Logits, "gate_logits").is_active());
        assert!(!callsite!(Quant, "gate_quant").is_active());
        drop(session);
    }

    #[test]
    fn filters_select_what_is_recorded() {
        let config = ModelTracerConfig::lightweight();

        let session = Session::with_filter(config.clone(), "layer:*, -tensor:*").unwrap();
        forward(&X, 2, None);
        let tracer = session.finish();
        assert_eq!(layer_indices(&tracer), vec![vec![0, 1]]);
        assert_eq!(
            tracer.activation_traces()[0].layers[0].stage("post_attn"),
            None
        );

        // The layer is filtered out but still numbers the stages recorded inside it.
        let session = Session::with_filter(config.clone(), "tensor:post_*").unwrap();
        forward(&X, 2, None);
        let tracer = session.finish();
        assert_eq!(layer_indices(&tracer), vec![vec![0, 1]]);
        let layer = &tracer.activation_traces()[0].layers[1];
        assert_eq!(layer.input_stats.count, 0);
        assert_eq!(layer.stage("post_attn").map(|s| s.count), Some(8));

        let session = Session::with_filter(config.clone(), "attention:*").unwrap();
        forward(&X, 2, None);
        assert!(session.finish().activation_traces()[0].layers.is_empty());

        let error = Session::with_filter(config, "layers:*").unwrap_err();
        assert!(
            error.to_string().contains("unknown kind `layers`"),
            "{error}"
        );
    }

    #[test]
    fn layer_patterns_keep_the_stages_of_the_layers_they_admit() {
        let stage_counts = |filter: &str| -> Vec<Option<usize>> {
            let session = Session::with_filter(ModelTracerConfig::lightweight(), filter).unwrap();
            forward(&X, 2, None);
            let tracer = session.finish_with_errors().0;
            tracer.activation_traces()[0]
                .layers
                .iter()
                .map(|l| l.stage("post_attn").map(|s| s.count))
                .collect()
        };
        assert_eq!(stage_counts("layer:*"), [Some(8), Some(8)]);
        assert_eq!(stage_counts("layer:block"), [Some(8), Some(8)]);
        // Excluded by name or by kind: the layers stay, without the stage.
        assert_eq!(stage_counts("layer:*, -post_attn"), [None, None]);
        assert_eq!(stage_counts("layer:*, -tensor:*"), [None, None]);
        // A stage follows the layer it runs in, not any admitted layer.
        let session =
            Session::with_filter(ModelTracerConfig::lightweight(), "layer:attn_block").unwrap();
        forward(&X, 2, None);
        assert!(session.finish_with_errors().0.activation_traces()[0]
            .layers
            .is_empty());
        // Outside any layer, a stage the filter did not ask for is no error.
        let session = Session::with_filter(ModelTracerConfig::lightweight(), "layer:*").unwrap();
        __private::record_stage(callsite!(Tensor, "loose_stage"), "loose_stage", probe!(&X));
        assert!(session.errors().is_empty());
    }

    #[test]
    fn model_patterns_select_forward_passes() {
        let run = |filter: &str| -> (Vec<Vec<usize>>, usize) {
            let session = Session::with_filter(ModelTracerConfig::lightweight(), filter).unwrap();
            forward(&X, 2, None);
            let inside = Session::is_active();
            assert!(inside, "a session records again after a suspended pass");
            forward(&X, 3, None);
            let tracer = session.finish_with_errors().0;
            (layer_indices(&tracer), tracer.forward_passes())
        };
        assert_eq!(run("-model:*"), (vec![], 0));
        assert_eq!(run("-model:forward"), (vec![], 0));
        assert_eq!(run("model:full_forward, *"), (vec![], 0));
        assert_eq!(
            run("model:forward, *"),
            (vec![vec![0, 1], vec![0, 1, 2]], 2)
        );
        // Inclusions of other kinds and kindless exclusions of other names leave passes alone.
        assert_eq!(run("layer:*").0, [vec![0, 1], vec![0, 1, 2]]);
        assert_eq!(run("*, -block").1, 2);

        // Nothing inside a suspended pass is recorded, what comes after it is.
        let session = Session::with_filter(ModelTracerConfig::lightweight(), "-model:*").unwrap();
        let model = callsite!(Model, "suspended_forward");
        let pass = ModelGuard::enter(model, None, None);
        assert!(!Session::is_active());
        block(&X, false);
        drop(pass);
        assert!(Session::is_active());
        block(&X, false);
        let tracer = session.finish_with_errors().0;
        assert_eq!(layer_indices(&tracer), vec![vec![0]]);
    }

    #[test]
    fn a_pattern_that_matches_no_tracepoint_is_a_warning() {
        let filter = "layer:blok, layer:*, -tensor:post_atn";
        let session = Session::with_filter(ModelTracerConfig::lightweight(), filter).unwrap();
        let warnings = session.warnings();
        forward(&X, 1, None);
        let (tracer, errors) = session.finish_with_errors();
        let messages: Vec<&str> = warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "filter pattern `layer:blok` matches none of the program's tracepoints, so it \
                 selects nothing (model_trace::tracepoints() lists them)",
                "filter pattern `-tensor:post_atn` matches none of the program's tracepoints, so \
                 it excludes nothing (model_trace::tracepoints() lists them)",
            ]
        );
        assert!(warnings
            .iter()
            .all(|w| w.kind == RecordErrorKind::UnmatchedPattern && w.tracepoint.is_none()));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(tracer.summary().warnings, 2);
        // The pattern that matched still selects what it matched.
        assert_eq!(layer_indices(&tracer), vec![vec![0]]);
        let session = Session::with_filter(ModelTracerConfig::lightweight(), "layer:*").unwrap();
        assert!(session.warnings().is_empty());
    }

    /// Collects a session's events.
    struct Collect(Rc<RefCell<Vec<Event>>>);

    impl TraceSink for Collect {
        fn name(&self) -> std::borrow::Cow<'_, str> {
            "collect".into()
        }

        fn event(&mut self, event: &Event) -> Result<(), trace_runtime::SinkError> {
            self.0.borrow_mut().push(event.clone());
            Ok(())
        }
    }

    #[test]
    fn non_finite_logits_are_written_flagged_and_ranked_without_the_nans() {
        let events = Rc::new(RefCell::new(Vec::new()));
        let session = Session::builder(ModelTracerConfig::full())
            .sink(Collect(Rc::clone(&events)))
            .start()
            .unwrap();
        let model = callsite!(Model, "nan_forward");
        let head = callsite!(Logits, "nan_head");
        let steps: [[f32; 6]; 3] = [
            [f32::NAN; 6],
            [0.5, f32::NAN, 2.0, f32::NAN, 1.0, 0.0],
            [0.5, f32::INFINITY, 2.0, -1.0, 1.0, 0.0],
        ];
        for (position, logits) in steps.iter().enumerate() {
            let _pass = ModelGuard::enter(model, Some(position), None);
            block(&X, false);
            __private::record_logits(head, None, probe!(&logits));
        }
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        let events = events.borrow();

        // Every step has its logits record, whose statistics count what is not finite.
        let counts: Vec<(usize, usize, usize)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Logits(l) => {
                    Some((l.layer, l.logits.stats.nan_count, l.logits.stats.inf_count))
                }
                _ => None,
            })
            .collect();
        assert_eq!(counts, [(1, 6, 0), (1, 2, 0), (1, 0, 1)]);

        // Every step's pass has a logits anomaly, at the layer of the logits.
        let anomalies: Vec<(Option<&str>, usize, ActivationAnomalyKind, &str)> = events
            .iter()
            .filter_map(|e| match e {
                Event::PassEnd(end) => end.anomalies.first(),
                _ => None,
            })
            .map(|a| (a.stage.as_deref(), a.layer, a.kind, a.description.as_str()))
            .collect();
        assert_eq!(
            anomalies,
            [
                (
                    Some("logits"),
                    1,
                    ActivationAnomalyKind::Nan,
                    "layer 1 logits: NaN (6 of 6 values)"
                ),
                (
                    Some("logits"),
                    1,
                    ActivationAnomalyKind::Nan,
                    "layer 1 logits: NaN (2 of 6 values)"
                ),
                (
                    Some("logits"),
                    1,
                    ActivationAnomalyKind::Inf,
                    "layer 1 logits: Inf (1 of 6 values)"
                ),
            ]
        );
        let summary = tracer.summary();
        assert_eq!(summary.anomalies_detected, 3);
        assert_eq!(
            summary.first_anomaly.as_deref(),
            Some("layer 1 logits: NaN (6 of 6 values)")
        );
        assert_eq!(
            tracer.activation_traces()[1].anomaly_kind,
            Some(ActivationAnomalyKind::Nan)
        );

        // NaN logits outrank nothing: the finite ones are ranked among themselves. A row with
        // no finite logit has no token to follow, so its pass has no logit trace.
        let traces = tracer.logit_traces();
        assert_eq!(
            traces.iter().map(|t| t.position).collect::<Vec<_>>(),
            [1, 2]
        );
        let ranked: Vec<(u32, usize)> = traces[0]
            .tracked_tokens
            .iter()
            .map(|t| (t.token_id, t.ranks_by_layer[0]))
            .collect();
        assert_eq!(ranked, [(2, 0), (4, 1), (0, 2), (5, 3)]);
    }

    /// Runs the ignored test `name` of this binary in a child process, without the session's
    /// environment variables, and returns what it printed on stderr: what a user sees.
    fn stderr_of(name: &str) -> String {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                name,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env_remove(FILTER_ENV_VAR)
            .env_remove(OUT_ENV_VAR)
            .env_remove(CAPTURE_ENV_VAR)
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{name} failed:\n{stderr}");
        stderr
    }

    /// What `stderr_of` prints between `-- {from}` and the next `--` line.
    fn section<'a>(stderr: &'a str, from: &str) -> Vec<&'a str> {
        stderr
            .lines()
            .skip_while(|line| *line != format!("-- {from}"))
            .skip(1)
            .take_while(|line| !line.starts_with("-- "))
            .collect()
    }

    #[test]
    #[ignore = "run in a child process by `errors_and_warnings_reach_stderr`"]
    fn child_ends_sessions_with_errors_and_warnings() {
        let stray = callsite!(Tensor, "stray");
        let scalar = callsite!(Attention, "scalar_probs");
        let with_errors = || {
            let session = session(ModelTracerConfig::full());
            for _ in 0..3 {
                __private::record_stage(stray, "stray", probe!(&X));
            }
            __private::record_attention(scalar, Some(0), probe!(&3usize));
            session
        };
        eprintln!("-- finish");
        with_errors().finish();
        eprintln!("-- finish_with_errors");
        let _ = with_errors().finish_with_errors();
        eprintln!("-- drop");
        drop(with_errors());
        eprintln!("-- clean");
        let session = session(ModelTracerConfig::full());
        forward(&X, 1, None);
        session.finish();
        eprintln!("-- warnings");
        let session = Session::with_filter(ModelTracerConfig::full(), "*, -tensor:nope").unwrap();
        block(&X, false);
        block(&X, false);
        session.finish();
        eprintln!("-- end");
    }

    #[test]
    fn errors_and_warnings_reach_stderr() {
        let stderr = stderr_of("enabled::child_ends_sessions_with_errors_and_warnings");
        let reported = section(&stderr, "finish");
        assert_eq!(reported.len(), 1, "{stderr}");
        let line = reported[0];
        assert!(
            line.starts_with("model-trace: 4 record errors (2 distinct, first: tensor `stray` ("),
            "{line}"
        );
        assert!(
            line.ends_with(
                "): stage `stray` outside any #[trace_layer]: not recorded (x3)); \
                 Session::finish_with_errors returns them"
            ),
            "{line}"
        );
        assert!(
            section(&stderr, "finish_with_errors").is_empty(),
            "{stderr}"
        );
        assert_eq!(
            section(&stderr, "drop"),
            [line],
            "a dropped session reports too"
        );
        assert!(section(&stderr, "clean").is_empty(), "{stderr}");
        let warnings = section(&stderr, "warnings");
        assert_eq!(warnings.len(), 2, "{stderr}");
        assert!(
            warnings[0].starts_with(
                "model-trace: warning: filter pattern `-tensor:nope` matches none of the program's tracepoints"
            ),
            "{stderr}"
        );
        assert!(
            warnings[1].starts_with("model-trace: warning: layer `block` (")
                && warnings[1].ends_with(
                    "): layers recorded outside any #[trace_model] function: they are counted \
                     as one implicit pass; annotate the forward function with #[trace_model]"
                ),
            "{stderr}"
        );
    }

    #[test]
    fn model_trace_environment_variable_is_a_filter() {
        let environment = Environment::with_filter("-layer:block");
        let session = Session::start(ModelTracerConfig::lightweight());
        forward(&X, 2, None);
        let filtered = session.finish();

        std::env::set_var(FILTER_ENV_VAR, "bogus:*");
        let invalid = Session::try_start(ModelTracerConfig::lightweight());
        let lenient = Session::start(ModelTracerConfig::lightweight());
        forward(&X, 1, None);
        let errors = lenient.errors();
        let lenient = lenient.finish_with_errors().0;
        // "Start" means the same on the builder: the environment's value is reported and
        // skipped, and only `try_start` refuses it; a value given in code is an error.
        let builder = || Session::builder(ModelTracerConfig::lightweight()).from_env();
        let from_builder = builder()
            .start()
            .expect("the environment's filter is skipped");
        let builder_errors = from_builder.finish_with_errors().1;
        let builder_invalid = builder().try_start();
        let given_invalid = builder().filter("bogus:*").start();

        // A filter given to the builder wins over the environment.
        std::env::set_var(FILTER_ENV_VAR, "attention:*");
        let given = Session::builder(ModelTracerConfig::lightweight())
            .filter("")
            .from_env()
            .start()
            .unwrap();
        forward(&X, 1, None);
        let given = given.finish();

        // A trace file the environment names that cannot be created is skipped, and with it
        // the captures given in code that needed it: the environment never stops `start`.
        std::env::set_var(FILTER_ENV_VAR, "");
        std::env::set_var(OUT_ENV_VAR, "/no/such/dir/run.ndjson");
        let without_file = builder()
            .capture("layer:*")
            .start()
            .expect("the environment's trace file is skipped, and the captures with it");
        let without_file_errors = without_file.finish_with_errors().1;
        let file_strict = builder().capture("layer:*").try_start();
        drop(environment);

        // `block` records no statistics of its own; the stage admitted inside it still joins it.
        let layers = &filtered.activation_traces()[0].layers;
        assert_eq!(layers.len(), 2);
        assert!(layers.iter().all(
            |l| l.input_stats.count == 0 && l.stage("post_attn").is_some_and(|s| s.count == 8)
        ));
        assert!(invalid.is_err());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains("bogus"), "{}", errors[0]);
        assert!(
            errors[0].message.starts_with("MODEL_TRACE: "),
            "{}",
            errors[0]
        );
        let messages = |errors: &[trace_runtime::RecordError]| {
            errors.iter().map(|e| e.message.clone()).collect::<Vec<_>>()
        };
        assert_eq!(messages(&builder_errors), messages(&errors));
        assert!(builder_invalid.is_err());
        let given_invalid = given_invalid.expect_err("a filter given in code must parse");
        assert!(
            given_invalid.to_string().contains("bogus"),
            "{given_invalid}"
        );
        assert_eq!(
            layer_indices(&lenient),
            vec![vec![0]],
            "an invalid filter is ignored"
        );
        assert_eq!(layer_indices(&given), vec![vec![0]]);
        let without_file = messages(&without_file_errors);
        assert_eq!(without_file.len(), 2, "{without_file:?}");
        assert!(
            without_file[0].starts_with("MODEL_TRACE_OUT: ")
                && without_file[1].starts_with("MODEL_TRACE_OUT: ")
                && without_file[1].ends_with("going on without captures"),
            "{without_file:?}"
        );
        assert!(file_strict.is_err());
    }

    #[test]
    fn an_unusable_rank_stops_start_and_start_lenient_goes_on_without_it() {
        let builder = || Session::builder(ModelTracerConfig::lightweight()).rank(2, 2);
        let error = builder().start().expect_err("rank 2 of 2 is no rank");
        assert!(error.to_string().contains("rank 2"), "{error}");
        let lenient = builder().start_lenient();
        forward(&X, 1, None);
        let (tracer, errors) = lenient.finish_with_errors();
        assert_eq!(layer_indices(&tracer), vec![vec![0]], "the session records");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].message.ends_with("going on without a rank"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn nested_sessions_shadow_the_outer_one() {
        let outer = Session::with_filter(ModelTracerConfig::lightweight(), "").unwrap();
        forward(&X, 1, None);
        let inner = Session::with_filter(ModelTracerConfig::lightweight(), "").unwrap();
        forward(&X, 2, None);
        let inner = inner.finish();
        forward(&X, 3, None);
        let outer = outer.finish();
        assert_eq!(layer_indices(&inner), vec![vec![0, 1]]);
        assert_eq!(layer_indices(&outer), vec![vec![0], vec![0, 1, 2]]);
    }

    #[test]
    fn dropping_a_session_discards_it() {
        let session = Session::with_filter(ModelTracerConfig::lightweight(), "").unwrap();
        forward(&X, 2, None);
        drop(session);
        assert!(!Session::is_active());
        let tracer = Session::with_filter(ModelTracerConfig::lightweight(), "")
            .unwrap()
            .finish();
        assert!(tracer.activation_traces().is_empty());
    }

    /// `#[trace_attention]` inside a layer, `#[trace_logits]` after the last one, a KV step and a
    /// quantization site.
    #[test]
    fn attention_logits_kv_and_quant_hooks() {
        let session = Session::with_filter(ModelTracerConfig::full(), "").unwrap();
        let model = callsite!(Model, "full_forward");
        let pass = ModelGuard::enter(model, Some(5), None);
        let x = vec![1.0f32; 4];
        block(&x, false);
        {
            let layer = callsite!(Layer, "attn_block");
            let _guard = LayerGuard::enter(layer, None, probe!(&x));
            // 2 heads, 2 query rows, 3 keys: the rows are the last two positions.
            let probs = vec![
                0.7f32, 0.2, 0.1, 0.1, 0.1, 0.8, //
                0.3, 0.3, 0.4, 0.0, 0.5, 0.5,
            ];
            let shape = [1, 2, 2, 3];
            let probs = TensorRef::new(&probs, &shape).unwrap();
            __private::record_attention(callsite!(Attention, "attn"), None, probe!(&probs));
        }
        let mut logits = vec![0.0f32; 2 * 10];
        logits[10 + 3] = 5.0;
        let shape = [2, 10];
        let logits = TensorRef::new(&logits, &shape).unwrap();
        __private::record_logits(callsite!(Logits, "head"), None, probe!(&logits));
        __private::record_kv_cache(
            callsite!(KvCache, "kv"),
            KvCacheStep {
                layer: None,
                len: Some(3),
                capacity: Some(16),
                bytes: Some(1024),
                evictions: None,
                hit_rate: None,
            },
        );
        let reference = vec![1.0f32, 2.0, 3.0];
        let quantized = vec![1.0f32, 2.01, 2.99];
        __private::record_quant(
            callsite!(Quant, "matmul_q4"),
            Some(QuantType::Q4_1),
            probe!(&quantized),
            probe!(&reference),
        );
        __private::record_attention(
            callsite!(Attention, "not_a_tensor"),
            Some(0),
            probe!(&3usize),
        );
        drop(pass);
        let (tracer, errors) = session.finish_with_errors();

        let attention = tracer.attention_traces();
        assert_eq!(attention.len(), 4);
        assert!(attention.iter().all(|t| t.layer_idx == 1));
        let rows: Vec<(usize, usize)> = attention
            .iter()
            .map(|t| (t.head_idx, t.query_pos))
            .collect();
        assert_eq!(rows, vec![(0, 1), (0, 2), (1, 1), (1, 2)]);
        assert_eq!(attention[0].top_k_positions[0], 0);

        // [2, 10] logits are two batch rows: one logit trace each.
        let logits = tracer.logit_traces();
        assert_eq!(logits.iter().map(|t| t.batch).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(logits[1].tracked_tokens[0].token_id, 3);
        assert_eq!(tracer.kv_trace().steps.len(), 1);
        assert_eq!(tracer.kv_trace().steps[0].valid_positions, 3);
        assert_eq!(tracer.quant_traces().len(), 1);

        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].message.contains("not a tensor"));
    }

    fn probe_generic<T>(value: &T) -> bool {
        probe!(&value).is_some()
    }

    fn probe_bounded<T: TraceTensor>(value: &T) -> bool {
        probe!(&value).is_some()
    }

    #[test]
    fn probe_reads_tensors_and_ignores_everything_else() {
        let v = vec![1.0f32, 2.0];
        let ok: Result<Vec<f32>, String> = Ok(v.clone());
        let err: Result<Vec<f32>, String> = Err("no".into());
        let some = Some(v.clone());
        let none: Option<Vec<f32>> = None;
        assert!(probe!(&v).is_some());
        assert!(probe!(&&v).is_some());
        assert!(probe!(&v.as_slice()).is_some());
        assert!(probe!(&ok).is_some());
        assert!(probe!(&&ok).is_some());
        assert!(probe!(&err).is_none());
        assert!(probe!(&some).is_some());
        assert!(probe!(&none).is_none());
        assert!(probe!(&Some(&v)).is_some());
        assert!(probe!(&3usize).is_none());
        assert!(probe!(&"text").is_none());
        assert!(probe!(&Ok::<usize, ()>(1)).is_none());
        assert!(
            !probe_generic(&v),
            "without a bound a generic value is not read"
        );
        assert!(probe_bounded(&v));
        assert_eq!(probe!(&ok).unwrap().shape().as_ref(), &[2]);
    }

    #[test]
    fn tracepoints_are_listed_sorted() {
        let all = trace_runtime::tracepoints();
        assert!(all
            .iter()
            .any(|tp| tp.name == "block" && tp.kind == TracepointKind::Layer));
        let kinds: Vec<TracepointKind> = all.iter().map(|tp| tp.kind).collect();
        let mut sorted = kinds.clone();
        sorted.sort();
        assert_eq!(kinds, sorted);
        let line = all
            .iter()
            .find(|tp| tp.name == "block")
            .unwrap()
            .to_string();
        assert!(line.starts_with("layer "), "{line}");
        assert!(line.contains("(sessions::enabled::test_fn at "), "{line}");
    }
}

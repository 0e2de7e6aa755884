//! [`TracingSink`]: forward passes and layers as `tracing` spans, records as events, so they
//! appear beside a program's own spans in whatever `tracing` subscriber it runs
//! (tracing-subscriber's fmt layer, tracing-chrome, tracy, a log).

use std::borrow::Cow;

use tracing::span::EnteredSpan;

use super::{LayerBegin, LayerEnd, SinkError, TraceSink};
use crate::record::Event;

/// Hands a session's records to the `tracing` crate (feature `tracing`).
///
/// * A forward pass is a span `model_trace::pass` (fields `pass`, `position`, `tracepoint`),
///   entered while the pass runs; a layer is a span `model_trace::layer` (`pass`, `layer`,
///   `tracepoint`) inside it. Both are at level `INFO`, target `model_trace`.
/// * Inside them, each record is an event at `DEBUG` (`layer recorded` with the output's mean
///   and std, `attention`, `logits`, `kv_cache`, `quant`), an anomaly at the end of a pass is a
///   `WARN` event, and a record error a `WARN` event.
///
/// Spans are entered on the session's thread and exited in order when layers and passes end,
/// so a subscriber's timings are those of the model's own calls. A pass that reads device
/// tensors (a GPU's) holds its records until the device is read back at its end: its layer
/// spans still close when the layers return (a layer's time on the host: queuing its work on
/// the device), and its `layer recorded` events come at the end, inside the pass span, whose
/// time includes waiting for the device.
///
/// ```
/// # use trace_runtime as model_trace;
/// use model_trace::{ModelTracerConfig, Session, TracingSink};
///
/// let session = Session::builder(ModelTracerConfig::lightweight())
///     .sink(TracingSink::new())
///     .start()
///     .expect("no file to open");
/// // ... run the model under the program's tracing subscriber ...
/// session.finish();
/// ```
/// # use trace_runtime as model_trace;
#[derive(Debug, Default)]
pub struct TracingSink {
    /// The pass span and the layer spans inside it, innermost last.
    open: Vec<EnteredSpan>,
    /// How many of `open` are layer spans (the rest, at most one, is the pass).
    layers: usize,
}

impl TracingSink {
    /// A sink with no span open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Exits every open span, innermost first.
    fn close_all(&mut self) {
        while self.open.pop().is_some() {}
        self.layers = 0;
    }

    fn close_layer(&mut self) {
        if self.layers > 0 {
            self.layers -= 1;
            self.open.pop();
        }
    }
}

impl TraceSink for TracingSink {
    fn name(&self) -> Cow<'_, str> {
        Cow::Borrowed("tracing")
    }

    fn layer_begin(&mut self, begin: &LayerBegin) -> Result<(), SinkError> {
        let span = tracing::info_span!(
            target: "model_trace",
            "layer",
            pass = begin.pass,
            layer = begin.layer,
            tracepoint = begin.tracepoint,
        );
        self.open.push(span.entered());
        self.layers += 1;
        Ok(())
    }

    fn layer_end(&mut self, _end: &LayerEnd) -> Result<(), SinkError> {
        self.close_layer();
        Ok(())
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        match event {
            Event::PassBegin(begin) => {
                self.close_all();
                let span = tracing::info_span!(
                    target: "model_trace",
                    "pass",
                    pass = begin.pass,
                    position = begin.position,
                    tracepoint = %begin.tracepoint,
                );
                self.open.push(span.entered());
            }
            Event::Layer(layer) => {
                let output = layer.stage("output").map(|s| s.tensor.stats);
                tracing::debug!(
                    target: "model_trace",
                    layer = layer.layer,
                    stages = layer.stages.len(),
                    output_mean = output.map(|s| s.mean),
                    output_std = output.map(|s| s.std),
                    duration_ns = layer.duration_ns,
                    "layer recorded"
                );
            }
            Event::PassEnd(end) => {
                if let Some(anomaly) = end.anomalies.first() {
                    tracing::warn!(
                        target: "model_trace",
                        pass = end.pass,
                        layer = anomaly.layer,
                        anomalous_layers = end.anomalies.len(),
                        "anomaly: {}",
                        anomaly.description
                    );
                }
                while self.layers > 0 {
                    self.close_layer();
                }
                self.open.pop();
            }
            Event::Attention(attention) => tracing::debug!(
                target: "model_trace",
                layer = attention.layer,
                rows = attention.rows.len(),
                tracepoint = %attention.tracepoint,
                "attention"
            ),
            Event::Logits(logits) => tracing::debug!(
                target: "model_trace",
                layer = logits.layer,
                top_token = logits.batch_rows.first().and_then(|r| r.top_tokens.first()).copied(),
                tracepoint = %logits.tracepoint,
                "logits"
            ),
            Event::KvCache(kv) => tracing::debug!(
                target: "model_trace",
                layer = kv.state.layer,
                valid_positions = kv.state.valid_positions,
                bytes = kv.state.cache_size_bytes,
                "kv_cache"
            ),
            Event::Quant(quant) => tracing::debug!(
                target: "model_trace",
                site = %quant.error.site,
                layer = quant.error.layer_idx,
                cosine = quant.error.cosine_similarity,
                snr_db = quant.error.snr_db,
                "quant"
            ),
            Event::Router(router) => {
                // The closest choice of the call: where another router may have chosen otherwise.
                let narrowest = router
                    .tokens
                    .iter()
                    .min_by(|a, b| a.logit_margin.total_cmp(&b.logit_margin));
                tracing::debug!(
                    target: "model_trace",
                    layer = router.layer,
                    tokens = router.tokens.len(),
                    experts = router.num_experts,
                    top_k = router.top_k,
                    narrowest_row = narrowest.map(|t| t.row),
                    narrowest_logit_margin = narrowest.map(|t| t.logit_margin),
                    tracepoint = %router.tracepoint,
                    "router"
                );
            }
            Event::Intervention(change) => tracing::debug!(
                target: "model_trace",
                layer = change.layer,
                stage = %change.stage,
                delta_l2 = change.delta_l2,
                "changed by `{}`",
                change.intervention
            ),
            Event::Error(error) => tracing::warn!(
                target: "model_trace",
                kind = %error.kind,
                tracepoint = %error.tracepoint,
                "not recorded: {}",
                error.message
            ),
            Event::SessionEnd(_) => self.close_all(),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.close_all();
        Ok(())
    }
}

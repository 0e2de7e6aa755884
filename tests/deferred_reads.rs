//! Tensors whose summaries are read later (`TraceTensor::start_summary`: a GPU's): a forward
//! pass is read back once, at its end, and what the sinks receive is what they receive for the
//! same values on the host, in the same order: complete layer records, anomalies judged on the
//! device's statistics, and on unwinding, implicit passes and failed reads too.
//!
//! The device here is a fake one that does what the CUDA backend does, observably: a started read
//! computes its result into a queue ("the kernel"), and the first `finish` after new reads were
//! queued reads the whole queue back at once ("the copy to the host") and counts it.
#![cfg(feature = "enabled")]

mod common;

use std::borrow::Cow;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;

use model_trace::{
    trace_layer, trace_logits, trace_model, trace_tensor, ActivationAnomalyKind, DigestPolicy,
    Event, LayerBegin, LayerEnd, ModelTracerConfig, PendingSummary, RecordErrorKind, Session,
    SinkError, SummaryRequest, TensorError, TensorSummary, TraceSink, TraceTensor,
};

use common::Events;

#[derive(Default)]
struct DeviceState {
    /// Results the "kernels" wrote, in the order the reads started.
    queued: Vec<Result<TensorSummary, TensorError>>,
    /// The part of `queued` copied to the host.
    read_back: usize,
    readbacks: usize,
    host_copies: usize,
    requests: Vec<SummaryRequest>,
    /// Reads started from now on fail.
    failing: bool,
}

#[derive(Clone, Default)]
struct FakeDevice(Rc<RefCell<DeviceState>>);

impl FakeDevice {
    fn readbacks(&self) -> usize {
        self.0.borrow().readbacks
    }

    fn host_copies(&self) -> usize {
        self.0.borrow().host_copies
    }
}

/// The values a tensor holds, on the host or on the fake device.
#[derive(Clone)]
enum Values {
    Host(Vec<f32>),
    Device(FakeDevice, Vec<f32>),
}

impl Values {
    fn data(&self) -> &[f32] {
        match self {
            Values::Host(data) | Values::Device(_, data) => data,
        }
    }

    /// New values on the same side.
    fn with(&self, data: Vec<f32>) -> Values {
        match self {
            Values::Host(_) => Values::Host(data),
            Values::Device(device, _) => Values::Device(device.clone(), data),
        }
    }

    fn map(&self, f: impl Fn(f32) -> f32) -> Values {
        self.with(self.data().iter().map(|&x| f(x)).collect())
    }
}

impl TraceTensor for Values {
    fn shape(&self) -> Cow<'_, [usize]> {
        Cow::Owned(vec![self.data().len()])
    }

    fn dtype_name(&self) -> &'static str {
        "f32"
    }

    fn to_f32(&self) -> Result<Cow<'_, [f32]>, TensorError> {
        if let Values::Device(device, _) = self {
            device.0.borrow_mut().host_copies += 1;
        }
        Ok(Cow::Borrowed(self.data()))
    }

    fn on_host(&self) -> bool {
        matches!(self, Values::Host(_))
    }

    fn start_summary(
        &self,
        request: &SummaryRequest,
    ) -> Option<Result<PendingSummary, TensorError>> {
        let Values::Device(device, data) = self else {
            return None;
        };
        let mut state = device.0.borrow_mut();
        state.requests.push(*request);
        let result = if state.failing {
            Err(TensorError::Backend(
                "the device fell off the bus".to_owned(),
            ))
        } else if request.digest {
            Ok(TensorSummary::of_values(vec![data.len()], "f32", data))
        } else {
            Ok(TensorSummary::from_stats(
                vec![data.len()],
                "f32",
                model_trace::TensorStats::from_slice(data),
            ))
        };
        state.queued.push(result);
        let slot = state.queued.len() - 1;
        let device = device.clone();
        Some(Ok(PendingSummary::new(move || {
            let mut state = device.0.borrow_mut();
            if slot >= state.read_back {
                state.read_back = state.queued.len();
                state.readbacks += 1;
            }
            state.queued[slot].clone()
        })))
    }
}

#[trace_layer(index = index, input = x)]
fn block(index: usize, x: &Values, poison: Option<usize>) -> Values {
    let normed = x.map(|v| v * 0.5);
    trace_tensor!("attn_norm", &normed);
    let attention = normed.map(|v| v + 1.0);
    trace_tensor!("attn_out", &attention);
    if poison == Some(index) {
        return attention.map(|_| f32::NAN);
    }
    assert!(poison != Some(index + 100), "layer {index} panics");
    attention.map(|v| v - 0.25)
}

#[trace_logits]
fn head(x: &Values) -> Values {
    // Logits are read at once (their rows are needed now), on whichever side.
    x.map(|v| v * 2.0)
}

fn layers(x: &Values, count: usize, poison: Option<usize>) -> Values {
    let mut hidden = x.clone();
    for index in 0..count {
        hidden = block(index, &hidden, poison);
    }
    head(&hidden)
}

#[trace_model]
fn model(x: &Values, poison: Option<usize>) -> Values {
    layers(x, 3, poison)
}

fn input(side: &Values, pass: usize) -> Values {
    side.with((0..16).map(|i| (i + pass) as f32 * 0.1 - 0.7).collect())
}

/// What a sink received, without the clock: each event as its JSON with times taken out.
fn timeless(events: &Events) -> Vec<serde_json::Value> {
    events
        .0
        .borrow()
        .iter()
        .map(|event| {
            let mut value = serde_json::to_value(event).unwrap();
            strip_times(&mut value);
            value
        })
        .collect()
}

fn strip_times(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.retain(|key, _| !key.ends_with("_ns"));
            map.values_mut().for_each(strip_times);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_times),
        _ => {}
    }
}

/// A session on this thread with `sink` as its one sink.
fn start(config: ModelTracerConfig, sink: impl TraceSink + 'static) -> Session {
    Session::builder(config)
        .sink(sink)
        .start()
        .expect("a session without a file cannot fail to start")
}

fn run(side: &Values, config: ModelTracerConfig, passes: usize) -> Events {
    let events = Events::default();
    let session = start(config, events.clone());
    for pass in 0..passes {
        model(&input(side, pass), None);
    }
    session.finish();
    events
}

#[test]
fn a_pass_of_device_tensors_is_read_back_once_and_records_what_the_host_does() {
    let device = FakeDevice::default();
    let on_device = run(
        &Values::Device(device.clone(), vec![]),
        ModelTracerConfig::full(),
        2,
    );
    let on_host = run(&Values::Host(vec![]), ModelTracerConfig::full(), 2);
    assert_eq!(device.readbacks(), 2, "one readback a pass");
    // 3 layers × (input, 2 stages, output) a pass were deferred; the logits (2 a pass) were
    // copied now, as their rows are needed now.
    assert_eq!(device.0.borrow().requests.len(), 2 * 3 * 4);
    assert_eq!(device.host_copies(), 2);
    assert_eq!(timeless(&on_device), timeless(&on_host));
    let layers = on_device.layers();
    assert_eq!(layers.len(), 6);
    assert!(layers
        .iter()
        .all(|layer| layer.stages.len() == 4 && layer.stages[0].tensor.stats.count == 16));
}

#[test]
fn without_a_sink_that_wants_digests_no_digest_is_asked_for() {
    let device = FakeDevice::default();
    let config = ModelTracerConfig {
        digests: DigestPolicy::Always,
        device_copy_below: 64,
        ..ModelTracerConfig::lightweight()
    };
    run(&Values::Device(device.clone(), vec![]), config, 1);
    let requests = device.0.borrow().requests.clone();
    assert!(!requests.is_empty());
    // The in-memory tracer keeps no digests; the copy threshold is passed on.
    assert!(requests.iter().all(|r| !r.digest && r.copy_below == 64));
}

/// Keeps every event and wants digests, as the trace file does.
#[derive(Clone, Default)]
struct DigestEvents(Events);

impl TraceSink for DigestEvents {
    fn name(&self) -> Cow<'_, str> {
        "digest events".into()
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        self.0.event(event)
    }

    fn wants_digests(&self) -> bool {
        true
    }
}

#[test]
fn digests_of_device_tensors_are_asked_for_only_under_digest_policy_always() {
    for (policy, digest) in [
        (DigestPolicy::HostOnly, false),
        (DigestPolicy::Always, true),
        (DigestPolicy::Off, false),
    ] {
        let device = FakeDevice::default();
        let events = DigestEvents::default();
        let config = ModelTracerConfig {
            digests: policy,
            ..ModelTracerConfig::lightweight()
        };
        let session = start(config, events.clone());
        model(&input(&Values::Device(device.clone(), vec![]), 0), None);
        session.finish();
        let requests = device.0.borrow().requests.clone();
        assert!(requests.iter().all(|r| r.digest == digest), "{policy:?}");
        let layers = events.0.layers();
        assert!(
            layers
                .iter()
                .flat_map(|l| &l.stages)
                .all(|s| s.tensor.has_digest() == digest),
            "{policy:?}"
        );
    }
}

#[test]
fn anomalies_are_judged_on_the_statistics_read_back() {
    let device = FakeDevice::default();
    let events = Events::default();
    let session = start(ModelTracerConfig::lightweight(), events.clone());
    model(&input(&Values::Device(device.clone(), vec![]), 0), Some(1));
    let tracer = session.finish();
    let ends = events.picked(|event| match event {
        Event::PassEnd(end) => Some(end.clone()),
        _ => None,
    });
    let first = &ends[0].anomalies[0];
    assert_eq!((first.layer, first.kind), (1, ActivationAnomalyKind::Nan));
    let summary = tracer.summary();
    assert_eq!(summary.anomalies_detected, 1);
    assert!(
        summary
            .first_anomaly
            .as_deref()
            .is_some_and(|a| a.contains("layer 1")),
        "{summary:?}"
    );
    assert_eq!(device.readbacks(), 1);
}

#[test]
fn a_pass_that_unwinds_is_read_back_and_kept() {
    let device = FakeDevice::default();
    let events = Events::default();
    let session = start(ModelTracerConfig::lightweight(), events.clone());
    let side = Values::Device(device.clone(), vec![]);
    let unwound = catch_unwind(AssertUnwindSafe(|| model(&input(&side, 0), Some(102))));
    assert!(unwound.is_err());
    model(&input(&side, 1), None);
    session.finish();
    assert_eq!(device.readbacks(), 2);
    let layers = events.layers();
    // Layers 0, 1 and the panicking 2 (its input and stages) of the first pass, 3 of the second.
    assert_eq!(
        layers.iter().map(|l| (l.pass, l.layer)).collect::<Vec<_>>(),
        [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    );
    assert_eq!(layers[2].stages.len(), 3, "input and the two stages");
    assert!(layers
        .iter()
        .flat_map(|l| &l.stages)
        .all(|s| s.tensor.stats.count == 16));
    let kinds: Vec<&str> = events
        .0
        .borrow()
        .iter()
        .map(|e| match e {
            Event::PassBegin(_) => "begin",
            Event::PassEnd(_) => "end",
            _ => "",
        })
        .filter(|k| !k.is_empty())
        .collect();
    assert_eq!(kinds, ["begin", "end", "begin", "end"]);
}

#[test]
fn an_implicit_pass_is_read_back_when_the_session_ends() {
    let device = FakeDevice::default();
    let events = Events::default();
    let session = start(ModelTracerConfig::lightweight(), events.clone());
    // No #[trace_model]: the layers open an implicit pass.
    layers(&input(&Values::Device(device.clone(), vec![]), 0), 2, None);
    assert_eq!(
        device.readbacks(),
        0,
        "nothing waits for the device inside the pass"
    );
    assert!(events.layers().is_empty(), "the pass's records are held");
    session.finish();
    assert_eq!(device.readbacks(), 1);
    assert_eq!(events.layers().len(), 2);
    assert!(events
        .layers()
        .iter()
        .flat_map(|l| &l.stages)
        .all(|s| s.tensor.stats.count == 16));
}

#[test]
fn a_read_that_fails_is_an_error_and_its_stage_is_left_out() {
    let device = FakeDevice::default();
    let events = Events::default();
    let session = start(ModelTracerConfig::lightweight(), events.clone());
    let side = Values::Device(device.clone(), vec![]);
    model(&input(&side, 0), None);
    device.0.borrow_mut().failing = true;
    model(&input(&side, 1), None);
    let (_, errors) = session.finish_with_errors();
    let read_errors: Vec<_> = errors
        .iter()
        .filter(|e| e.kind == RecordErrorKind::Read)
        .collect();
    assert!(!read_errors.is_empty(), "{errors:#?}");
    assert!(
        read_errors[0].message.contains("fell off the bus"),
        "{}",
        read_errors[0].message
    );
    let layers = events.layers();
    assert!(layers[..3].iter().all(|l| l.stages.len() == 4));
    assert!(
        layers[3..].iter().all(|l| l.stages.is_empty()),
        "the second pass's reads all failed: {layers:#?}"
    );
}

/// Writes what a span-keeping sink sees: layer begins and ends, and the events.
#[derive(Clone, Default)]
struct SpanLog(Rc<RefCell<Vec<String>>>);

impl TraceSink for SpanLog {
    fn name(&self) -> Cow<'_, str> {
        "span log".into()
    }

    fn layer_begin(&mut self, begin: &LayerBegin) -> Result<(), SinkError> {
        self.0.borrow_mut().push(format!("begin {}", begin.layer));
        Ok(())
    }

    fn layer_end(&mut self, end: &LayerEnd) -> Result<(), SinkError> {
        self.0.borrow_mut().push(format!("end {}", end.layer));
        Ok(())
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        let line = match event {
            Event::Layer(layer) => format!("layer {}", layer.layer),
            Event::PassBegin(_) => "pass begin".to_owned(),
            Event::PassEnd(_) => "pass end".to_owned(),
            Event::Logits(_) => "logits".to_owned(),
            _ => return Ok(()),
        };
        self.0.borrow_mut().push(line);
        Ok(())
    }
}

#[test]
fn layer_spans_close_when_the_layers_return_and_held_records_follow() {
    for (side, expected) in [
        (
            Values::Host(vec![]),
            "pass begin, begin 0, layer 0, end 0, begin 1, layer 1, end 1, begin 2, layer 2, \
             end 2, logits, pass end",
        ),
        (
            Values::Device(FakeDevice::default(), vec![]),
            "pass begin, begin 0, end 0, begin 1, end 1, begin 2, end 2, layer 0, layer 1, \
             layer 2, logits, pass end",
        ),
    ] {
        let log = SpanLog::default();
        let session = start(ModelTracerConfig::full(), log.clone());
        model(&input(&side, 0), None);
        session.finish();
        assert_eq!(log.0.borrow().join(", "), expected);
    }
}

//! What the integration tests share: a sink that keeps every event a session sends.
// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use model_trace::{ErrorEvent, Event, LayerEvent, LogitRow, SessionEnd, SinkError, TraceSink};

/// Keeps every event the session sends, as a trace file would write them.
#[derive(Clone, Default)]
pub struct Events(pub Rc<RefCell<Vec<Event>>>);

impl TraceSink for Events {
    fn name(&self) -> Cow<'_, str> {
        "events".into()
    }

    fn event(&mut self, event: &Event) -> Result<(), SinkError> {
        self.0.borrow_mut().push(event.clone());
        Ok(())
    }
}

impl Events {
    /// The events for which `pick` gives something, in the order they were sent.
    pub fn picked<T>(&self, pick: impl Fn(&Event) -> Option<T>) -> Vec<T> {
        self.0.borrow().iter().filter_map(pick).collect()
    }

    pub fn count(&self, matches: impl Fn(&Event) -> bool) -> usize {
        self.0
            .borrow()
            .iter()
            .filter(|event| matches(event))
            .count()
    }

    pub fn errors(&self) -> Vec<ErrorEvent> {
        self.picked(|event| match event {
            Event::Error(error) => Some(error.clone()),
            _ => None,
        })
    }

    pub fn layers(&self) -> Vec<LayerEvent> {
        self.picked(|event| match event {
            Event::Layer(layer) => Some(layer.clone()),
            _ => None,
        })
    }

    /// Each logits event's batch rows.
    pub fn logit_rows(&self) -> Vec<Vec<LogitRow>> {
        self.picked(|event| match event {
            Event::Logits(logits) => Some(logits.batch_rows.clone()),
            _ => None,
        })
    }

    pub fn session_end(&self) -> SessionEnd {
        self.picked(|event| match event {
            Event::SessionEnd(end) => Some(end.clone()),
            _ => None,
        })
        .pop()
        .expect("a finished session sends session_end")
    }
}

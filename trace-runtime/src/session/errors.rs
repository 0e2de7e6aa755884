//! What a session could not record, counted per tracepoint, kind and message.

use std::fmt;

use crate::record::RecordErrorKind;
use crate::tracepoint::Tracepoint;

/// Distinct errors kept per session; a tracepoint failing on every call with a new shape must
/// not grow memory without bound. Further distinct errors are counted, not kept.
pub const MAX_DISTINCT_ERRORS: usize = 256;

/// A value that a tracepoint could not record (or a sink that failed), and how often that
/// happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    /// The tracepoint, or `None` for errors of the session itself (its configuration, a sink).
    pub tracepoint: Option<&'static Tracepoint>,
    /// What kind of error.
    pub kind: RecordErrorKind,
    /// What happened.
    pub message: String,
    /// How many times this tracepoint failed with this kind and message.
    pub occurrences: usize,
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tracepoint {
            Some(tracepoint) => write!(
                f,
                "{} `{}` ({}:{}): {}",
                tracepoint.kind, tracepoint.name, tracepoint.file, tracepoint.line, self.message
            )?,
            None => f.write_str(&self.message)?,
        }
        if self.occurrences > 1 {
            write!(f, " (x{})", self.occurrences)?;
        }
        Ok(())
    }
}

impl std::error::Error for RecordError {}

/// A session's errors, one entry per distinct (tracepoint, kind, message).
#[derive(Debug, Default)]
pub(crate) struct ErrorBook {
    errors: Vec<RecordError>,
    /// Occurrences of distinct errors beyond [`MAX_DISTINCT_ERRORS`].
    pub(crate) overflow: usize,
}

impl ErrorBook {
    /// Counts the error; `true` when it is new (and kept), so that its first occurrence can be
    /// reported.
    pub(crate) fn note(
        &mut self,
        tracepoint: Option<&'static Tracepoint>,
        kind: RecordErrorKind,
        message: &str,
    ) -> bool {
        let same = |e: &&mut RecordError| {
            e.kind == kind
                && e.message == message
                && match (e.tracepoint, tracepoint) {
                    (Some(a), Some(b)) => std::ptr::eq(a, b),
                    (None, None) => true,
                    _ => false,
                }
        };
        if let Some(existing) = self.errors.iter_mut().find(same) {
            existing.occurrences += 1;
            return false;
        }
        if self.errors.len() >= MAX_DISTINCT_ERRORS {
            self.overflow += 1;
            return false;
        }
        self.errors.push(RecordError {
            tracepoint,
            kind,
            message: message.to_owned(),
            occurrences: 1,
        });
        true
    }

    pub(crate) fn all(&self) -> &[RecordError] {
        &self.errors
    }

    pub(crate) fn into_vec(self) -> Vec<RecordError> {
        self.errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deduplicates_and_caps() {
        let mut book = ErrorBook::default();
        assert!(book.note(None, RecordErrorKind::Shape, "a"));
        assert!(!book.note(None, RecordErrorKind::Shape, "a"));
        assert!(
            book.note(None, RecordErrorKind::Read, "a"),
            "another kind is another error"
        );
        assert_eq!(book.all()[0].occurrences, 2);
        for i in 0..MAX_DISTINCT_ERRORS + 10 {
            book.note(None, RecordErrorKind::Shape, &format!("shape {i}"));
        }
        assert_eq!(book.all().len(), MAX_DISTINCT_ERRORS);
        assert_eq!(book.overflow, 12);
        assert_eq!(book.all()[0].to_string(), "a (x2)");
    }
}

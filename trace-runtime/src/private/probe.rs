//! probe!: any value -> Option<&dyn TraceTensor>, by autoref specialization.
//!
//! `(&&&Probe(&value)).__model_trace_probe()` resolves to the impl at the most specific level
//! whose bounds hold: `&&&Probe<T>` for tensors, `&&Probe<_>` for `Result`/`Option` of tensors
//! (and references to them), `&Probe<T>` for everything else. A generic `T` without a
//! `TraceTensor` bound falls through to the last level, so non-tensors always compile.

use crate::tensor::TraceTensor;

/// The wrapper that `probe!` dispatches on.
pub struct Probe<'a, T: ?Sized>(pub &'a T);

pub trait ProbeTensor<'a> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor>;
}

impl<'a, T: TraceTensor + 'a> ProbeTensor<'a> for &&&Probe<'a, T> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        Some(self.0)
    }
}

pub trait ProbeWrapped<'a> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor>;
}

impl<'a, T: TraceTensor + 'a, E> ProbeWrapped<'a> for &&Probe<'a, Result<T, E>> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        self.0.as_ref().ok().map(|t| t as &dyn TraceTensor)
    }
}

impl<'a, T: TraceTensor + 'a> ProbeWrapped<'a> for &&Probe<'a, Option<T>> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        self.0.as_ref().map(|t| t as &dyn TraceTensor)
    }
}

impl<'a, 'b, T: TraceTensor + 'a, E> ProbeWrapped<'a> for &&Probe<'a, &'b Result<T, E>> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        let inner: &'a &'b Result<T, E> = self.0;
        inner.as_ref().ok().map(|t| t as &dyn TraceTensor)
    }
}

impl<'a, 'b, T: TraceTensor + 'a> ProbeWrapped<'a> for &&Probe<'a, &'b Option<T>> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        let inner: &'a &'b Option<T> = self.0;
        inner.as_ref().map(|t| t as &dyn TraceTensor)
    }
}

impl<'a, 'b, T: TraceTensor + 'a, E> ProbeWrapped<'a> for &&Probe<'a, &'b mut Result<T, E>> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        let inner: &'a &'b mut Result<T, E> = self.0;
        inner.as_ref().ok().map(|t| t as &dyn TraceTensor)
    }
}

impl<'a, 'b, T: TraceTensor + 'a> ProbeWrapped<'a> for &&Probe<'a, &'b mut Option<T>> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        let inner: &'a &'b mut Option<T> = self.0;
        inner.as_ref().map(|t| t as &dyn TraceTensor)
    }
}

pub trait ProbeOther<'a> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor>;
}

impl<'a, T: ?Sized> ProbeOther<'a> for &Probe<'a, T> {
    fn __model_trace_probe(self) -> Option<&'a dyn TraceTensor> {
        None
    }
}

/// `probe!(&value)`: `Option<&dyn TraceTensor>`, `Some` when the value is a tensor or an
/// `Ok`/`Some` of one.
#[macro_export]
#[doc(hidden)]
macro_rules! __model_trace_probe {
    ($value:expr) => {{
        #[allow(unused_imports)]
        use $crate::__private::{ProbeOther as _, ProbeTensor as _, ProbeWrapped as _};
        (&&&$crate::__private::Probe($value)).__model_trace_probe()
    }};
}

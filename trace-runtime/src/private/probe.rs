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

// probe_router!: the same dispatch for what `#[trace_router]` returns, a `(logits, weights,
// experts)` tuple of tensors (or an `Ok`/`Some` of one).

pub trait ProbeRouterParts<'a> {
    fn __model_trace_router(self) -> super::RouterParts<'a>;
}

impl<'a, L, W, E> ProbeRouterParts<'a> for &&&Probe<'a, (L, W, E)>
where
    L: TraceTensor + 'a,
    W: TraceTensor + 'a,
    E: TraceTensor + 'a,
{
    fn __model_trace_router(self) -> super::RouterParts<'a> {
        router_parts(self.0)
    }
}

fn router_parts<'a, L, W, E>((logits, weights, experts): &'a (L, W, E)) -> super::RouterParts<'a>
where
    L: TraceTensor + 'a,
    W: TraceTensor + 'a,
    E: TraceTensor + 'a,
{
    super::RouterParts::Values([
        Some(logits as &dyn TraceTensor),
        Some(weights as &dyn TraceTensor),
        Some(experts as &dyn TraceTensor),
    ])
}

pub trait ProbeRouterWrapped<'a> {
    fn __model_trace_router(self) -> super::RouterParts<'a>;
}

impl<'a, L, W, E, Error> ProbeRouterWrapped<'a> for &&Probe<'a, Result<(L, W, E), Error>>
where
    L: TraceTensor + 'a,
    W: TraceTensor + 'a,
    E: TraceTensor + 'a,
{
    fn __model_trace_router(self) -> super::RouterParts<'a> {
        self.0
            .as_ref()
            .map_or(super::RouterParts::Absent, router_parts)
    }
}

impl<'a, L, W, E> ProbeRouterWrapped<'a> for &&Probe<'a, Option<(L, W, E)>>
where
    L: TraceTensor + 'a,
    W: TraceTensor + 'a,
    E: TraceTensor + 'a,
{
    fn __model_trace_router(self) -> super::RouterParts<'a> {
        self.0
            .as_ref()
            .map_or(super::RouterParts::Absent, router_parts)
    }
}

pub trait ProbeRouterOther<'a> {
    fn __model_trace_router(self) -> super::RouterParts<'a>;
}

impl<'a, T: ?Sized> ProbeRouterOther<'a> for &Probe<'a, T> {
    fn __model_trace_router(self) -> super::RouterParts<'a> {
        super::RouterParts::NotRouting
    }
}

/// `probe_router!(&value)`: the router's `(logits, weights, experts)` as [`RouterParts`](super::RouterParts).
#[macro_export]
#[doc(hidden)]
macro_rules! __model_trace_probe_router {
    ($value:expr) => {{
        #[allow(unused_imports)]
        use $crate::__private::{
            ProbeRouterOther as _, ProbeRouterParts as _, ProbeRouterWrapped as _,
        };
        (&&&$crate::__private::Probe($value)).__model_trace_router()
    }};
}

// probe_mut!: the same dispatch for a value that an intervention may change in place. The
// wrapper holds the `&mut` in a cell so that the method, called through shared references,
// can take it out.

/// The wrapper that `probe_mut!` dispatches on.
pub struct ProbeMut<'a, T: ?Sized>(pub std::cell::Cell<Option<&'a mut T>>);

pub trait ProbeMutTensor<'a> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor>;
}

impl<'a, T: TraceTensor + 'a> ProbeMutTensor<'a> for &&&ProbeMut<'a, T> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor> {
        self.0.take().map(|t| t as &mut dyn TraceTensor)
    }
}

pub trait ProbeMutWrapped<'a> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor>;
}

impl<'a, T: TraceTensor + 'a, E> ProbeMutWrapped<'a> for &&ProbeMut<'a, Result<T, E>> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor> {
        let inner = self.0.take()?;
        inner.as_mut().ok().map(|t| t as &mut dyn TraceTensor)
    }
}

impl<'a, T: TraceTensor + 'a> ProbeMutWrapped<'a> for &&ProbeMut<'a, Option<T>> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor> {
        let inner = self.0.take()?;
        inner.as_mut().map(|t| t as &mut dyn TraceTensor)
    }
}

pub trait ProbeMutOther<'a> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor>;
}

impl<'a, T: ?Sized> ProbeMutOther<'a> for &ProbeMut<'a, T> {
    fn __model_trace_probe_mut(self) -> Option<&'a mut dyn TraceTensor> {
        None
    }
}

/// `probe_mut!(&mut value)`: `Option<&mut dyn TraceTensor>`, `Some` when the value is a tensor
/// or an `Ok`/`Some` of one, so that an intervention can change it.
#[macro_export]
#[doc(hidden)]
macro_rules! __model_trace_probe_mut {
    ($value:expr) => {{
        #[allow(unused_imports)]
        use $crate::__private::{ProbeMutOther as _, ProbeMutTensor as _, ProbeMutWrapped as _};
        (&&&$crate::__private::ProbeMut(::core::cell::Cell::new(::core::option::Option::Some(
            $value,
        ))))
            .__model_trace_probe_mut()
    }};
}

// A borrowed input (`x: &T`) is changed in a copy of its own: the expansion shadows the
// parameter with a reference to the copy. A tensor that can be cloned gets one; anything
// else cannot be changed, which the guard reports as the tracepoint's error.

pub trait ReplaceBorrowedTensor<'a, T> {
    fn __model_trace_replace_borrowed(self, guard: &super::LayerGuard) -> Option<Box<T>>;
}

impl<'a, T: TraceTensor + Clone + 'a> ReplaceBorrowedTensor<'a, T> for &&Probe<'a, T> {
    fn __model_trace_replace_borrowed(self, guard: &super::LayerGuard) -> Option<Box<T>> {
        let mut copy = Box::new(self.0.clone());
        guard.replace_input(Some(&mut *copy));
        Some(copy)
    }
}

pub trait ReplaceBorrowedOther<'a, T: ?Sized> {
    fn __model_trace_replace_borrowed(self, guard: &super::LayerGuard) -> Option<Box<T>>;
}

impl<'a, T: ?Sized> ReplaceBorrowedOther<'a, T> for &Probe<'a, T> {
    fn __model_trace_replace_borrowed(self, guard: &super::LayerGuard) -> Option<Box<T>> {
        guard.replace_input(None);
        None
    }
}

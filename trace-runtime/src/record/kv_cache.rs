//! State of the KV cache at each generation step, and what the steps add up to.

use serde::{Deserialize, Serialize};

/// Window used by the tracer's summary to judge thrashing (see [`KvCacheSessionTrace::has_thrashing`]).
pub const DEFAULT_THRASHING_WINDOW: usize = 16;
/// Evictions per step at or above which the summary calls the window thrashing.
pub const DEFAULT_THRASHING_EVICTIONS_PER_STEP: f32 = 0.5;

/// The cache after one generation step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvCacheStateTrace {
    /// Generation step: this cache's steps are numbered 0, 1, 2, ...
    pub step: usize,
    /// Which layer's cache this is; `None` for one cache of the whole model.
    #[serde(default)]
    pub layer: Option<usize>,
    /// Positions holding valid keys/values.
    pub valid_positions: usize,
    /// Positions the cache can hold.
    pub capacity: usize,
    /// Memory held by the cache.
    pub cache_size_bytes: usize,
    /// Positions evicted during this step.
    pub evictions_this_step: usize,
    /// Fraction of lookups served from the cache, in `[0, 1]`; `None` when the cache does not
    /// measure it (an append-only cache has nothing to miss), so that unmeasured steps do not
    /// drag the session average to zero.
    #[serde(default, with = "crate::float::option")]
    pub cache_hit_rate: Option<f32>,
}

impl KvCacheStateTrace {
    /// An empty cache of `capacity` positions at `step`.
    pub fn new(step: usize, capacity: usize) -> Self {
        Self {
            step,
            capacity,
            ..Self::default()
        }
    }

    /// `valid_positions / capacity` (0 for a zero capacity).
    #[allow(clippy::cast_precision_loss)]
    pub fn utilization(&self) -> f32 {
        if self.capacity == 0 {
            0.0
        } else {
            self.valid_positions as f32 / self.capacity as f32
        }
    }
}

/// Every step of a generation session and the running totals.
///
/// A model may have one cache per layer: the memory it holds at a moment is the sum of each
/// cache's latest size, and `peak_memory_bytes` is the largest such sum.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KvCacheSessionTrace {
    /// Steps in recording order.
    pub steps: Vec<KvCacheStateTrace>,
    /// Steps counted in the totals, kept in `steps` or not.
    #[serde(default)]
    pub steps_seen: usize,
    /// Sum of `evictions_this_step`.
    pub total_evictions: usize,
    /// Largest total of the caches' latest sizes.
    pub peak_memory_bytes: usize,
    /// Mean hit rate over the steps that reported one (0 when none did; see `hit_rate_steps`).
    #[serde(with = "crate::float::single")]
    pub avg_hit_rate: f32,
    /// Steps that reported a hit rate.
    pub hit_rate_steps: usize,
    /// Each cache's latest size, by layer.
    #[serde(default)]
    pub cache_bytes: Vec<(Option<usize>, usize)>,
    /// Evictions of the last `DEFAULT_THRASHING_WINDOW` steps, for the summary's thrashing
    /// verdict when the steps themselves are not all kept.
    #[serde(default)]
    recent_evictions: std::collections::VecDeque<usize>,
}

impl KvCacheSessionTrace {
    /// Appends a step and updates the totals. A non-finite hit rate is stored as `None`
    /// (unmeasured) rather than poisoning the average.
    pub fn add_step(&mut self, mut step: KvCacheStateTrace) {
        step.cache_hit_rate = step.cache_hit_rate.filter(|r| r.is_finite());
        self.account(&step);
        self.steps.push(step);
    }

    /// Updates the totals with `step` without keeping it.
    pub fn account(&mut self, step: &KvCacheStateTrace) {
        self.steps_seen += 1;
        self.total_evictions += step.evictions_this_step;
        match self
            .cache_bytes
            .iter_mut()
            .find(|(layer, _)| *layer == step.layer)
        {
            Some((_, bytes)) => *bytes = step.cache_size_bytes,
            None => self.cache_bytes.push((step.layer, step.cache_size_bytes)),
        }
        let held: usize = self.cache_bytes.iter().map(|(_, bytes)| bytes).sum();
        self.peak_memory_bytes = self.peak_memory_bytes.max(held);
        if let Some(rate) = step.cache_hit_rate.filter(|r| r.is_finite()) {
            self.hit_rate_steps += 1;
            #[allow(clippy::cast_precision_loss)]
            let n = self.hit_rate_steps as f32;
            self.avg_hit_rate += (rate - self.avg_hit_rate) / n;
        }
        if self.recent_evictions.len() == DEFAULT_THRASHING_WINDOW {
            self.recent_evictions.pop_front();
        }
        self.recent_evictions.push_back(step.evictions_this_step);
    }

    /// [`has_thrashing`](Self::has_thrashing) with the default window and threshold, over the
    /// last steps counted (kept or not).
    #[allow(clippy::cast_precision_loss)]
    pub fn has_default_thrashing(&self) -> bool {
        if self.recent_evictions.len() < DEFAULT_THRASHING_WINDOW {
            return false;
        }
        let evictions: usize = self.recent_evictions.iter().sum();
        evictions as f32 / DEFAULT_THRASHING_WINDOW as f32 >= DEFAULT_THRASHING_EVICTIONS_PER_STEP
    }

    /// The mean hit rate, or `None` when no step reported one.
    pub fn hit_rate(&self) -> Option<f32> {
        (self.hit_rate_steps > 0).then_some(self.avg_hit_rate)
    }

    /// Thrashing: over the last `window` steps, the cache evicted at least `threshold` positions
    /// per step on average — it keeps throwing away context it just built.
    ///
    /// A session shorter than `window` steps is not judged (returns `false`), nor is a zero
    /// window: a few evictions at the start of a session are not yet a pattern.
    #[allow(clippy::cast_precision_loss)]
    pub fn has_thrashing(&self, window: usize, threshold: f32) -> bool {
        if window == 0 || self.steps.len() < window {
            return false;
        }
        let recent = &self.steps[self.steps.len() - window..];
        let evictions: usize = recent.iter().map(|s| s.evictions_this_step).sum();
        evictions as f32 / window as f32 >= threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_hit_rate_over_reporting_steps_only() {
        let mut session = KvCacheSessionTrace::default();
        assert_eq!(session.hit_rate(), None);
        for (i, rate) in [Some(0.5), None, Some(1.0), Some(f32::NAN)]
            .into_iter()
            .enumerate()
        {
            let mut step = KvCacheStateTrace::new(i, 8);
            step.valid_positions = i + 1;
            step.cache_size_bytes = [100, 300, 200, 50][i];
            step.evictions_this_step = i % 2;
            step.cache_hit_rate = rate;
            session.add_step(step);
        }
        assert_eq!(session.total_evictions, 2);
        assert_eq!(session.peak_memory_bytes, 300);
        assert_eq!(session.steps_seen, 4);
        assert_eq!(session.hit_rate_steps, 2);
        assert_eq!(session.hit_rate(), Some(0.75));
        assert_eq!(session.steps[3].cache_hit_rate, None);
        assert_eq!(session.steps[1].utilization(), 0.25);
        assert_eq!(KvCacheStateTrace::new(0, 0).utilization(), 0.0);
    }

    #[test]
    fn peak_memory_is_the_sum_of_the_caches() {
        let mut session = KvCacheSessionTrace::default();
        let step = |layer, bytes| KvCacheStateTrace {
            layer,
            cache_size_bytes: bytes,
            ..KvCacheStateTrace::default()
        };
        session.add_step(step(Some(0), 100));
        session.add_step(step(Some(1), 100));
        session.add_step(step(Some(0), 150));
        assert_eq!(session.peak_memory_bytes, 250);
        session.add_step(step(Some(1), 20));
        session.account(&step(None, 5));
        assert_eq!(session.peak_memory_bytes, 250);
        assert_eq!(
            session.cache_bytes,
            [(Some(0), 150), (Some(1), 20), (None, 5)]
        );
        assert_eq!((session.steps.len(), session.steps_seen), (4, 5));
    }

    #[test]
    fn thrashing_needs_a_full_window_of_evictions() {
        let mut session = KvCacheSessionTrace::default();
        for step in 0..10 {
            let mut s = KvCacheStateTrace::new(step, 4);
            s.evictions_this_step = usize::from(step >= 6);
            session.add_step(s);
        }
        assert!(!session.has_thrashing(20, 0.1), "shorter than the window");
        assert!(!session.has_thrashing(0, 0.0));
        assert!(session.has_thrashing(4, 1.0));
        assert!(session.has_thrashing(8, 0.5));
        assert!(!session.has_thrashing(10, 0.5));
        assert!(!session.has_default_thrashing(), "only 10 steps");
        for step in 10..26 {
            let mut s = KvCacheStateTrace::new(step, 4);
            s.evictions_this_step = 1;
            session.account(&s);
        }
        assert!(session.has_default_thrashing());
    }
}

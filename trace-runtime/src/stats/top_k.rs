//! The `k` largest values of a row, by selection rather than a sort: attention rows keep their
//! heaviest keys with it, logit rows their most likely tokens.

/// Writes the `k` largest finite values of `values` that are `>= min_value` into
/// `positions` / `kept`, largest first; equal values keep the lower position first, so the
/// result equals a stable sort by descending value truncated to `k`.
///
/// Selection, not a sort of the row: the output buffers hold a min-heap of the best `k` seen so
/// far, a value is compared with its root once, and only the `k` kept values are sorted at the
/// end. Both buffers are cleared first and grow to at most `min(k, n)`; nothing else allocates.
pub fn top_k_by_selection(
    values: &[f32],
    k: usize,
    min_value: f32,
    positions: &mut Vec<usize>,
    kept: &mut Vec<f32>,
) {
    positions.clear();
    kept.clear();
    if k == 0 {
        return;
    }
    let cap = k.min(values.len());
    positions.reserve(cap);
    kept.reserve(cap);
    let mut heap = Heap { positions, kept };
    // Fill: the first k admissible values enter unconditionally.
    let mut next = 0;
    while next < values.len() && heap.len() < k {
        let v = values[next];
        // NaN fails `>=`; infinities are excluded explicitly.
        if v >= min_value && v.is_finite() {
            heap.push(v, next);
        }
        next += 1;
    }
    if heap.len() == k {
        // From here a value must beat the root (the worst kept value, itself >= min_value); an
        // equal value comes later in the row and loses the tie, so `>` is exact.
        let mut bar = heap.kept[0];
        let offer = |heap: &mut Heap<'_>, bar: &mut f32, v: f32, pos: usize| {
            if v > *bar && v != f32::INFINITY {
                heap.replace_root(v, pos);
                *bar = heap.kept[0];
            }
        };
        const CHUNK: usize = 16;
        let mut chunks = values[next..].chunks_exact(CHUNK);
        for chunk in &mut chunks {
            // Most chunks of a row hold nothing better than the bar: one vectorised test skips them.
            if chunk.iter().fold(false, |any, &v| any | (v > bar)) {
                for (i, &v) in chunk.iter().enumerate() {
                    offer(&mut heap, &mut bar, v, next + i);
                }
            }
            next += CHUNK;
        }
        for (i, &v) in chunks.remainder().iter().enumerate() {
            offer(&mut heap, &mut bar, v, next + i);
        }
    }
    heap.sort_descending();
}

/// A min-heap on (value, then higher position = smaller) stored in two parallel vectors, so the
/// kept entries end up in the caller's buffers with no scratch space.
struct Heap<'a> {
    positions: &'a mut Vec<usize>,
    kept: &'a mut Vec<f32>,
}

impl Heap<'_> {
    fn len(&self) -> usize {
        self.kept.len()
    }

    /// `a` ranks below `b`: smaller value, or same value at a later position.
    fn worse(&self, a: usize, b: usize) -> bool {
        let (va, vb) = (self.kept[a], self.kept[b]);
        va < vb || (va == vb && self.positions[a] > self.positions[b])
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.kept.swap(a, b);
        self.positions.swap(a, b);
    }

    fn push(&mut self, value: f32, pos: usize) {
        self.kept.push(value);
        self.positions.push(pos);
        let mut child = self.len() - 1;
        while child > 0 {
            let parent = (child - 1) / 2;
            if !self.worse(child, parent) {
                break;
            }
            self.swap(child, parent);
            child = parent;
        }
    }

    fn replace_root(&mut self, value: f32, pos: usize) {
        self.kept[0] = value;
        self.positions[0] = pos;
        self.sift_down(0, self.len());
    }

    fn sift_down(&mut self, mut node: usize, end: usize) {
        loop {
            let left = 2 * node + 1;
            if left >= end {
                break;
            }
            let right = left + 1;
            let child = if right < end && self.worse(right, left) {
                right
            } else {
                left
            };
            if !self.worse(child, node) {
                break;
            }
            self.swap(child, node);
            node = child;
        }
    }

    /// Heapsort: moving the worst to the back repeatedly leaves the best first.
    fn sort_descending(&mut self) {
        let mut end = self.len();
        while end > 1 {
            end -= 1;
            self.swap(0, end);
            self.sift_down(0, end);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// xorshift64*: deterministic rows without a dev-dependency.
    pub(crate) struct Rng(pub(crate) u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub(crate) fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    fn sort_based(values: &[f32], k: usize, min: f32) -> (Vec<usize>, Vec<f32>) {
        let mut idx: Vec<usize> = (0..values.len())
            .filter(|&i| values[i].is_finite() && values[i] >= min)
            .collect();
        idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
        idx.truncate(k);
        let w = idx.iter().map(|&i| values[i]).collect();
        (idx, w)
    }

    #[test]
    fn top_k_equals_sort_based_top_k_on_random_rows() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut pos, mut kept) = (Vec::new(), Vec::new());
        for case in 0..400 {
            let n = (rng.next() % 300) as usize;
            // coarse values in some rows so ties are frequent
            let coarse = case % 3 == 0;
            let mut row: Vec<f32> = (0..n)
                .map(|_| {
                    let u = rng.unit();
                    if coarse {
                        (u * 8.0).floor() / 8.0
                    } else {
                        u
                    }
                })
                .collect();
            if case % 7 == 0 && n > 3 {
                row[1] = f32::NAN;
                row[n - 1] = f32::INFINITY;
                row[2] = f32::NEG_INFINITY;
            }
            for k in [0, 1, 2, 5, 10, 32, 500] {
                for min in [f32::NEG_INFINITY, 0.25] {
                    top_k_by_selection(&row, k, min, &mut pos, &mut kept);
                    let (want_pos, want_w) = sort_based(&row, k, min);
                    assert_eq!(pos, want_pos, "case {case} n {n} k {k} min {min}");
                    assert_eq!(kept, want_w);
                }
            }
        }
    }
}

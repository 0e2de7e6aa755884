//! Where a tensor's elements lie in its storage, in the fewest dimensions: the kernel walks a
//! contiguous tensor (almost every one) as one run, and a view (transposed, narrowed, broadcast)
//! through its strides, in place.

/// Dimensions the kernel takes (candle's tensors have at most a handful).
pub(super) const MAX_RANK: usize = 8;

/// A tensor's elements in its storage, row-major: element `i` (of `count`) is at `offset` plus
/// `Σ index_d · strides[d]`, all in elements. Held inline (no allocation: every device read
/// makes one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeviceLayout {
    pub(super) offset: usize,
    pub(super) count: usize,
    /// At least one dimension; size-1 dimensions dropped, runs that are contiguous in memory
    /// merged. `dims[..rank]` and `strides[..rank]` are the layout's.
    rank: usize,
    dims: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
}

impl DeviceLayout {
    /// The layout of `dims` with `strides` from `offset`; `None` when more than [`MAX_RANK`]
    /// dimensions remain after merging.
    pub(super) fn new(offset: usize, dims: &[usize], strides: &[usize]) -> Option<Self> {
        let count = dims.iter().product();
        let mut layout = Self {
            offset,
            count,
            rank: 0,
            dims: [0; MAX_RANK],
            strides: [0; MAX_RANK],
        };
        for (&dim, &stride) in dims.iter().zip(strides) {
            if dim == 1 {
                continue;
            }
            let last = layout.rank.checked_sub(1);
            match last {
                // The outer dimension steps over exactly one run of the inner one.
                Some(at) if layout.strides[at] == dim * stride => {
                    layout.dims[at] *= dim;
                    layout.strides[at] = stride;
                }
                _ => {
                    let at = layout.rank;
                    *layout.dims.get_mut(at)? = dim;
                    layout.strides[at] = stride;
                    layout.rank += 1;
                }
            }
        }
        if layout.rank == 0 {
            (layout.dims[0], layout.strides[0], layout.rank) = (count, 1, 1);
        }
        Some(layout)
    }

    /// The dimensions, outermost first.
    pub(super) fn dims(&self) -> &[usize] {
        &self.dims[..self.rank]
    }

    /// Each dimension's stride, in elements.
    pub(super) fn strides(&self) -> &[usize] {
        &self.strides[..self.rank]
    }

    /// The storage index of element `i`, as the kernel computes it.
    #[cfg(test)]
    fn element_at(&self, mut i: usize) -> usize {
        let mut at = self.offset;
        for (&dim, &stride) in self.dims().iter().zip(self.strides()).rev() {
            at += (i % dim) * stride;
            i /= dim;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    /// The storage indices of a view's elements in row-major order, as candle reads them: the
    /// view is of `0, 1, 2, ...`, so its values are their own indices.
    fn candle_indices(view: &Tensor) -> Vec<usize> {
        let values: Vec<f32> = view.flatten_all().unwrap().to_vec1().unwrap();
        values.into_iter().map(|v| v as usize).collect()
    }

    #[test]
    fn contiguous_tensors_are_one_run() {
        let layout = DeviceLayout::new(6, &[2, 3, 4], &[12, 4, 1]).unwrap();
        assert_eq!((layout.dims(), layout.strides()), (&[24][..], &[1][..]));
        assert_eq!((layout.offset, layout.count), (6, 24));
        let scalar = DeviceLayout::new(0, &[], &[]).unwrap();
        assert_eq!((scalar.count, scalar.dims()), (1, &[1][..]));
    }

    #[test]
    fn more_dimensions_than_the_kernel_takes_are_refused_unless_they_merge() {
        let dims = [2usize; MAX_RANK + 1];
        let contiguous: Vec<usize> = (0..dims.len()).rev().map(|d| 1 << d).collect();
        let merged = DeviceLayout::new(0, &dims, &contiguous).unwrap();
        assert_eq!(
            (merged.dims(), merged.strides()),
            (&[1 << dims.len()][..], &[1][..])
        );
        // Every other dimension transposed: nothing merges.
        let scattered: Vec<usize> = (0..dims.len()).map(|d| 1 << d).collect();
        assert_eq!(DeviceLayout::new(0, &dims, &scattered), None);
        let fits = DeviceLayout::new(0, &dims[1..], &scattered[1..]).unwrap();
        assert_eq!(fits.dims().len(), MAX_RANK);
    }

    #[test]
    fn views_address_what_candle_addresses() {
        let base = Tensor::arange(0f32, 120.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 3, 4, 5))
            .unwrap();
        let views = [
            base.clone(),
            base.t().unwrap(),
            base.narrow(2, 1, 2).unwrap(),
            base.permute((2, 0, 3, 1)).unwrap(),
            base.narrow(0, 1, 1).unwrap().narrow(3, 2, 3).unwrap(),
            base.narrow(3, 0, 1)
                .unwrap()
                .broadcast_as((2, 3, 4, 7))
                .unwrap(),
        ];
        for view in &views {
            let layout = view.layout();
            let device =
                DeviceLayout::new(layout.start_offset(), view.dims(), layout.stride()).unwrap();
            let ours: Vec<usize> = (0..device.count).map(|i| device.element_at(i)).collect();
            assert_eq!(ours, candle_indices(view), "{:?}", view.layout());
            if view.is_contiguous() {
                assert_eq!((device.dims().len(), device.strides()[0]), (1, 1));
            }
        }
    }
}

//! Where a tensor's elements lie in its storage, in the fewest dimensions: the kernel walks a
//! contiguous tensor (almost every one) as one run, and a view (transposed, narrowed, broadcast)
//! through its strides, in place.

/// Dimensions the kernel takes (candle's tensors have at most a handful).
pub(super) const MAX_RANK: usize = 8;

/// A tensor's elements in its storage, row-major: element `i` (of `count`) is at `offset` plus
/// `Σ index_d · strides[d]`, all in elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeviceLayout {
    pub(super) offset: usize,
    pub(super) count: usize,
    /// At least one dimension; size-1 dimensions dropped, runs that are contiguous in memory
    /// merged.
    pub(super) dims: Vec<usize>,
    pub(super) strides: Vec<usize>,
}

impl DeviceLayout {
    /// The layout of `dims` with `strides` from `offset`; `None` when more than [`MAX_RANK`]
    /// dimensions remain after merging.
    pub(super) fn new(offset: usize, dims: &[usize], strides: &[usize]) -> Option<Self> {
        let count = dims.iter().product();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(dims.len());
        for (&dim, &stride) in dims.iter().zip(strides) {
            if dim == 1 {
                continue;
            }
            match merged.last_mut() {
                // The outer dimension steps over exactly one run of the inner one.
                Some((outer_dim, outer_stride)) if *outer_stride == dim * stride => {
                    *outer_dim *= dim;
                    *outer_stride = stride;
                }
                _ => merged.push((dim, stride)),
            }
        }
        if merged.is_empty() {
            merged.push((count, 1));
        }
        if merged.len() > MAX_RANK {
            return None;
        }
        Some(Self {
            offset,
            count,
            dims: merged.iter().map(|&(dim, _)| dim).collect(),
            strides: merged.iter().map(|&(_, stride)| stride).collect(),
        })
    }

    /// The storage index of element `i`, as the kernel computes it.
    #[cfg(test)]
    fn element_at(&self, mut i: usize) -> usize {
        let mut at = self.offset;
        for (&dim, &stride) in self.dims.iter().zip(&self.strides).rev() {
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
        assert_eq!(
            (layout.dims.as_slice(), layout.strides.as_slice()),
            (&[24][..], &[1][..])
        );
        assert_eq!((layout.offset, layout.count), (6, 24));
        let scalar = DeviceLayout::new(0, &[], &[]).unwrap();
        assert_eq!((scalar.count, scalar.dims.as_slice()), (1, &[1][..]));
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
                assert_eq!((device.dims.len(), device.strides[0]), (1, 1));
            }
        }
    }
}

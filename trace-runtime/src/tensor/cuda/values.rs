//! A device tensor's values copied to the host, in its own dtype, widened to `f32` as candle's
//! `to_dtype(F32)` does on the CPU (every value exactly; NaN payloads aside, which fingerprints
//! and captures canonicalise anyway).

use candle_core::DType;

use crate::tensor::TensorError;

/// The `f32` values of little-endian `bytes` of `dtype`.
pub(super) fn widen(bytes: &[u8], dtype: DType) -> Result<Vec<f32>, TensorError> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        #[allow(clippy::cast_possible_truncation)]
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| widen_f16(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
            .collect(),
        other => {
            return Err(TensorError::Backend(format!(
                "no device copy of {} values",
                other.as_str()
            )))
        }
    })
}

/// An IEEE half's value as `f32` (exact), the way `widen_f16` of stats.cu computes it.
fn widen_f16(half: u16) -> f32 {
    let bits = u32::from(half);
    let sign = (bits & 0x8000) << 16;
    let exponent = (bits >> 10) & 0x1f;
    let mantissa = bits & 0x3ff;
    match exponent {
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mantissa << 13)),
        0 => {
            #[allow(clippy::cast_precision_loss)]
            let magnitude = mantissa as f32 * 5.960_464_5e-8;
            if sign != 0 {
                -magnitude
            } else {
                magnitude
            }
        }
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 and bf16 bit pattern widens to what candle's CPU conversion (the `half` crate)
    /// gives, NaN to a NaN.
    #[test]
    fn every_half_widens_as_candle_widens_it() {
        let bits: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let f16 = widen(&bytes, DType::F16).unwrap();
        let bf16 = widen(&bytes, DType::BF16).unwrap();
        for (at, &b) in bits.iter().enumerate() {
            let cases = [
                (f16[at], half::f16::from_bits(b).to_f32(), "f16"),
                (bf16[at], half::bf16::from_bits(b).to_f32(), "bf16"),
            ];
            for (ours, theirs, dtype) in cases {
                if theirs.is_nan() {
                    assert!(ours.is_nan(), "{dtype} {b:#06x}");
                } else {
                    assert_eq!(ours.to_bits(), theirs.to_bits(), "{dtype} {b:#06x}");
                }
            }
        }
    }

    #[test]
    fn wider_floats_are_read_as_they_are() {
        let values = [1.5f64, -0.0, f64::INFINITY, 1e300];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let widened = widen(&bytes, DType::F64).unwrap();
        assert_eq!(widened[..3], [1.5, -0.0, f32::INFINITY]);
        assert_eq!(widened[3], f32::INFINITY);
        assert!(widen(&[0, 1], DType::U8).is_err());
    }
}

// The statistics of one tensor in one kernel launch: counts of NaN, ±Inf and finite values, the
// finite minimum and maximum, and the sums of (x - shift) and (x - shift)² over the finite values
// in double precision, with `shift` the mean of the first (up to) 8 finite values, so that the
// variance keeps its digits when the mean is large against the spread (as the CPU kernel does).
//
// The tensor is read in place, through its layout (offset, dims, strides in elements), in its own
// dtype. Each block reduces its share (warp shuffles, then one warp over the block's warps) and
// adds it to the tensor's slot with atomics; the slot is zero before the launch (the batch clears
// its slots once per forward pass), so no second launch is needed:
//
//   slot[0] NaN count        slot[3] Σ (x - shift)     (double)
//   slot[1] ±Inf count       slot[4] Σ (x - shift)²    (double)
//   slot[2] finite count     slot[5] low: key(max), high: ~key(min)  (0: no finite value)
//                            slot[6] shift             (double)
//
// key() maps floats to unsigned integers in the same order; no finite float maps to 0 in either
// half, which is what the zeroed slot holds.
//
// Compiled at run time by NVRTC (no headers: f16 and bf16 are widened by hand, exactly).

#define MAX_RANK 8

struct Layout {
    unsigned long long offset;
    unsigned long long count;
    unsigned long long rank;
    unsigned long long dims[MAX_RANK];
    unsigned long long strides[MAX_RANK];
};

__device__ __forceinline__ unsigned long long element_at(const Layout& layout,
                                                         unsigned long long i) {
    if (layout.rank == 1) {
        return layout.offset + i * layout.strides[0];
    }
    unsigned long long at = layout.offset;
    for (int d = (int)layout.rank - 1; d >= 0; --d) {
        unsigned long long dim = layout.dims[d];
        at += (i % dim) * layout.strides[d];
        i /= dim;
    }
    return at;
}

__device__ __forceinline__ float widen_f16(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int exponent = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int mantissa = (unsigned int)h & 0x3ffu;
    if (exponent == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    }
    if (exponent == 0u) {
        // Zero or subnormal: mantissa · 2⁻²⁴, exact in f32.
        float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

__device__ __forceinline__ float load_f32(const float* x, unsigned long long at) { return x[at]; }
__device__ __forceinline__ float load_f64(const double* x, unsigned long long at) {
    return (float)x[at];
}
__device__ __forceinline__ float load_f16(const unsigned short* x, unsigned long long at) {
    return widen_f16(x[at]);
}
__device__ __forceinline__ float load_bf16(const unsigned short* x, unsigned long long at) {
    return __uint_as_float(((unsigned int)x[at]) << 16);
}

__device__ __forceinline__ unsigned int key(float f) {
    unsigned int bits = __float_as_uint(f);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ bool is_finite(float v) { return fabsf(v) <= 3.402823466e38f; }

// Folds a warp's partial results into lane 0's.
__device__ __forceinline__ void reduce_warp(double& sum, double& sq, unsigned int& nan,
                                            unsigned int& inf, unsigned int& finite, float& lo,
                                            float& hi) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
        sq += __shfl_down_sync(0xffffffffu, sq, offset);
        nan += __shfl_down_sync(0xffffffffu, nan, offset);
        inf += __shfl_down_sync(0xffffffffu, inf, offset);
        finite += __shfl_down_sync(0xffffffffu, finite, offset);
        lo = fminf(lo, __shfl_down_sync(0xffffffffu, lo, offset));
        hi = fmaxf(hi, __shfl_down_sync(0xffffffffu, hi, offset));
    }
}

#define STATS_KERNEL(NAME, T, LOAD)                                                              \
    extern "C" __global__ void NAME(const T* x, Layout layout, unsigned long long* slot) {      \
        __shared__ double shared_shift;                                                          \
        __shared__ double warp_sum[32];                                                          \
        __shared__ double warp_sq[32];                                                           \
        __shared__ unsigned int warp_nan[32];                                                    \
        __shared__ unsigned int warp_inf[32];                                                    \
        __shared__ unsigned int warp_finite[32];                                                 \
        __shared__ float warp_min[32];                                                           \
        __shared__ float warp_max[32];                                                           \
        const unsigned long long count = layout.count;                                           \
        if (threadIdx.x == 0) {                                                                  \
            double first = 0.0;                                                                  \
            unsigned int finite = 0;                                                             \
            unsigned long long probe = count < 8ull ? count : 8ull;                              \
            for (unsigned long long i = 0; i < probe; ++i) {                                     \
                float v = LOAD(x, element_at(layout, i));                                        \
                if (is_finite(v)) {                                                              \
                    first += (double)v;                                                          \
                    ++finite;                                                                    \
                }                                                                                \
            }                                                                                    \
            shared_shift = finite ? first / (double)finite : 0.0;                                \
        }                                                                                        \
        __syncthreads();                                                                         \
        const double shift = shared_shift;                                                       \
        double sum = 0.0, sq = 0.0;                                                              \
        unsigned int nan = 0, inf = 0, finite = 0;                                               \
        float lo = __uint_as_float(0x7f800000u), hi = -__uint_as_float(0x7f800000u);             \
        const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;              \
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;   \
             i < count; i += step) {                                                             \
            float v = LOAD(x, element_at(layout, i));                                            \
            if (v != v) {                                                                        \
                ++nan;                                                                           \
            } else if (!is_finite(v)) {                                                          \
                ++inf;                                                                           \
            } else {                                                                             \
                double d = (double)v - shift;                                                    \
                sum += d;                                                                        \
                sq += d * d;                                                                     \
                ++finite;                                                                        \
                lo = fminf(lo, v);                                                               \
                hi = fmaxf(hi, v);                                                               \
            }                                                                                    \
        }                                                                                        \
        reduce_warp(sum, sq, nan, inf, finite, lo, hi);                                          \
        const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;                    \
        if (lane == 0) {                                                                         \
            warp_sum[warp] = sum;                                                                \
            warp_sq[warp] = sq;                                                                  \
            warp_nan[warp] = nan;                                                                \
            warp_inf[warp] = inf;                                                                \
            warp_finite[warp] = finite;                                                          \
            warp_min[warp] = lo;                                                                 \
            warp_max[warp] = hi;                                                                 \
        }                                                                                        \
        __syncthreads();                                                                         \
        if (warp != 0) {                                                                         \
            return;                                                                              \
        }                                                                                        \
        const unsigned int warps = (blockDim.x + 31u) >> 5;                                      \
        const bool mine = lane < warps;                                                          \
        sum = mine ? warp_sum[lane] : 0.0;                                                       \
        sq = mine ? warp_sq[lane] : 0.0;                                                         \
        nan = mine ? warp_nan[lane] : 0u;                                                        \
        inf = mine ? warp_inf[lane] : 0u;                                                        \
        finite = mine ? warp_finite[lane] : 0u;                                                  \
        lo = mine ? warp_min[lane] : __uint_as_float(0x7f800000u);                               \
        hi = mine ? warp_max[lane] : -__uint_as_float(0x7f800000u);                              \
        reduce_warp(sum, sq, nan, inf, finite, lo, hi);                                          \
        if (lane != 0) {                                                                         \
            return;                                                                              \
        }                                                                                        \
        if (nan) atomicAdd(&slot[0], (unsigned long long)nan);                                   \
        if (inf) atomicAdd(&slot[1], (unsigned long long)inf);                                   \
        if (finite) {                                                                            \
            atomicAdd(&slot[2], (unsigned long long)finite);                                     \
            atomicAdd((double*)&slot[3], sum);                                                   \
            atomicAdd((double*)&slot[4], sq);                                                    \
            atomicMax((unsigned int*)&slot[5], key(hi));                                         \
            atomicMax((unsigned int*)&slot[5] + 1, ~key(lo));                                    \
        }                                                                                        \
        if (blockIdx.x == 0) {                                                                   \
            ((double*)slot)[6] = shift;                                                          \
        }                                                                                        \
    }

STATS_KERNEL(model_trace_stats_f32, float, load_f32)
STATS_KERNEL(model_trace_stats_f64, double, load_f64)
STATS_KERNEL(model_trace_stats_f16, unsigned short, load_f16)
STATS_KERNEL(model_trace_stats_bf16, unsigned short, load_bf16)

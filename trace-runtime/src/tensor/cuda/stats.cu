// The reads of a batch of tensors in one kernel launch. Each read (a `Task`) is one of:
//
// * statistics: counts of NaN, ±Inf and finite values, the finite minimum and maximum, and the
//   sums of (x - shift) and (x - shift)² over the finite values in double precision, with
//   `shift` the mean of the first (up to) 8 finite values, so that the variance keeps its digits
//   when the mean is large against the spread (as the CPU kernel does);
// * a gather: the values copied, in their own dtype and in row-major order, to a staging buffer
//   that is then copied to the host in one piece (for digests, and for tensors summarised there).
//
// A task says where its result goes (`target`: the device address of its slot or of its staging
// bytes), so that one launch serves slots and staging in any number of buffers.
//
// The tensor is read in place, through its layout (offset, dims, strides in elements), in its own
// dtype. The launch's blocks are dealt out to the tasks (`first_block`: a task's first block,
// increasing; the host sizes each task's share); a block finds its task by binary search. A
// statistics task's blocks each reduce their share (warp shuffles, then one warp over the block's
// warps) and add it to the task's slot with atomics; the slot is zero before the launch (the
// batch clears its slots once per batch):
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

#define DTYPE_F32 0
#define DTYPE_F64 1
#define DTYPE_F16 2
#define DTYPE_BF16 3

#define KIND_STATS 0
#define KIND_GATHER 1

struct Layout {
    unsigned long long offset;
    unsigned long long count;
    unsigned long long rank;
    unsigned long long dims[MAX_RANK];
    unsigned long long strides[MAX_RANK];
};

struct Task {
    // The tensor's storage.
    unsigned long long address;
    // KIND_STATS: the slot's device address; KIND_GATHER: the staging bytes' device address.
    unsigned long long target;
    unsigned int first_block;
    unsigned int blocks;
    unsigned int kind;
    unsigned int dtype;
    Layout layout;
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

struct LoadF32 {
    static __device__ __forceinline__ float at(unsigned long long address, unsigned long long i) {
        return ((const float*)address)[i];
    }
};
struct LoadF64 {
    static __device__ __forceinline__ float at(unsigned long long address, unsigned long long i) {
        return (float)((const double*)address)[i];
    }
};
struct LoadF16 {
    static __device__ __forceinline__ float at(unsigned long long address, unsigned long long i) {
        return widen_f16(((const unsigned short*)address)[i]);
    }
};
struct LoadBF16 {
    static __device__ __forceinline__ float at(unsigned long long address, unsigned long long i) {
        return __uint_as_float(((unsigned int)((const unsigned short*)address)[i]) << 16);
    }
};

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

// One block's share of a statistics task, `part` of `parts` blocks.
template <typename Load>
__device__ void reduce(const Task& task, unsigned int part, unsigned int parts) {
    __shared__ double shared_shift;
    __shared__ double warp_sum[32];
    __shared__ double warp_sq[32];
    __shared__ unsigned int warp_nan[32];
    __shared__ unsigned int warp_inf[32];
    __shared__ unsigned int warp_finite[32];
    __shared__ float warp_min[32];
    __shared__ float warp_max[32];
    const Layout& layout = task.layout;
    const unsigned long long count = layout.count;
    if (threadIdx.x == 0) {
        double first = 0.0;
        unsigned int finite = 0;
        unsigned long long probe = count < 8ull ? count : 8ull;
        for (unsigned long long i = 0; i < probe; ++i) {
            float v = Load::at(task.address, element_at(layout, i));
            if (is_finite(v)) {
                first += (double)v;
                ++finite;
            }
        }
        shared_shift = finite ? first / (double)finite : 0.0;
    }
    __syncthreads();
    const double shift = shared_shift;
    double sum = 0.0, sq = 0.0;
    unsigned int nan = 0, inf = 0, finite = 0;
    float lo = __uint_as_float(0x7f800000u), hi = -__uint_as_float(0x7f800000u);
    const unsigned long long step = (unsigned long long)parts * blockDim.x;
    for (unsigned long long i = (unsigned long long)part * blockDim.x + threadIdx.x; i < count;
         i += step) {
        float v = Load::at(task.address, element_at(layout, i));
        if (v != v) {
            ++nan;
        } else if (!is_finite(v)) {
            ++inf;
        } else {
            double d = (double)v - shift;
            sum += d;
            sq += d * d;
            ++finite;
            lo = fminf(lo, v);
            hi = fmaxf(hi, v);
        }
    }
    reduce_warp(sum, sq, nan, inf, finite, lo, hi);
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_sum[warp] = sum;
        warp_sq[warp] = sq;
        warp_nan[warp] = nan;
        warp_inf[warp] = inf;
        warp_finite[warp] = finite;
        warp_min[warp] = lo;
        warp_max[warp] = hi;
    }
    __syncthreads();
    if (warp != 0) {
        return;
    }
    const unsigned int warps = (blockDim.x + 31u) >> 5;
    const bool mine = lane < warps;
    sum = mine ? warp_sum[lane] : 0.0;
    sq = mine ? warp_sq[lane] : 0.0;
    nan = mine ? warp_nan[lane] : 0u;
    inf = mine ? warp_inf[lane] : 0u;
    finite = mine ? warp_finite[lane] : 0u;
    lo = mine ? warp_min[lane] : __uint_as_float(0x7f800000u);
    hi = mine ? warp_max[lane] : -__uint_as_float(0x7f800000u);
    reduce_warp(sum, sq, nan, inf, finite, lo, hi);
    if (lane != 0) {
        return;
    }
    unsigned long long* slot = (unsigned long long*)task.target;
    if (nan) atomicAdd(&slot[0], (unsigned long long)nan);
    if (inf) atomicAdd(&slot[1], (unsigned long long)inf);
    if (finite) {
        atomicAdd(&slot[2], (unsigned long long)finite);
        atomicAdd((double*)&slot[3], sum);
        atomicAdd((double*)&slot[4], sq);
        atomicMax((unsigned int*)&slot[5], key(hi));
        atomicMax((unsigned int*)&slot[5] + 1, ~key(lo));
    }
    if (part == 0) {
        ((double*)slot)[6] = shift;
    }
}

// One block's share of a gather task: elements in row-major order, `Word` a type of the
// element's width (the bits are moved, not converted).
template <typename Word>
__device__ void gather(const Task& task, unsigned int part, unsigned int parts) {
    const Word* source = (const Word*)task.address;
    Word* target = (Word*)task.target;
    const unsigned long long count = task.layout.count;
    const unsigned long long step = (unsigned long long)parts * blockDim.x;
    for (unsigned long long i = (unsigned long long)part * blockDim.x + threadIdx.x; i < count;
         i += step) {
        target[i] = source[element_at(task.layout, i)];
    }
}

// The task whose blocks include `block`: the last with first_block <= block.
__device__ __forceinline__ unsigned int task_of(const Task* tasks, unsigned int count,
                                                unsigned int block) {
    unsigned int low = 0, high = count;
    while (high - low > 1) {
        unsigned int middle = (low + high) / 2;
        if (tasks[middle].first_block <= block) {
            low = middle;
        } else {
            high = middle;
        }
    }
    return low;
}

extern "C" __global__ void model_trace_read(const Task* tasks, unsigned int count) {
    const Task& task = tasks[task_of(tasks, count, blockIdx.x)];
    const unsigned int part = blockIdx.x - task.first_block;
    if (task.kind == KIND_STATS) {
        switch (task.dtype) {
            case DTYPE_F32: reduce<LoadF32>(task, part, task.blocks); break;
            case DTYPE_F64: reduce<LoadF64>(task, part, task.blocks); break;
            case DTYPE_F16: reduce<LoadF16>(task, part, task.blocks); break;
            case DTYPE_BF16: reduce<LoadBF16>(task, part, task.blocks); break;
        }
    } else {
        switch (task.dtype) {
            case DTYPE_F64: gather<unsigned long long>(task, part, task.blocks); break;
            case DTYPE_F32: gather<unsigned int>(task, part, task.blocks); break;
            default: gather<unsigned short>(task, part, task.blocks); break;
        }
    }
}

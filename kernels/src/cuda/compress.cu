// CUDA compression kernels with the definitions of compress.h. Explicitly rounded intrinsics
// (__fdiv_rn, __frcp_rn, __fmul_rn, __fadd_rn, __fsub_rn) keep nvcc from contracting or approximating, so
// results match the CPU reference bit for bit except NaN payloads (GPUs use a canonical NaN).
//
// Quantization runs in two launches: one block per chunk finds max |x| and writes the scale;
// then one thread per element (int8) or per byte (int4: two elements, possibly from two
// chunks) writes codes and the error-feedback residual. The residual is only read by the first.

#include "lathe/kernels/compress.h"
#include "lathe/kernels/cuda_device.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace lathe::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;
constexpr std::uint32_t kExpMask = 0x7f800000u;
constexpr std::uint32_t kAbsMask = 0x7fffffffu;

void checkLaunch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw CudaError(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
}

unsigned blocksFor(std::size_t work) {
    return static_cast<unsigned>(std::min<std::size_t>((work + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ __forceinline__ std::uint32_t mix(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ float loadS(const float* g, const float* r, std::size_t i) {
    return r ? __fadd_rn(g[i], r[i]) : g[i];
}

__global__ void chunkScalesKernel(const float* __restrict__ g, const float* __restrict__ r, std::size_t n,
                                  std::size_t chunk, std::size_t chunks, float qmax,
                                  float* __restrict__ scales) {
    __shared__ std::uint32_t warpMax[kThreads / 32];
    for (std::size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        const std::size_t b = c * chunk;
        const std::size_t e = min(n, b + chunk);
        std::uint32_t m = 0;
        for (std::size_t i = b + threadIdx.x; i < e; i += blockDim.x)
            m = max(m, __float_as_uint(loadS(g, r, i)) & kAbsMask);
        m = __reduce_max_sync(0xffffffffu, m);
        if ((threadIdx.x & 31) == 0) warpMax[threadIdx.x / 32] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
            std::uint32_t amax = 0;
            for (int w = 0; w < kThreads / 32; ++w) amax = max(amax, warpMax[w]);
            scales[c] =
                amax >= kExpMask ? __uint_as_float(0x7fc00000u) : __fdiv_rn(__uint_as_float(amax), qmax);
        }
        __syncthreads();
    }
}

// Code of element i (and its residual update); the same steps as detail::quantOne.
__device__ __forceinline__ int quantElement(const float* g, float* r, std::size_t i, std::size_t chunk,
                                            const float* scales, float qmax, bool stochastic,
                                            std::uint32_t key, std::uint64_t offset) {
    const float scale = scales[i / chunk];
    const float s = loadS(g, r, i);
    if (isnan(scale)) return 0;  // non-finite chunk: residual kept
    int q = 0;
    if (scale != 0.f) {
        // s * (1 / scale), by division only where the reciprocal is not finite (detail::scaledOne).
        const float inv = __frcp_rn(scale);
        const float x = isinf(inv) ? __fdiv_rn(s, scale) : __fmul_rn(s, inv);
        const float v = fminf(fmaxf(x, -qmax), qmax);
        if (!stochastic) {
            q = __float2int_rn(v);
        } else {
            const float fl = floorf(v);
            const float frac = __fsub_rn(v, fl);
            const std::uint32_t h = mix(mix(static_cast<std::uint32_t>(offset + i) ^ key) + key);
            const float u = static_cast<float>(h >> 8);
            q = static_cast<int>(fl) + (u < __fmul_rn(frac, 16777216.f) ? 1 : 0);
        }
    }
    if (r) r[i] = __fsub_rn(s, __fmul_rn(static_cast<float>(q), scale));
    return q;
}

__global__ void quantizeInt8Kernel(const float* __restrict__ g, float* __restrict__ r, std::size_t n,
                                   std::size_t chunk, const float* __restrict__ scales, bool stochastic,
                                   std::uint32_t key, std::uint64_t offset, std::int8_t* __restrict__ codes) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        codes[i] =
            static_cast<std::int8_t>(quantElement(g, r, i, chunk, scales, 127.f, stochastic, key, offset));
}

__global__ void quantizeInt4Kernel(const float* __restrict__ g, float* __restrict__ r, std::size_t n,
                                   std::size_t chunk, const float* __restrict__ scales, bool stochastic,
                                   std::uint32_t key, std::uint64_t offset,
                                   std::uint8_t* __restrict__ codes) {
    const std::size_t bytes = (n + 1) / 2;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < bytes;
         k += stride) {
        const int lo = quantElement(g, r, 2 * k, chunk, scales, 7.f, stochastic, key, offset);
        const int hi =
            2 * k + 1 < n ? quantElement(g, r, 2 * k + 1, chunk, scales, 7.f, stochastic, key, offset) : 0;
        codes[k] = static_cast<std::uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
    }
}

__global__ void dequantizeKernel(const void* __restrict__ codes, const float* __restrict__ scales,
                                 std::size_t n, std::size_t chunk, bool int4, bool accumulate,
                                 float* __restrict__ out) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        int q;
        if (int4) {
            const int nib = (static_cast<const std::uint8_t*>(codes)[i / 2] >> ((i & 1) * 4)) & 0xf;
            q = nib >= 8 ? nib - 16 : nib;
        } else {
            q = static_cast<const std::int8_t*>(codes)[i];
        }
        const float d = __fmul_rn(static_cast<float>(q), scales[i / chunk]);
        out[i] = accumulate ? __fadd_rn(out[i], d) : d;
    }
}

__device__ __forceinline__ std::uint16_t toBf16(float f) {
    const std::uint32_t u = __float_as_uint(f);
    if ((u & kAbsMask) > kExpMask) return 0x7fc0u;
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void to16Kernel(const float* __restrict__ x, float* __restrict__ r, std::size_t n, bool bf16,
                           std::uint16_t* __restrict__ out) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float s = loadS(x, r, i);
        std::uint16_t h;
        float back;
        if (bf16) {
            h = toBf16(s);
            back = __uint_as_float(static_cast<std::uint32_t>(h) << 16);
        } else {
            const __half hh = __float2half_rn(s);
            h = __half_as_ushort(hh);
            back = __half2float(hh);
        }
        out[i] = h;
        if (r && isfinite(back)) r[i] = __fsub_rn(s, back);
    }
}

__global__ void from16Kernel(const std::uint16_t* __restrict__ x, std::size_t n, bool bf16, bool accumulate,
                             float* __restrict__ out) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float v = bf16 ? __uint_as_float(static_cast<std::uint32_t>(x[i]) << 16)
                             : __half2float(__ushort_as_half(x[i]));
        out[i] = accumulate ? __fadd_rn(out[i], v) : v;
    }
}

void quantize(const float* x, float* residual, std::size_t n, void* codes, float* scales,
              const QuantizeParams& p, bool int4, void* stream, const char* what) {
    if (n == 0) return;
    const std::size_t chunk = p.chunk ? p.chunk : n;
    const std::size_t chunks = chunkCount(n, chunk);
    auto s = static_cast<cudaStream_t>(stream);
    chunkScalesKernel<<<static_cast<unsigned>(std::min<std::size_t>(chunks, 65535)), kThreads, 0, s>>>(
        x, residual, n, chunk, chunks, int4 ? 7.f : 127.f, scales);
    checkLaunch(what);
    const std::uint32_t key = streamKey(p.seed);
    if (int4)
        quantizeInt4Kernel<<<blocksFor((n + 1) / 2), kThreads, 0, s>>>(x, residual, n, chunk, scales,
                                                                       p.stochastic, key, p.indexOffset,
                                                                       static_cast<std::uint8_t*>(codes));
    else
        quantizeInt8Kernel<<<blocksFor(n), kThreads, 0, s>>>(x, residual, n, chunk, scales, p.stochastic, key,
                                                             p.indexOffset, static_cast<std::int8_t*>(codes));
    checkLaunch(what);
}

}  // namespace

void quantizeInt8(const float* x, float* residual, std::size_t n, std::int8_t* codes, float* scales,
                  const QuantizeParams& p, void* stream) {
    quantize(x, residual, n, codes, scales, p, false, stream, "cuda::quantizeInt8");
}

void quantizeInt4(const float* x, float* residual, std::size_t n, std::uint8_t* codes, float* scales,
                  const QuantizeParams& p, void* stream) {
    quantize(x, residual, n, codes, scales, p, true, stream, "cuda::quantizeInt4");
}

void dequantizeInt8(const std::int8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, bool accumulate, void* stream) {
    if (n == 0) return;
    dequantizeKernel<<<blocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        codes, scales, n, chunk ? chunk : n, false, accumulate, out);
    checkLaunch("cuda::dequantizeInt8");
}

void dequantizeInt4(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t chunk,
                    float* out, bool accumulate, void* stream) {
    if (n == 0) return;
    dequantizeKernel<<<blocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        codes, scales, n, chunk ? chunk : n, true, accumulate, out);
    checkLaunch("cuda::dequantizeInt4");
}

void floatTo16(const float* x, float* residual, std::size_t n, std::uint16_t* out, bool bf16, void* stream) {
    if (n == 0) return;
    to16Kernel<<<blocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, residual, n, bf16, out);
    checkLaunch("cuda::floatTo16");
}

void floatFrom16(const std::uint16_t* x, std::size_t n, float* out, bool bf16, bool accumulate,
                 void* stream) {
    if (n == 0) return;
    from16Kernel<<<blocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, bf16, accumulate,
                                                                                   out);
    checkLaunch("cuda::floatFrom16");
}

}  // namespace lathe::kernels::cuda

// CUDA int8 GEMM: one thread per output, __dp4a over the packed 4-byte k-groups (the same layout
// the CPU paths read), then the shared epilogue definition with correctly rounded fp32 operations
// (__int2float_rn, __fmul_rn, __fadd_rn) so the results match the CPU bit for bit.

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/qgemm.h"

#include <cuda_runtime.h>

#include <string>

namespace lathe::kernels::cuda {

namespace {

constexpr int kTile = 16;

__device__ int dotColumn(const std::int8_t* __restrict__ a, const std::int8_t* __restrict__ packed,
                         std::size_t groups, std::size_t col) {
    const int* aw = reinterpret_cast<const int*>(a);
    const int* bw = reinterpret_cast<const int*>(packed + (col / 16) * groups * 64 + (col % 16) * 4);
    int acc = 0;
    for (std::size_t g = 0; g < groups; ++g) acc = __dp4a(aw[g], bw[g * 16], acc);
    return acc;
}

__global__ void gemmKernel(const std::int8_t* __restrict__ a, std::size_t m, std::size_t kp,
                           const std::int8_t* __restrict__ packed, std::size_t n,
                           std::int32_t* __restrict__ c, std::size_t ldc) {
    const std::size_t col = static_cast<std::size_t>(blockIdx.x) * kTile + threadIdx.x;
    const std::size_t row = static_cast<std::size_t>(blockIdx.y) * kTile + threadIdx.y;
    if (row >= m || col >= n) return;
    c[row * ldc + col] = dotColumn(a + row * kp, packed, kp / 4, col);
}

__global__ void linearKernel(const std::int8_t* __restrict__ a, const float* __restrict__ rowScales,
                             std::size_t m, std::size_t kp, const std::int8_t* __restrict__ packed,
                             const float* __restrict__ scales, const float* __restrict__ bias, std::size_t n,
                             float* __restrict__ y, std::size_t ldy, bool relu) {
    const std::size_t col = static_cast<std::size_t>(blockIdx.x) * kTile + threadIdx.x;
    const std::size_t row = static_cast<std::size_t>(blockIdx.y) * kTile + threadIdx.y;
    if (row >= m || col >= n) return;
    const int acc = dotColumn(a + row * kp, packed, kp / 4, col);
    float v = __fmul_rn(__int2float_rn(acc), __fmul_rn(rowScales[row], scales[col]));
    if (bias) v = __fadd_rn(v, bias[col]);
    if (relu && !(v > 0.f) && !isnan(v)) v = 0.f;  // +0 for negatives and -0, NaN kept: the CPU epilogue
    y[row * ldy + col] = v;
}

void checkLaunch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw CudaError(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
}

dim3 gridFor(std::size_t m, std::size_t n) {
    return dim3(static_cast<unsigned>((n + kTile - 1) / kTile),
                static_cast<unsigned>((m + kTile - 1) / kTile));
}

}  // namespace

void gemmS8S32(const std::int8_t* a, std::size_t m, std::size_t k, const std::int8_t* packed, std::size_t n,
               std::int32_t* c, std::size_t ldc, void* stream) {
    if (m == 0 || n == 0) return;
    gemmKernel<<<gridFor(m, n), dim3(kTile, kTile), 0, static_cast<cudaStream_t>(stream)>>>(
        a, m, qPaddedK(k), packed, n, c, ldc);
    checkLaunch("cuda::gemmS8S32");
}

void qlinearQuantized(const std::int8_t* a, const float* rowScales, std::size_t m, const std::int8_t* packed,
                      const float* scales, const float* bias, std::size_t n, std::size_t k, float* y,
                      std::size_t ldy, bool relu, void* stream) {
    if (m == 0 || n == 0) return;
    linearKernel<<<gridFor(m, n), dim3(kTile, kTile), 0, static_cast<cudaStream_t>(stream)>>>(
        a, rowScales, m, qPaddedK(k), packed, scales, bias, n, y, ldy, relu);
    checkLaunch("cuda::qlinearQuantized");
}

}  // namespace lathe::kernels::cuda

// CUDA scale_and_check: one grid-stride kernel. Each block ORs its threads' findings with
// __syncthreads_or and a single thread writes the flag, so a buffer full of NaNs costs one
// store per block instead of one per element.

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/scale_and_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

namespace lathe::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;  // grid-stride beyond this; plenty for a few SMs' worth

__global__ void scaleAndCheckKernel(float* __restrict__ x, std::size_t n, float invScale,
                                    int* foundNonFinite) {
    bool bad = false;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        // __fmul_rn: a plain, correctly rounded multiply that the compiler may not contract or
        // flush, so results match the CPU reference bit for bit (NaN payloads aside).
        const float r = __fmul_rn(x[i], invScale);
        // A non-finite input always yields a non-finite product, so checking r covers both.
        bad |= !isfinite(r);
        x[i] = r;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *foundNonFinite = 1;
}

}  // namespace

void scaleAndCheck(float* x, std::size_t n, float invScale, int* foundNonFinite, void* stream) {
    if (n == 0) return;
    const std::size_t blocks = std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks);
    scaleAndCheckKernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        x, n, invScale, foundNonFinite);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw CudaError(std::string("cuda::scaleAndCheck: kernel launch failed: ") + cudaGetErrorString(err));
}

}  // namespace lathe::kernels::cuda

// CUDA optimizer steps (optim.h): one grid-stride kernel launch per tensor, with the CPU paths'
// operations in the same order through correctly rounded intrinsics (__fmul_rn, __fadd_rn,
// __fdiv_rn, __fsqrt_rn, __fmaf_rn), which nvcc may neither contract nor approximate.

#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/optim.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

namespace lathe::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

__global__ void adamKernel(AdamHyper h, float* __restrict__ p, float* __restrict__ g, float* __restrict__ m,
                           float* __restrict__ v, std::size_t n) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        float gi = g[i];
        float pi = p[i];
        if (h.gradScale != 1.0f) {
            gi = __fmul_rn(gi, h.gradScale);
            g[i] = gi;
        }
        if (h.decoupledDecay != 1.0f) pi = __fmul_rn(pi, h.decoupledDecay);
        if (h.weightDecay != 0.0f) gi = __fmaf_rn(pi, h.weightDecay, gi);
        const float mi = __fmaf_rn(gi, h.oneMinusBeta1, __fmul_rn(m[i], h.beta1));
        const float vi = __fmaf_rn(__fmul_rn(h.oneMinusBeta2, gi), gi, __fmul_rn(v[i], h.beta2));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.biasCorrection2Sqrt), h.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(h.negStepSize, mi), denom));
    }
}

__global__ void sgdKernel(SgdHyper h, float* __restrict__ p, float* __restrict__ g, float* __restrict__ buf,
                          std::size_t n) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        float d = g[i];
        const float pi = p[i];
        if (h.gradScale != 1.0f) {
            d = __fmul_rn(d, h.gradScale);
            g[i] = d;
        }
        if (h.weightDecay != 0.0f) d = __fmaf_rn(pi, h.weightDecay, d);
        if (h.momentum != 0.0f) {
            const float b =
                h.firstStep ? d : __fmaf_rn(d, h.oneMinusDampening, __fmul_rn(buf[i], h.momentum));
            buf[i] = b;
            d = h.nesterov ? __fmaf_rn(b, h.momentum, d) : b;
        }
        p[i] = __fmaf_rn(d, h.negLr, pi);
    }
}

unsigned blocksFor(std::size_t n) {
    return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

void checkLaunch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw CudaError(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
}

}  // namespace

void adamStep(const AdamHyper& hyper, const OptimTensor* tensors, std::size_t count, void* stream) {
    for (std::size_t k = 0; k < count; ++k) {
        const OptimTensor& t = tensors[k];
        if (t.n == 0) continue;
        adamKernel<<<blocksFor(t.n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            hyper, t.param, t.grad, t.state0, t.state1, t.n);
        checkLaunch("cuda::adamStep");
    }
}

void sgdStep(const SgdHyper& hyper, const OptimTensor* tensors, std::size_t count, void* stream) {
    for (std::size_t k = 0; k < count; ++k) {
        const OptimTensor& t = tensors[k];
        if (t.n == 0) continue;
        sgdKernel<<<blocksFor(t.n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(hyper, t.param, t.grad,
                                                                                      t.state0, t.n);
        checkLaunch("cuda::sgdStep");
    }
}

}  // namespace lathe::kernels::cuda

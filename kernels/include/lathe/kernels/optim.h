#pragma once
// optim: fused optimizer steps and the gradient pass before them, on fp32 tensors.
//
// One call updates a list of tensors (multi-tensor, like PyTorch's foreach/fused optimizers and
// apex's FusedAdam): each element of a parameter, its gradient and its optimizer state is read
// once and written once, instead of the five to eight passes (and as many temporaries) that the
// unfused torch::optim step makes. The arithmetic is torch::optim's (LibTorch 1.13), operation
// for operation and rounding for rounding, so the results equal LibTorch's on the same inputs
// (tests/core/test_fused_optim.cpp holds them to it, within one ulp):
//
//   Adam    g' = g + wd·p  (fused multiply-add, as ATen's add(p, alpha))
//           m  = fma(g', 1-β1, m·β1)            v = fma((1-β2)·g', g', v·β2)
//           p  = p + (-(lr/bc1)·m) / (sqrt(v) / sqrt(bc2) + eps)
//   AdamW   p  = p·(1 - lr·wd) first; then as Adam without g'
//   SGD     d  = fma(p, wd, g); buf = d on the first step, else fma(d, 1-dampening, buf·μ);
//           d  = nesterov ? fma(buf, μ, d) : buf;       p = fma(d, -lr, p)
//
// with every scalar computed in double by the caller, as torch::optim does, and rounded to float
// once (the *Hyper structs below take them ready). `gradScale` (a gradient-clipping coefficient)
// multiplies each gradient first and the scaled gradient is written back, as grad.mul_(coef)
// before the step would leave it; 1 leaves gradients untouched.
//
// Every CPU path (scalar reference, AVX2, AVX-512) gives bit-identical results: the files are
// built with -ffp-contract=off and the reference spells out its fused multiply-adds (std::fma).
// Pointers may be unaligned and lengths anything (0 included); tensors must not overlap.

#include <cstddef>

#include "lathe/kernels/info.h"

namespace lathe::kernels {

/// One tensor of a multi-tensor step: the parameter, its gradient and up to two state buffers
/// (Adam: exp_avg, exp_avg_sq; SGD with momentum: the momentum buffer in state0).
struct OptimTensor {
    float* param = nullptr;
    float* grad = nullptr;
    float* state0 = nullptr;
    float* state1 = nullptr;
    std::size_t n = 0;
};

struct AdamHyper {
    float beta1 = 0.9f, oneMinusBeta1 = 0.1f;  // float(β1), float(1 - β1)
    float beta2 = 0.999f, oneMinusBeta2 = 0.001f;
    float eps = 1e-8f;
    float negStepSize = 0;          // float(-(lr / (1 - β1^t)))
    float biasCorrection2Sqrt = 1;  // float(sqrt(1 - β2^t))
    float weightDecay = 0;          // Adam's L2 term (g + wd·p); 0: none
    float decoupledDecay = 1;       // AdamW's p·(1 - lr·wd); 1: none
    float gradScale = 1;            // clipping coefficient applied to the gradient first; 1: none
};

struct SgdHyper {
    float negLr = 0;              // float(-lr)
    float weightDecay = 0;        // 0: none
    float momentum = 0;           // 0: plain SGD (state0 unused)
    float oneMinusDampening = 1;  // float(1 - dampening)
    bool nesterov = false;
    bool firstStep = false;  // momentum buffer starts as a copy of the gradient
    float gradScale = 1;
};

/// One Adam or AdamW step over `count` tensors (each needs state0 = exp_avg, state1 = exp_avg_sq).
void adamStep(const AdamHyper& hyper, const OptimTensor* tensors, std::size_t count) noexcept;
void adamStep(const AdamHyper& hyper, const OptimTensor* tensors, std::size_t count, CpuIsa isa) noexcept;

/// One SGD step over `count` tensors (state0 = momentum buffer when momentum != 0).
void sgdStep(const SgdHyper& hyper, const OptimTensor* tensors, std::size_t count) noexcept;
void sgdStep(const SgdHyper& hyper, const OptimTensor* tensors, std::size_t count, CpuIsa isa) noexcept;

/// What one pass over a gradient learned.
struct GradStats {
    double sumSquares = 0;  // of the (unscaled) values, accumulated in double
    bool nonFinite = false;
};

/// The gradient pass before an optimizer step, in one read (and, when unscaling, one write) of
/// the gradient: multiplies g[0..n) by invScale in place (skipped when invScale is exactly 1),
/// flags a non-finite value before or after scaling (as scaleAndCheck does) and adds up the
/// squares of the scaled values in double (each square is exact; the sum goes into 16 lanes,
/// element i into lane i mod 16, in index order, then the lanes in order: the same bits on every
/// path). A NaN invScale behaves as scaleAndCheck's (every value NaN, flagged).
GradStats gradStats(float* g, std::size_t n, float invScale) noexcept;
GradStats gradStats(float* g, std::size_t n, float invScale, CpuIsa isa) noexcept;

namespace cuda {

/// Device versions of the steps: the same arithmetic (correctly rounded intrinsics, no
/// contraction beyond the fused multiply-adds above), one launch per tensor on `stream`
/// (a cudaStream_t as void*; nullptr: the default stream), asynchronous with respect to the host.
/// Pointers are device memory. Throw CudaError on launch failure or without CUDA.
void adamStep(const AdamHyper& hyper, const OptimTensor* tensors, std::size_t count, void* stream = nullptr);
void sgdStep(const SgdHyper& hyper, const OptimTensor* tensors, std::size_t count, void* stream = nullptr);

}  // namespace cuda
}  // namespace lathe::kernels

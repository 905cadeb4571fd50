#pragma once
// torch::optim's SGD, Adam and AdamW with their step done by Lathe's fused kernels
// (kernels/optim.h): one pass over each parameter, its gradient and its state, instead of the
// five to eight ATen ops (and their temporaries) the unfused step dispatches per tensor. The
// classes derive from LibTorch's, so options, param groups, learning-rate changes and the state
// a checkpoint saves and restores (step counts, exp_avg, exp_avg_sq, momentum buffers) are
// LibTorch's own: a checkpoint written by either loads into the other. The arithmetic is
// LibTorch 1.13's, rounding for rounding (tests/core/test_fused_optim.cpp compares them).
//
// The fused path takes contiguous fp32 CPU parameters with dense fp32 gradients; anything else
// (CUDA tensors, other dtypes, amsgrad, sparse gradients, a closure) runs LibTorch's step
// unchanged, so the classes can stand in for LibTorch's everywhere.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lathe::core {

/// What the training loop needs of a fused optimizer beyond torch::optim::Optimizer.
class FusedStep {
public:
    virtual ~FusedStep() = default;
    /// A factor applied to every gradient at the start of the next step() (a gradient-clipping
    /// coefficient), in the same pass; the scaled gradients are written back, as
    /// grad.mul_(factor) before the step would leave them. Reset to 1 by each step().
    void setGradScale(double factor) { m_gradScale = factor; }
    /// Whether the last step() ran the fused kernels (false: LibTorch's step).
    bool lastStepFused() const { return m_lastFused; }

protected:
    /// Multiplies the gradients by `factor` with ATen (the unfused path's share of the job).
    static void applyGradScale(const std::vector<torch::optim::OptimizerParamGroup>& groups, double factor);
    /// One step of `self` (a Base): `fused(gradScale)` when it can run, else Base's step.
    template <class Base, class Fused>
    torch::Tensor run(Base& self, torch::optim::Optimizer::LossClosure closure, Fused fused);
    double m_gradScale = 1.0;
    bool m_lastFused = false;
};

class FusedSGD : public torch::optim::SGD, public FusedStep {
public:
    using torch::optim::SGD::SGD;
    torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdam : public torch::optim::Adam, public FusedStep {
public:
    using torch::optim::Adam::Adam;
    torch::Tensor step(LossClosure closure = nullptr) override;
};

class FusedAdamW : public torch::optim::AdamW, public FusedStep {
public:
    using torch::optim::AdamW::AdamW;
    torch::Tensor step(LossClosure closure = nullptr) override;
};

/// True when `t` (and, for a parameter, its gradient) can go through the fused CPU kernels.
bool fusableTensor(const torch::Tensor& t);

/// The key torch::optim files a parameter's state under: a string in LibTorch 1.x, the
/// TensorImpl's address in 2.x.
inline auto optimizerStateKey(const torch::Tensor& p) {
#if TORCH_VERSION_MAJOR >= 2
    return static_cast<void*>(p.unsafeGetTensorImpl());
#else
    // LibTorch 1.x writes it with c10::guts::to_string, through an std::ostringstream: "0x" and
    // the address's lowercase hex digits (libstdc++'s pointer output). The same text written
    // here, without a stream, its locale and its allocation: with one lookup per parameter and
    // step that was a quarter of a small network's fused optimizer step.
    // tests/core/test_fused_optim.cpp checks the two agree.
    auto v = reinterpret_cast<std::uintptr_t>(p.unsafeGetTensorImpl());
    if (v == 0) return std::string("0");
    char buf[2 + 2 * sizeof v];
    char* end = buf + sizeof buf;
    char* at = end;
    for (; v != 0; v >>= 4) *--at = "0123456789abcdef"[v & 0xf];
    *--at = 'x';
    *--at = '0';
    return std::string(at, end);
#endif
}

}  // namespace lathe::core

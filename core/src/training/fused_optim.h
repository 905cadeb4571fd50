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
    return c10::guts::to_string(p.unsafeGetTensorImpl());
#endif
}

}  // namespace lathe::core

#pragma once
// A training step for plain MLPs without autograd: forward, mean cross-entropy and backward of a
// Sequential of Linear layers (each optionally followed by a ReLU, after an optional leading
// Flatten), written as BLAS matrix products and loops into buffers kept from step to step.
//
// On the small networks engineers iterate on (digits' 64-128-128-10, batch 64) a step's arithmetic
// takes tens of microseconds and autograd's graph, dispatch and allocations took more than that:
// this path is what makes such a step 2x PyTorch eager's (tests/bench/README.md#trainer). It
// computes what autograd computes, in float32, in another summation order: gradients agree with
// autograd's to 2e-6 of their largest magnitude (tests/core/test_mlp_step.cpp), not bit for bit.
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <vector>

namespace lathe::core {

class MlpStep {
public:
    /// The fast step for `model` if it is a plain fp32 MLP on the CPU (Linear and ReLU only, a
    /// Flatten first allowed; no module twice) and this build has a BLAS to call; null otherwise.
    static std::unique_ptr<MlpStep> of(torch::nn::Sequential& model);

    /// Whether this batch can take the fast step: fp32 contiguous inputs of the first layer's
    /// width on the CPU, int64 labels with every one a valid class. (A batch that cannot takes
    /// autograd's step, which reports what is wrong with it.)
    bool accepts(const torch::Tensor& x, const torch::Tensor& y) const;

    struct Result {
        double loss = 0;                                    // the batch's mean cross-entropy
        torch::Tensor logits;                               // [batch, classes], valid until the next step
        std::chrono::steady_clock::time_point forwardDone;  // where the step's backward began
    };
    /// Forward, loss and backward on the network's current weights. Each layer's weight and bias
    /// gradient is written into its .grad() (made once, then overwritten each step rather than
    /// accumulated into: zero_grad() is not needed). The gradients are those of
    /// `lossScale` times the loss, as a loss scaler's backward (the loss returned is unscaled).
    Result run(const torch::Tensor& x, const torch::Tensor& y, float lossScale = 1.0f);

    ~MlpStep();

private:
    struct Layer {
        torch::nn::Linear linear{nullptr};
        bool relu = false;
        int64_t in = 0, out = 0;
    };
    explicit MlpStep(std::vector<Layer> layers);
    void ensureBuffers(int64_t batch);
    // Every layer's weight and bias: fp32 contiguous on the CPU, trainable, of the shapes seen.
    bool layersFit() const;

    std::vector<Layer> m_layers;
    bool m_flatten = false;  // a leading Flatten: inputs of more than two dimensions are rows
    int64_t m_batch = -1;
    std::vector<torch::Tensor> m_act;   // per layer: its output (after its ReLU), [batch, out]
    std::vector<torch::Tensor> m_grad;  // per layer: the loss's gradient w.r.t. its output
};

}  // namespace lathe::core

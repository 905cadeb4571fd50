#pragma once
// The model zoo (private: LibTorch types).
#include <torch/torch.h>

#include <string>
#include <vector>

#include "lathe/core/run_spec.h"

namespace lathe::core {

/// Builds spec.model for samples of `sampleShape` and `numClasses` outputs. Throws ConfigError
/// when the model does not fit the data (a cnn needs C×H×W images).
torch::nn::Sequential makeModel(const RunSpec& spec, const std::vector<int64_t>& sampleShape, int64_t numClasses);
int64_t parameterCount(const torch::nn::Module& m);

struct ForwardOptions {
    /// Recompute hidden blocks' activations in backward instead of keeping them. Blocks end at
    /// each ReLU (with a following max-pool) and are grouped into about sqrt(blocks) segments;
    /// all but the last segment are checkpointed (checkpoint_sequential's choice).
    bool checkpoint = false;
    c10::optional<c10::ScalarType> autocast;  // recompute under the same autocast as forward
    c10::DeviceType device = c10::DeviceType::CPU;
};

/// The model's forward pass, with activation checkpointing when asked.
torch::Tensor forwardModel(torch::nn::Sequential& model, const torch::Tensor& x, const ForwardOptions& options);

}  // namespace lathe::core

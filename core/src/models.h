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

}  // namespace lathe::core

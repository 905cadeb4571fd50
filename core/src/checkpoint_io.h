#pragma once
// Saving and loading training state (private: LibTorch types).
#include <torch/torch.h>

#include "lathe/core/checkpoint.h"

namespace lathe::core {

CheckpointInfo saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              int64_t epoch, int64_t step);
/// Verifies the checksum, then restores model and optimizer. Throws CheckpointError, also when
/// the checkpoint was written for a different model.
CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::Optimizer& optimizer);

}  // namespace lathe::core

#pragma once
// Saving and loading training state (private: LibTorch types).
#include <torch/torch.h>

#include <map>
#include <string>

#include "lathe/core/checkpoint.h"

namespace lathe::core {

/// Named tensors saved beside model and optimizer (e.g. the loss scaler's state).
using CheckpointExtras = std::map<std::string, torch::Tensor>;

/// The archive saveCheckpoint frames (model, optimizer, extras), for a file written elsewhere (a
/// model-parallel stage's, gathered on rank 0).
std::string checkpointPayload(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const CheckpointExtras& extras = {});
CheckpointInfo saveCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, int64_t epoch, int64_t step,
                              const CheckpointExtras& extras = {}, const CheckpointOwner& owner = {});
/// Verifies the checksum, then restores model and optimizer. Throws CheckpointError, also when
/// the checkpoint was written for a different model.
/// `extras` (optional): the names to look for; those present in the file are filled in, the
/// others are removed from the map. Every extra whose name starts with `extrasPrefix` (when not
/// empty) is added too.
CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, CheckpointExtras* extras = nullptr,
                              const std::string& extrasPrefix = {});

/// Verifies the checksum and restores only the model's parameters and buffers (for export).
/// A pipeline-parallel run's checkpoint (stage 0's file, which names the stage bounds) is merged:
/// every stage's file beside it fills its layers of `model`, the whole network.
CheckpointInfo loadModelWeights(const std::string& path, torch::nn::Module& model);

/// Reads one named extra (saved as `extras[name]`) after verifying the file; false when absent.
bool readCheckpointExtra(const std::string& path, const std::string& name, torch::Tensor& out);

}  // namespace lathe::core

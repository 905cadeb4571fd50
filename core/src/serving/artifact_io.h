#pragma once
// Loading an artifact's module and its metadata in one pass (private: LibTorch types).
#include <torch/script.h>

#include <string>

#include "lathe/core/model_artifact.h"

namespace lathe::core {

/// Deserialises the artifact once onto `device` and fills `info` from its Lathe metadata (all
/// but path, checksum and size). Throws ConfigError for a non-TorchScript file or one without
/// Lathe metadata.
torch::jit::Module loadArtifact(const std::string& path, const c10::Device& device, ArtifactInfo& info);

}  // namespace lathe::core

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

/// Any TorchScript file onto `device`; `info` is filled from its Lathe metadata when it has some
/// (`hasMeta`). Throws ConfigError for a missing or non-TorchScript file.
torch::jit::Module loadAnyScript(const std::string& path, const c10::Device& device, ArtifactInfo& info,
                                 bool& hasMeta);

/// Saves `module` with `info`'s metadata (signature, metrics, run, data, source) as the next
/// version of `name`, with lineage's parentVersion, parentModel, derivation and report. The file
/// is written under a temporary name and renamed to its content hash, as registerModel does.
ModelVersion registerModule(Registry& registry, const std::string& name, const torch::jit::Module& module,
                            ArtifactInfo info, const ModelVersion& lineage);

/// A frozen copy of `module` (in eval mode) with TorchScript's inference optimisations applied, as
/// `serve --optimize` runs it: submodules inlined, addmm(b, x, W.t()) fused into aten::linear,
/// then freeze and optimize_for_inference (constant folding, conv-bn folding; linear layers become
/// a matmul on weights transposed once at load in LibTorch 1.13, oneDNN ops where a build does
/// that). `module` is left as it was. Throws what TorchScript throws.
torch::jit::Module optimizedForInference(const torch::jit::Module& module);

}  // namespace lathe::core

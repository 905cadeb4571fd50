#pragma once
// Model artifacts: self-describing TorchScript archives. A registered version is a TorchScript
// module (loadable by torch.jit.load in Python and C++ without the run that made it) carrying
// `lathe/meta.json` among its extra files: format, signature, class names, metrics and lineage.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lathe/core/registry.h"
#include "lathe/core/run_spec.h"

namespace lathe::core {

class Store;

inline constexpr int kArtifactFormat = 1;

struct ArtifactInfo {
    std::string path;
    std::string sha256;  // of the whole file
    int64_t sizeBytes = 0;
    ModelSignature signature;
    std::map<std::string, double> metrics;
    int64_t runId = 0;
    std::string data;
    std::string source;
};

/// Exports the trained model of run `runId` (from its last checkpoint) as a TorchScript artifact at
/// `outPath`: the model's layers become a scripted forward (with the data set's input
/// standardisation baked in), metadata goes into the archive. Throws NotFoundError/CheckpointError
/// ("run 7 has no checkpoint: train with --checkpoint-every ...").
ArtifactInfo exportRunModel(const Store& store, int64_t runId, const std::string& outPath);
/// The same for a run configuration not trained yet: the zoo network it names, initialised with
/// its seed, sized for its data set (loaded for the shapes). For graphs before training.
ArtifactInfo exportSpecModel(const RunSpec& spec, const std::string& outPath);

/// Copies a TorchScript file (e.g. from Python's torch.jit.trace(...).save()) into an artifact at
/// `outPath`. When the file has no Lathe metadata, `inputShape` (one sample's shape, without the
/// batch dimension) is required: a forward pass with a zero batch finds the output shape.
ArtifactInfo importTorchScript(const std::string& file, const std::vector<int64_t>& inputShape,
                               const std::string& outPath);

/// Reads an artifact's metadata and verifies that TorchScript can load it. Throws ConfigError.
ArtifactInfo readArtifact(const std::string& path);

/// Registers a run's model or a file as the next version of `name`. Exactly one of runId (> 0) and
/// file (non-empty) is given. parentVersion 0 = none.
ModelVersion registerModel(Registry& registry, const Store* store, const std::string& name, int64_t runId,
                           const std::string& file, const std::vector<int64_t>& inputShape,
                           int64_t parentVersion = 0);

}  // namespace lathe::core

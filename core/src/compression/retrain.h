#pragma once
// What the compression methods that train share (private: LibTorch types): the parent run's spec,
// a fine-tuning run recorded in the workspace with its progress mapped onto the compression's,
// the network a run trained, and the measure-and-register step every method ends with.
#include <torch/script.h>
#include <torch/torch.h>

#include <string>

#include "compression/evaluate.h"
#include "lathe/core/compress.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/run_spec.h"

namespace lathe::core::compression {

/// The spec of the run `version` was exported from. ConfigError naming `method` when the version
/// was not trained in this workspace (imported from a file).
RunSpec runSpecOf(const Store& store, const ModelVersion& version, const std::string& method);

/// `base` for a fine-tuning run: no resume-only or compression keys left over from the parent
/// (init_from, qat, teacher …), one process, then `overrides` (run keys; ConfigError names a bad
/// one) and validation.
RunSpec fineTuneSpec(RunSpec base, const std::map<std::string, std::string>& overrides);

struct FineTuned {
    int64_t runId = 0;
    double accuracy = 0;  // the run's last val/accuracy
};
/// Trains and records `spec`; its steps are reported as the progress of the current phase, and the
/// compression's stop flag stops the run cleanly (then StoppedError). A failed run throws Error
/// naming it (it stays recorded, as any failed run).
FineTuned trainRecorded(Store& store, const RunSpec& spec, const CompressControl& control,
                        Progress& progress);

/// The trained network of run `runId` (its spec, its last checkpoint), on the CPU in eval mode.
torch::nn::Sequential trainedNetwork(const Store& store, int64_t runId, const RunSpec& spec,
                                     const std::vector<int64_t>& sampleShape, int64_t classes);

/// The run's model as an artifact module (exported to a temporary file and loaded); `info` gets
/// its metadata.
torch::jit::Module exportedModule(const Store& store, int64_t runId, ArtifactInfo& info);

/// Measures `child` against `parentModule`, then registers it as the next version of `name` with
/// the parent's lineage and the report. report.method/settings/layers are the caller's.
CompressResult measureAndRegister(Registry& registry, const ModelVersion& parent, const std::string& name,
                                  torch::jit::Module& parentModule, torch::jit::Module& child,
                                  const EvalData& data, CompressReport& report, ArtifactInfo info,
                                  Progress& progress);

/// Sample shape (without the batch) and classes of a version's signature.
std::vector<int64_t> sampleShapeOf(const ModelVersion& v);
int64_t classesOf(const ModelVersion& v);

}  // namespace lathe::core::compression

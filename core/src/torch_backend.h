#pragma once
// The seam between the torch-free core (liblathe_core) and the torch-backed part (liblathe_torch).
//
// Loading LibTorch costs about 0.9 s here (292 shared libraries and its operator
// registration), so `lathectl runs list`, `lathectl --version` and the workbench's first window
// must not pay for it. Everything that needs LibTorch lives in liblathe_torch and is reached
// through the table below, which torchBackend() fills on first use by dlopen'ing
// liblathe_torch.so from the directory liblathe_core.so was loaded from. The public functions
// (train(), exportRunModel(), LoadedModel::load() …) are thin forwards defined in
// torch_runtime.cpp, so callers never know which library does the work.
//
// Adding a torch-backed entry point: declare it in torch_impl below, define it in the torch-side
// source, add a member to TorchBackend (and bump kTorchBackendAbi), fill it in torch_entry.cpp
// and forward to it in torch_runtime.cpp.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/compress.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/model_graph.h"
#include "lathe/core/trainer.h"
#include "serving/model_runner.h"
#include "tuning/ppo_types.h"

namespace lathe::core {

class Store;
class Registry;

inline constexpr int kTorchBackendAbi = 6;

// The torch-side definitions (liblathe_torch). Same contracts as the public declarations.
namespace torch_impl {
void checkRunnable(const RunSpec& spec);
int cudaDeviceCount() noexcept;
TrainResult train(const RunSpec& spec, const TrainOptions& options, const EventSink& sink);
void setComputeThreads(int n);
/// OpenBLAS's thread count, set only when it differs (false: OpenBLAS is not the BLAS loaded).
bool setBlasThreads(int n);
ArtifactInfo exportRunModel(const Store& store, int64_t runId, const std::string& outPath);
ArtifactInfo exportSpecModel(const RunSpec& spec, const std::string& outPath);
ArtifactInfo importTorchScript(const std::string& file, const std::vector<int64_t>& inputShape,
                               const std::string& outPath);
ArtifactInfo readArtifact(const std::string& path);
ModelVersion registerModel(Registry& registry, const Store* store, const std::string& name, int64_t runId,
                           const std::string& file, const std::vector<int64_t>& inputShape,
                           int64_t parentVersion);
std::shared_ptr<serving::LoadedModel> loadModel(const ServedModel& model, int64_t maxBatch,
                                                const std::string& device, const std::string& expectedSha256,
                                                int instances, const std::string& optimize);
CompressResult quantizeModel(Registry& registry, Store* store, const ModelRef& parent,
                             const QuantizeOptions& options, const CompressControl& control);
CompressResult pruneModel(Registry& registry, Store& store, const ModelRef& parent,
                          const PruneOptions& options, const CompressControl& control);
CompressResult distillModel(Registry& registry, Store& store, const DistillOptions& options,
                            const CompressControl& control);
ModelGraph readTorchScriptGraph(const std::string& path, const GraphOptions& options);
/// Tuning's PPO agent (tuning/ppo_hook.cpp): a fresh policy file; one PPO update of the policy
/// file from finished episodes (written back atomically).
void ppoCreatePolicy(const std::string& path, uint64_t seed);
tuning::PpoUpdateStats ppoUpdatePolicy(const std::string& path,
                                       const std::vector<tuning::PpoEpisode>& episodes, uint64_t seed);
}  // namespace torch_impl

struct TorchBackend {
    int abi = kTorchBackendAbi;
    decltype(&torch_impl::checkRunnable) checkRunnable;
    decltype(&torch_impl::cudaDeviceCount) cudaDeviceCount;
    decltype(&torch_impl::train) train;
    decltype(&torch_impl::setComputeThreads) setComputeThreads;
    decltype(&torch_impl::exportRunModel) exportRunModel;
    decltype(&torch_impl::importTorchScript) importTorchScript;
    decltype(&torch_impl::readArtifact) readArtifact;
    decltype(&torch_impl::registerModel) registerModel;
    decltype(&torch_impl::loadModel) loadModel;
    decltype(&torch_impl::quantizeModel) quantizeModel;
    decltype(&torch_impl::pruneModel) pruneModel;
    decltype(&torch_impl::distillModel) distillModel;
    decltype(&torch_impl::readTorchScriptGraph) readTorchScriptGraph;
    decltype(&torch_impl::exportSpecModel) exportSpecModel;
    decltype(&torch_impl::ppoCreatePolicy) ppoCreatePolicy;
    decltype(&torch_impl::ppoUpdatePolicy) ppoUpdatePolicy;
};

/// The torch-backed library, loaded on first use (thread-safe). Throws Error naming the file and
/// dlerror() when it cannot be loaded.
const TorchBackend& torchBackend();

}  // namespace lathe::core

/// Exported by liblathe_torch.so.
extern "C" const lathe::core::TorchBackend* lathe_torch_backend();

// liblathe_torch.so's one entry point: the table of its torch-backed functions (torch_backend.h).
#include "torch_backend.h"

extern "C" __attribute__((visibility("default"))) const lathe::core::TorchBackend* lathe_torch_backend() {
    namespace t = lathe::core::torch_impl;
    static const lathe::core::TorchBackend backend{
        lathe::core::kTorchBackendAbi,
        &t::checkRunnable,
        &t::cudaDeviceCount,
        &t::train,
        &t::setComputeThreads,
        &t::exportRunModel,
        &t::importTorchScript,
        &t::readArtifact,
        &t::registerModel,
        &t::loadModel,
        &t::quantizeModel,
        &t::pruneModel,
        &t::distillModel,
        &t::readTorchScriptGraph,
        &t::exportSpecModel,
        &t::ppoCreatePolicy,
        &t::ppoUpdatePolicy,
    };
    return &backend;
}

#include "model_runner.h"

#include <torch/script.h>
#include <torch/torch.h>

#include "artifact_io.h"
#include "../sha256.h"
#include "lathe/core/error.h"
#include "lathe/core/model_artifact.h"

namespace lathe::core::serving {

struct LoadedModel::Impl {
    ServedModel model;
    ModelSignature signature;
    torch::jit::Module module;
    torch::Device device = torch::kCPU;
    std::vector<torch::Tensor> inputs;  // per instance: [maxBatch, sample...], allocated once
    int64_t inElems = 1, outElems = 1, maxBatch = 1;
};

LoadedModel::LoadedModel() : d(std::make_unique<Impl>()) {}
LoadedModel::~LoadedModel() = default;

std::shared_ptr<LoadedModel> LoadedModel::load(const ServedModel& model, int64_t maxBatch, const std::string& device,
                                               const std::string& expectedSha256, int instances) {
    if (instances < 1) throw ConfigError("--instances must be at least 1");
    if (!expectedSha256.empty()) {
        const auto sha = sha256File(model.path);
        if (sha != expectedSha256)
            throw Error("model artifact " + model.path + " fails its SHA-256 check (registered " +
                        expectedSha256.substr(0, 12) + "…, file " + sha.substr(0, 12) + "…): it was changed or damaged");
    }
    // One deserialisation gives both the module and its metadata; the device is chosen first.
    torch::Device dev = torch::kCPU;
    if (device == "cuda" || (device == "auto" && torch::cuda::is_available())) {
        if (!torch::cuda::is_available()) throw ConfigError("--device cuda: no CUDA device is available");
        dev = torch::Device(torch::kCUDA, 0);
    }
    ArtifactInfo info;
    torch::jit::Module module;
    try {
        module = loadArtifact(model.path, dev, info);
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw Error("model " + model.name + " failed to load: " + msg.substr(0, msg.find('\n')));
    }
    const auto& sig = info.signature;
    if (sig.inputs.size() != 1 || sig.inputs[0].datatype != "FP32")
        throw ConfigError("model " + model.name + ": only models with one FP32 input can be served");
    if (sig.outputs.size() != 1 || sig.outputs[0].datatype != "FP32")
        throw ConfigError("model " + model.name + ": only models with one FP32 output can be served");
    std::shared_ptr<LoadedModel> m(new LoadedModel());
    auto& d = *m->d;
    d.model = model;
    d.signature = sig;
    d.maxBatch = maxBatch;
    d.device = dev;
    d.module = std::move(module);
    std::vector<int64_t> shape{maxBatch};
    for (size_t i = 1; i < sig.inputs[0].shape.size(); ++i) {
        const auto s = sig.inputs[0].shape[i];
        if (s <= 0) throw ConfigError("model " + model.name + ": input dimensions after the batch must be fixed to serve");
        shape.push_back(s);
        d.inElems *= s;
    }
    for (size_t i = 1; i < sig.outputs[0].shape.size(); ++i) d.outElems *= std::max<int64_t>(1, sig.outputs[0].shape[i]);
    try {
        d.module.eval();
        // Pinned host memory lets the copy to the GPU run asynchronously.
        for (int i = 0; i < instances; ++i)
            d.inputs.push_back(
                torch::zeros(shape, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(d.device.is_cuda())));
        // Warm-up: the first forward pays for lazy initialisation (and the JIT's profiling runs);
        // a model is only switched in once that has happened.
        std::vector<float> out(static_cast<size_t>(maxBatch * d.outElems));
        for (int i = 0; i < 3; ++i) m->run(0, maxBatch, out.data());
        m->run(0, 1, out.data());
    } catch (const c10::Error& ex) {
        std::string msg = ex.what_without_backtrace();
        throw Error("model " + model.name + " failed to load or run: " + msg.substr(0, msg.find('\n')));
    }
    return m;
}

const std::string& LoadedModel::name() const { return d->model.name; }
int64_t LoadedModel::version() const { return d->model.version; }
const ModelSignature& LoadedModel::signature() const { return d->signature; }
int64_t LoadedModel::inputElems() const { return d->inElems; }
int64_t LoadedModel::outputElems() const { return d->outElems; }
int64_t LoadedModel::maxBatch() const { return d->maxBatch; }
int LoadedModel::instances() const { return static_cast<int>(d->inputs.size()); }
float* LoadedModel::inputBuffer(int instance) { return d->inputs.at(static_cast<size_t>(instance)).data_ptr<float>(); }

void LoadedModel::run(int instance, int64_t rows, float* out) {
    c10::InferenceMode guard;
    auto x = d->inputs.at(static_cast<size_t>(instance)).narrow(0, 0, rows);
    if (d->device.is_cuda()) x = x.to(d->device, /*non_blocking=*/true);
    auto y = d->module.forward({x}).toTensor();
    y = y.to(torch::kCPU, torch::kFloat).contiguous();
    if (y.numel() != rows * d->outElems)
        throw Error("model " + d->model.name + " returned " + std::to_string(y.numel()) + " values for " +
                    std::to_string(rows) + " rows; its signature promises " + std::to_string(d->outElems) + " per row");
    std::memcpy(out, y.data_ptr<float>(), static_cast<size_t>(y.numel()) * sizeof(float));
}

}  // namespace lathe::core::serving

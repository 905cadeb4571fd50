// Loads liblathe_torch.so on first use and forwards the torch-backed public functions to it
// (see torch_backend.h for why).
#include "lathe/core/torch_runtime.h"

#include <dlfcn.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "lathe/core/error.h"
#include "threads.h"
#include "torch_backend.h"

namespace lathe::core {
namespace {

std::atomic<const TorchBackend*> g_backend{nullptr};
std::mutex g_loadMutex;

// The directory this library (liblathe_core.so) was loaded from: liblathe_torch.so lies beside
// it in the build tree and when installed.
std::string ownDirectory() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&torchRuntimeLoaded), &info) == 0 || !info.dli_fname) return {};
    std::error_code ec;
    auto p = std::filesystem::canonical(info.dli_fname, ec);
    return ec ? std::string{} : p.parent_path().string();
}

const TorchBackend& loadBackend() {
    std::lock_guard lock(g_loadMutex);
    if (const auto* b = g_backend.load(std::memory_order_acquire)) return *b;
    using Entry = const TorchBackend* (*)();
    // Already in the process (linked in directly, as the tests are)?
    auto entry = reinterpret_cast<Entry>(dlsym(RTLD_DEFAULT, "lathe_torch_backend"));
    if (!entry) {
        const std::string dir = ownDirectory();
        const std::string path = (dir.empty() ? std::string{} : dir + "/") + "liblathe_torch.so";
        // RTLD_LOCAL: LibTorch's thousands of symbols stay out of the global scope; the one entry
        // point is looked up by handle. The handle is never closed (LibTorch cannot be unloaded).
        void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            const char* err = dlerror();
            throw Error("cannot load Lathe's LibTorch part (" + path + "): " + (err ? err : "unknown error") +
                        "; reinstall Lathe, or run ./packaging/deps-debian.sh if libtorch is missing");
        }
        entry = reinterpret_cast<Entry>(dlsym(handle, "lathe_torch_backend"));
        if (!entry)
            throw Error(path + " has no entry point lathe_torch_backend: it is not Lathe's LibTorch part");
    }
    const TorchBackend* b = entry();
    if (!b || b->abi != kTorchBackendAbi)
        throw Error("liblathe_torch.so is from another build of Lathe (interface " +
                    std::to_string(b ? b->abi : -1) + ", this program needs " +
                    std::to_string(kTorchBackendAbi) + "): rebuild or reinstall");
    g_backend.store(b, std::memory_order_release);
    return *b;
}

// LATHE_EAGER_TORCH=1: load at start-up, as every program did before the split. This is the
// baseline bench_startup measures against, and a way to rule the lazy load out when debugging.
[[maybe_unused]] const bool g_eager = [] {
    const char* v = std::getenv("LATHE_EAGER_TORCH");
    if (v && std::string(v) == "1") {
        try {
            loadBackend();
        } catch (...) {
            // Reported again, with its reason, by the first call that needs LibTorch.
        }
    }
    return true;
}();

}  // namespace

const TorchBackend& torchBackend() {
    if (const auto* b = g_backend.load(std::memory_order_acquire)) return *b;
    return loadBackend();
}

void loadTorchRuntime() { torchBackend(); }

bool torchRuntimeLoaded() noexcept { return g_backend.load(std::memory_order_acquire) != nullptr; }

// ---- The public torch-backed functions, forwarded -------------------------------------------

void checkRunnable(const RunSpec& spec) { torchBackend().checkRunnable(spec); }

int cudaDeviceCount() noexcept {
    try {
        return torchBackend().cudaDeviceCount();
    } catch (...) {
        return 0;  // no LibTorch part, so no CUDA either
    }
}

TrainResult train(const RunSpec& spec, const TrainOptions& options, const EventSink& sink) {
    return torchBackend().train(spec, options, sink);
}

void keepHeapForTraining() {
    static std::once_flag once;
    std::call_once(once, [] {
        mallopt(M_TRIM_THRESHOLD, 512 << 20);
        mallopt(M_TOP_PAD, 16 << 20);
        mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest; data sets above it are still mapped
    });
}

void setComputeThreads(int n) {
    if (n > 0) torchBackend().setComputeThreads(n);
}

ArtifactInfo exportRunModel(const Store& store, int64_t runId, const std::string& outPath) {
    return torchBackend().exportRunModel(store, runId, outPath);
}

ArtifactInfo importTorchScript(const std::string& file, const std::vector<int64_t>& inputShape,
                               const std::string& outPath) {
    return torchBackend().importTorchScript(file, inputShape, outPath);
}

ArtifactInfo readArtifact(const std::string& path) { return torchBackend().readArtifact(path); }

ModelVersion registerModel(Registry& registry, const Store* store, const std::string& name, int64_t runId,
                           const std::string& file, const std::vector<int64_t>& inputShape,
                           int64_t parentVersion) {
    return torchBackend().registerModel(registry, store, name, runId, file, inputShape, parentVersion);
}

CompressResult quantizeModel(Registry& registry, Store* store, const ModelRef& parent,
                             const QuantizeOptions& options, const CompressControl& control) {
    return torchBackend().quantizeModel(registry, store, parent, options, control);
}

CompressResult pruneModel(Registry& registry, Store& store, const ModelRef& parent,
                          const PruneOptions& options, const CompressControl& control) {
    return torchBackend().pruneModel(registry, store, parent, options, control);
}

CompressResult distillModel(Registry& registry, Store& store, const DistillOptions& options,
                            const CompressControl& control) {
    return torchBackend().distillModel(registry, store, options, control);
}

ArtifactInfo exportSpecModel(const RunSpec& spec, const std::string& outPath) {
    return torchBackend().exportSpecModel(spec, outPath);
}

ModelGraph readTorchScriptGraph(const std::string& path, const GraphOptions& options) {
    return torchBackend().readTorchScriptGraph(path, options);
}

std::shared_ptr<serving::LoadedModel> serving::LoadedModel::load(const ServedModel& model, int64_t maxBatch,
                                                                 const std::string& device,
                                                                 const std::string& expectedSha256,
                                                                 int instances, const std::string& optimize) {
    return torchBackend().loadModel(model, maxBatch, device, expectedSha256, instances, optimize);
}

}  // namespace lathe::core

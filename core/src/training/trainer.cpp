// The trainer's torch-backed entry points behind the torch-free facade in trainer.h (reached
// through torch_backend.h): device and collective-engine resolution, and train(), which runs a
// TrainingLoop (training_loop.h).
#include <dlfcn.h>

#include "compression/distill.h"
#include "distributed/process_group.h"
#include "lathe/core/error.h"
#include "lathe/core/trainer.h"
#include "lathe/kernels/qgemm.h"
#include "torch_backend.h"
#include "training/training_loop.h"
#include "tuning/ppo_hook.h"

namespace lathe::core {
// LibTorch's intra-op threads do not bound OpenBLAS's own pool, which then oversubscribes the
// cores. OpenBLAS is the BLAS we install, but not one we link directly (Debian picks it
// through the libblas.so.3 alternative), so it is looked up at run time.
void torch_impl::setComputeThreads(int n) {
    if (n <= 0) return;
    torch::set_num_threads(n);
    kernels::setThreads(n);  // the int8 GEMM of quantized models
    setBlasThreads(n);
}

bool torch_impl::setBlasThreads(int n) {
    using SetFn = void (*)(int);
    using GetFn = int (*)();
    // Looked up once: a search of LibTorch's hundreds of libraries takes milliseconds, and a
    // fork server's trials inherit what it found.
    static const auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    static const auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    if (!set) return false;
    // Only when it changes anything: in a process forked from one whose pool OpenBLAS stopped at
    // the fork (a trial of lathectl tune's fork server), openblas_set_num_threads restarts the
    // pool whatever the count, and its new worker spins for about 0.1 s of CPU (OpenBLAS's
    // THREAD_TIMEOUT) before it sleeps, taking a core from the trial beside it.
    if (!get || get() != n) set(n);
    return true;
}

int torch_impl::cudaDeviceCount() noexcept {
    try {
        return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
    } catch (...) {
        return 0;
    }
}

// A data-parallel rank on CUDA takes GPU LOCAL_RANK (modulo the GPUs there are), as torchrun's
// convention has it.
torch::Device resolveDevice(const RunSpec& spec, const DistEnv& dist) {
    const bool cuda = torch::cuda::is_available();
    if (spec.device == "cuda" && !cuda)
        throw ConfigError(
            "`device` cuda: no CUDA device is available (this LibTorch or this machine has none); use "
            "device = \"cpu\" or \"auto\"");
    const int gpus = cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
    const torch::Device dev =
        (spec.device == "cuda" || (spec.device == "auto" && cuda))
            ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                              dist.distributed() ? dist.localRank % std::max(1, gpus) : 0))
            : torch::Device(torch::kCPU);
    if (spec.precision == "fp16" && !dev.is_cuda())
        throw ConfigError(
            "`precision` fp16 needs a CUDA GPU and none is available here; use precision = \"bf16\" "
            "(--precision bf16), which runs on the CPU");
    return dev;
}

// The collective engine for `ranksOnHost` ranks training on `device`: NCCL wants a CUDA LibTorch
// with NCCL and a GPU of its own per rank; Gloo takes anything (CUDA gradients through the CPU).
// `auto` picks NCCL where it can run; an explicit `nccl` that cannot is refused.
std::string resolveBackend(const RunSpec& spec, torch::Device device, int ranksOnHost) {
    const int gpus = device.is_cuda() ? cudaDeviceCount() : 0;
    if (spec.backend == "auto")
        return device.is_cuda() && DistContext::ncclBuilt() && ranksOnHost <= gpus ? "nccl" : "gloo";
    if (spec.backend != "nccl") return spec.backend;
    if (!DistContext::ncclBuilt())
        throw ConfigError("`backend` nccl: this LibTorch was built without NCCL; use backend = \"gloo\"");
    if (!device.is_cuda())
        throw ConfigError(
            "`backend` nccl exchanges CUDA tensors: train with device = \"cuda\", or use "
            "backend = \"gloo\"");
    if (ranksOnHost > gpus)
        throw ConfigError("`backend` nccl needs a GPU per rank: " + std::to_string(ranksOnHost) +
                          " ranks on this host, " + std::to_string(gpus) + " GPU(s); use backend = \"gloo\"");
    return "nccl";
}

void torch_impl::checkRunnable(const RunSpec& spec) {
    validateOrThrow(spec);
    const auto device = resolveDevice(spec);
    if (spec.nproc > 1)
        resolveBackend(spec, device, static_cast<int>(spec.nproc));  // refused before workers start
}

TrainResult torch_impl::train(const RunSpec& spec, const TrainOptions& options, const EventSink& sink) {
    TrainingLoop loop(spec, options, sink);
    if (!spec.teacher.empty()) loop.addHook(compression::makeDistillHook(spec));
    if (!spec.ppoPolicy.empty()) loop.addHook(tuning::makePpoHook(spec));
    return loop.run();
}

}  // namespace lathe::core

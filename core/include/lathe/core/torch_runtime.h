#pragma once
// LibTorch is loaded on demand: liblathe_torch.so (training, model export and serving's model
// runner) is opened the first time one of its functions is called, so commands that only read
// the workspace start in milliseconds. See core/src/torch_backend.h.

namespace lathe::core {

/// Loads the torch-backed library now (e.g. on a worker thread, before it is needed). Throws
/// Error when it cannot be loaded. With LATHE_EAGER_TORCH=1 in the environment every program
/// that loads liblathe_core loads it at start-up, as every command did before the split (the
/// baseline of tests/bench/bench_startup.py).
void loadTorchRuntime();

/// Whether the torch-backed library has been loaded in this process.
bool torchRuntimeLoaded() noexcept;

}  // namespace lathe::core

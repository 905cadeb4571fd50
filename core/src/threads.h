#pragma once
// Compute threads of this process (private; forwarded by torch_runtime.cpp to trainer.cpp).

namespace lathe::core {

/// LibTorch's intra-op threads and OpenBLAS's pool (n <= 0: leave both as they are).
void setComputeThreads(int n);

}  // namespace lathe::core

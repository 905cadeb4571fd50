// Stand-ins for the CUDA entry points in builds without the toolkit, so callers compile the
// same way everywhere and find out at run time (cudaCompiled() / deviceCount()).

#include "lathe/kernels/cuda_device.hpp"
#include "lathe/kernels/scale_and_check.hpp"

namespace lathe::kernels::cuda {

namespace {
[[noreturn]] void notBuilt(const char* what) {
    throw CudaError(std::string(what) + ": lathe was built without CUDA (toolkit not found at configure time)");
}
}  // namespace

int deviceCount() noexcept { return 0; }
std::string deviceDescription(int) { notBuilt("deviceDescription"); }
void setDevice(int) { notBuilt("setDevice"); }
void* deviceAlloc(std::size_t) { notBuilt("deviceAlloc"); }
void deviceFree(void*) noexcept {}
void deviceMemset(void*, int, std::size_t) { notBuilt("deviceMemset"); }
void copyHostToDevice(void*, const void*, std::size_t) { notBuilt("copyHostToDevice"); }
void copyDeviceToHost(void*, const void*, std::size_t) { notBuilt("copyDeviceToHost"); }
void synchronize(void*) { notBuilt("synchronize"); }
void scaleAndCheck(float*, std::size_t, float, int*, void*) { notBuilt("cuda::scaleAndCheck"); }

}  // namespace lathe::kernels::cuda

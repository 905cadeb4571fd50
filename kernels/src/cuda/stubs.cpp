// Stand-ins for the CUDA entry points in builds without the toolkit, so callers compile the
// same way everywhere and find out at run time (cudaCompiled() / deviceCount()).

#include "lathe/kernels/compress.h"
#include "lathe/kernels/cuda_device.h"
#include "lathe/kernels/optim.h"
#include "lathe/kernels/qgemm.h"
#include "lathe/kernels/scale_and_check.h"

namespace lathe::kernels::cuda {

namespace {
[[noreturn]] void notBuilt(const char* what) {
    throw CudaError(std::string(what) +
                    ": lathe was built without CUDA (toolkit not found at configure time)");
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
void copyDeviceToDevice(void*, const void*, std::size_t, void*) { notBuilt("copyDeviceToDevice"); }
void synchronize(void*) { notBuilt("synchronize"); }
void* eventCreate() { notBuilt("eventCreate"); }
void eventDestroy(void*) noexcept {}
void eventRecord(void*, void*) { notBuilt("eventRecord"); }
float eventElapsedMs(void*, void*) { notBuilt("eventElapsedMs"); }
void scaleAndCheck(float*, std::size_t, float, int*, void*) { notBuilt("cuda::scaleAndCheck"); }
void adamStep(const AdamHyper&, const OptimTensor*, std::size_t, void*) { notBuilt("cuda::adamStep"); }
void sgdStep(const SgdHyper&, const OptimTensor*, std::size_t, void*) { notBuilt("cuda::sgdStep"); }
void quantizeInt8(const float*, float*, std::size_t, std::int8_t*, float*, const QuantizeParams&, void*) {
    notBuilt("cuda::quantizeInt8");
}
void quantizeInt4(const float*, float*, std::size_t, std::uint8_t*, float*, const QuantizeParams&, void*) {
    notBuilt("cuda::quantizeInt4");
}
void dequantizeInt8(const std::int8_t*, const float*, std::size_t, std::size_t, float*, bool, void*) {
    notBuilt("cuda::dequantizeInt8");
}
void dequantizeInt4(const std::uint8_t*, const float*, std::size_t, std::size_t, float*, bool, void*) {
    notBuilt("cuda::dequantizeInt4");
}
void floatTo16(const float*, float*, std::size_t, std::uint16_t*, bool, void*) {
    notBuilt("cuda::floatTo16");
}
void floatFrom16(const std::uint16_t*, std::size_t, float*, bool, bool, void*) {
    notBuilt("cuda::floatFrom16");
}

void gemmS8S32(const std::int8_t*, std::size_t, std::size_t, const std::int8_t*, std::size_t, std::int32_t*,
               std::size_t, void*) {
    notBuilt("cuda::gemmS8S32");
}
void qlinearQuantized(const std::int8_t*, const float*, std::size_t, const std::int8_t*, const float*,
                      const float*, std::size_t, std::size_t, float*, std::size_t, bool, void*) {
    notBuilt("cuda::qlinearQuantized");
}

}  // namespace lathe::kernels::cuda

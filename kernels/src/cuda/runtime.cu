// Thin wrappers over the CUDA runtime that turn error codes into CudaError and treat "no
// driver" / "no device" as a device count of 0 rather than an error.

#include "lathe/kernels/cuda_device.h"

#include <cuda_runtime.h>

#include <string>

namespace lathe::kernels::cuda {

namespace {
void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess)
        throw CudaError(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}
}  // namespace

int deviceCount() noexcept {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        // cudaErrorNoDevice, cudaErrorInsufficientDriver, ...: clear the sticky-free error so
        // later calls do not report it, and say there is nothing to run on.
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

std::string deviceDescription(int device) {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
           std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
}

void setDevice(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }

void* deviceAlloc(std::size_t bytes) {
    void* ptr = nullptr;
    check(cudaMalloc(&ptr, bytes), "cudaMalloc");
    return ptr;
}

void deviceFree(void* ptr) noexcept {
    if (ptr) (void)cudaFree(ptr);
}

void deviceMemset(void* ptr, int value, std::size_t bytes) {
    check(cudaMemset(ptr, value, bytes), "cudaMemset");
}

void copyHostToDevice(void* dst, const void* src, std::size_t bytes) {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host->device");
}

void copyDeviceToHost(void* dst, const void* src, std::size_t bytes) {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device->host");
}

void copyDeviceToDevice(void* dst, const void* src, std::size_t bytes, void* stream) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync device->device");
}

void synchronize(void* stream) {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

void* eventCreate() {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "cudaEventCreate");
    return e;
}

void eventDestroy(void* event) noexcept {
    if (event) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void eventRecord(void* event, void* stream) {
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
          "cudaEventRecord");
}

float eventElapsedMs(void* start, void* end) {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(end)), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
          "cudaEventElapsedTime");
    return ms;
}

}  // namespace lathe::kernels::cuda

#pragma once
// Minimal CUDA runtime helpers so callers (tests, benchmarks, core) can stage data for the
// device kernels without including CUDA headers. Streams are cudaStream_t passed as void*.
// In builds without CUDA every function except deviceCount() throws CudaError.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace lathe::kernels::cuda {

// A CUDA runtime failure, with the call that failed and the runtime's description.
class CudaError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Number of CUDA devices; 0 (never an exception) without driver, GPU or CUDA build.
int deviceCount() noexcept;

// "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)"; throws CudaError for an invalid index.
std::string deviceDescription(int device);

void setDevice(int device);
void* deviceAlloc(std::size_t bytes);
void deviceFree(void* ptr) noexcept;
void deviceMemset(void* ptr, int value, std::size_t bytes);
void copyHostToDevice(void* dst, const void* src, std::size_t bytes);
void copyDeviceToHost(void* dst, const void* src, std::size_t bytes);
// Asynchronous on `stream` (the bandwidth baseline of the kernel benchmarks).
void copyDeviceToDevice(void* dst, const void* src, std::size_t bytes, void* stream = nullptr);
// Waits for the stream (nullptr: the default stream) and reports any pending kernel error.
void synchronize(void* stream = nullptr);

// Timing events (cudaEvent_t as void*), for device time between two points of a stream: the
// profiler records one before and one after each op, as torch's legacy CUDA profiler did.
// Created on the calling thread's current device.
void* eventCreate();
void eventDestroy(void* event) noexcept;
void eventRecord(void* event, void* stream = nullptr);
// Milliseconds from `start` to `end`, waiting for `end` to complete.
float eventElapsedMs(void* start, void* end);

// Owns one device allocation.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes) : m_ptr(bytes ? deviceAlloc(bytes) : nullptr), m_bytes(bytes) {}
    ~DeviceBuffer() { deviceFree(m_ptr); }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : m_ptr(std::exchange(o.m_ptr, nullptr)), m_bytes(std::exchange(o.m_bytes, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            deviceFree(m_ptr);
            m_ptr = std::exchange(o.m_ptr, nullptr);
            m_bytes = std::exchange(o.m_bytes, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* get() const noexcept { return m_ptr; }
    template <typename T>
    T* as() const noexcept {
        return static_cast<T*>(m_ptr);
    }
    std::size_t bytes() const noexcept { return m_bytes; }

private:
    void* m_ptr = nullptr;
    std::size_t m_bytes = 0;
};

}  // namespace lathe::kernels::cuda

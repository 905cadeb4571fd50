#pragma once
// Op-level profiler on LibTorch's RecordFunction callbacks, plus step phases marked by the
// trainer. Torch-free header: the callbacks live in profiler.cpp.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "lathe/core/profile_analysis.h"

namespace lathe::core {

class Profiler {
public:
    explicit Profiler(ProfileSchedule schedule);
    ~Profiler();
    Profiler(const Profiler&) = delete;
    Profiler& operator=(const Profiler&) = delete;

    /// Called by the trainer before each step (1-based): attaches or detaches the callbacks
    /// and switches recording on or off according to the schedule.
    void beginStep(int64_t step);
    bool recording() const { return m_recording.load(std::memory_order_relaxed); }
    int64_t nowNs() const;
    /// Records a phase span of the current step (when recording).
    void addPhase(const char* name, int64_t startNs, int64_t endNs, int64_t cudaNs = -1);
    /// Spans recorded since the last call.
    std::vector<ProfileSpan> takeSpans();
    /// On a GPU: waits for the device at phase boundaries while recording, so a phase's span
    /// covers its device work, and reports that time as the phase's cudaNs.
    void setDeviceSync(std::function<void()> sync) { m_sync = std::move(sync); }
    void syncDevice() const {
        if (m_sync) m_sync();
    }
    bool deviceTimed() const { return static_cast<bool>(m_sync); }
    /// On a GPU: ops with CUDA inputs also get their device time (cudaNs), from CUDA events
    /// recorded on the default stream before and after each op (as torch's legacy profiler
    /// with use_cuda did). -1: off.
    void setDeviceOps(int cudaDevice) { m_cudaDevice = cudaDevice; }
    int cudaDevice() const { return m_cudaDevice; }
    /// Added to every span's thread number (a pipeline stage's lanes: kStageLaneStride * stage).
    void setLaneOffset(int64_t offset) { m_laneOffset = offset; }

    // Used by the RecordFunction callbacks.
    void addOp(ProfileSpan&& span, void* startEvent = nullptr, void* endEvent = nullptr);
    void* takeEvent();
    void returnEvent(void* event);
    int64_t currentStep() const { return m_step.load(std::memory_order_relaxed); }

private:
    void attach();
    void detach();

    ProfileSchedule m_schedule;
    std::chrono::steady_clock::time_point m_origin;
    int64_t m_originWallNs = 0;
    std::atomic<bool> m_recording{false};
    std::atomic<int64_t> m_step{0};
    bool m_attached = false;
    uint64_t m_handle = 0;
    std::mutex m_mutex;
    std::vector<ProfileSpan> m_spans;
    std::function<void()> m_sync;
    int m_cudaDevice = -1;
    int64_t m_laneOffset = 0;
    struct DeviceTimed {
        size_t span;  // index into m_spans
        void* start;
        void* end;
    };
    std::vector<DeviceTimed> m_deviceTimed;  // resolved (and their events reused) in takeSpans()
    std::vector<void*> m_freeEvents;
};

/// Times one phase of a step; a no-op unless the profiler is recording.
class PhaseScope {
public:
    PhaseScope(Profiler* p, const char* name) : m_p(p && p->recording() ? p : nullptr), m_name(name) {
        if (!m_p) return;
        m_p->syncDevice();
        m_start = m_p->nowNs();
    }
    ~PhaseScope() {
        if (!m_p) return;
        m_p->syncDevice();
        const int64_t end = m_p->nowNs();
        m_p->addPhase(m_name, m_start, end, m_p->deviceTimed() ? end - m_start : -1);
    }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

private:
    Profiler* m_p;
    const char* m_name;
    int64_t m_start = 0;
};

}  // namespace lathe::core

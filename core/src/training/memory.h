#pragma once
// Tensor memory a scope allocates on the CPU (private: part of lathe_torch). LibTorch's CPU
// allocator is wrapped once: every allocation made on a thread while an AllocationScope is active
// there is counted, until it is freed (on any thread), and so is the peak of what is live. Other
// threads' allocations (the reducer's communication thread, a loader, a server) and the C heap's
// own bookkeeping do not disturb the count, and it works under any malloc (a sanitizer's too).
// Used for perf/activation_mb: the peak of the tensor memory one step's forward and backward
// allocate (activations, recomputed segments, gradients in flight).
#include <cstddef>
#include <cstdint>
#include <memory>

namespace lathe::core {

class AllocationScope {
public:
    /// Starts counting this thread's CPU tensor allocations (nested scopes: the innermost counts).
    AllocationScope();
    ~AllocationScope();
    AllocationScope(const AllocationScope&) = delete;
    AllocationScope& operator=(const AllocationScope&) = delete;

    /// Bytes allocated in the scope and not freed yet.
    size_t liveBytes() const;
    /// The most that was live at once.
    size_t peakBytes() const;
    /// Stops counting new allocations (frees of counted ones still count).
    void stop();

    struct Counter;

private:
    std::shared_ptr<Counter> m_counter;
    std::shared_ptr<Counter> m_previous;
    bool m_active = true;
};

}  // namespace lathe::core

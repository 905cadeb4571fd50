// The counting CPU allocator behind AllocationScope (memory.h).
#include "training/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

namespace lathe::core {

struct AllocationScope::Counter {
    std::atomic<int64_t> live{0};
    std::atomic<int64_t> peak{0};
    void add(int64_t n) {
        const int64_t now = live.fetch_add(n) + n;
        int64_t seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
    }
};

namespace {

thread_local std::shared_ptr<AllocationScope::Counter> t_counter;

// Counted allocations: data pointer -> (bytes, counter), looked up by countedDelete, which only
// counted blocks and raw deallocations reach. Never destroyed: LibTorch may free a counted block
// during static destruction, after this file's objects would be gone.
struct Counted {
    std::mutex mutex;
    std::unordered_map<void*, std::pair<int64_t, std::shared_ptr<AllocationScope::Counter>>> blocks;
};
Counted& countedTable() {
    static auto* c = new Counted;
    return *c;
}
std::atomic<int64_t> g_countedBlocks{0};

c10::Allocator* g_inner = nullptr;
c10::DeleterFnPtr g_innerDelete = nullptr;

void countedDelete(void* p) {
    if (g_countedBlocks.load(std::memory_order_acquire) > 0) {
        std::shared_ptr<AllocationScope::Counter> counter;
        int64_t bytes = 0;
        {
            Counted& c = countedTable();
            std::lock_guard<std::mutex> lk(c.mutex);
            const auto it = c.blocks.find(p);
            if (it != c.blocks.end()) {
                bytes = it->second.first;
                counter = std::move(it->second.second);
                c.blocks.erase(it);
                g_countedBlocks.fetch_sub(1, std::memory_order_release);
            }
        }
        if (counter) counter->add(-bytes);
    }
    g_innerDelete(p);
}

// Blocks allocated outside a scope are the inner allocator's, untouched (no cost on their free).
// A counted block is the same memory with countedDelete as its deleter; raw_deleter() is
// countedDelete too, which frees an uncounted block as the inner allocator does, so ideep's raw
// allocations work whichever they are.
struct CountingAllocator final : c10::Allocator {
    // LibTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    c10::DataPtr allocate(size_t n) override { return counted(n); }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
        default_copy_data(dest, src, count);
    }
#else
    c10::DataPtr allocate(size_t n) const override { return counted(n); }
#endif
    c10::DataPtr counted(size_t n) const {
        c10::DataPtr inner = g_inner->allocate(n);
        if (!t_counter || n == 0 || inner.get() != inner.get_context() ||
            inner.get_deleter() != g_innerDelete)
            return inner;  // not counted, or not the default allocator's kind of block
        void* p = inner.release_context();
        {
            Counted& c = countedTable();
            std::lock_guard<std::mutex> lk(c.mutex);
            c.blocks[p] = {static_cast<int64_t>(n), t_counter};
            g_countedBlocks.fetch_add(1, std::memory_order_release);
        }
        t_counter->add(static_cast<int64_t>(n));
        return {p, p, &countedDelete, c10::Device(c10::DeviceType::CPU)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &countedDelete; }
};

// Installed once, before the first scope; the allocator lives as long as the process.
void installCountingAllocator() {
    static std::once_flag once;
    std::call_once(once, [] {
        g_inner = c10::GetCPUAllocator();
        g_innerDelete = g_inner->raw_deleter();
        if (!g_innerDelete) return;  // an allocator without a raw deleter: nothing is counted
        static auto* counting = new CountingAllocator;  // never destroyed, as c10 keeps using it
        c10::SetCPUAllocator(counting, /*priority=*/1);
    });
}

}  // namespace

AllocationScope::AllocationScope() : m_counter(std::make_shared<Counter>()) {
    installCountingAllocator();
    m_previous = std::move(t_counter);
    t_counter = m_counter;
}

AllocationScope::~AllocationScope() { stop(); }

void AllocationScope::stop() {
    if (!m_active) return;
    m_active = false;
    t_counter = std::move(m_previous);
}

size_t AllocationScope::liveBytes() const {
    return static_cast<size_t>(std::max<int64_t>(0, m_counter->live.load()));
}

size_t AllocationScope::peakBytes() const {
    return static_cast<size_t>(std::max<int64_t>(0, m_counter->peak.load()));
}

}  // namespace lathe::core

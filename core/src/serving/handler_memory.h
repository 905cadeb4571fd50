#pragma once
// Memory for the operations Asio allocates on a connection's behalf: every async read, write,
// timer wait and post allocates an operation object holding its handler. By default those come
// from a small per-thread cache that misses whenever sizes alternate or an operation is freed on
// another thread than the one that made it (the batcher posts every answer), so a saturated
// server called malloc several times per request. A connection has at most a few operations
// outstanding at once (a read or a write, its timer, an answer posted to it), so it keeps that
// many fixed slots and hands them out to handlers wrapped by withMemory(); anything larger, or a
// fifth at once, falls back to the heap. Asio finds the memory through the handler's associated
// allocator (Asio's "allocation" example shows the pattern).
//
// Slots are taken and returned with atomics: the batcher thread posts to a connection while the
// connection's own thread may free its timer's operation.
#include <array>
#include <atomic>
#include <cstddef>
#include <new>
#include <utility>

namespace lathe::core::serving {

class HandlerMemory {
public:
    static constexpr size_t kSlots = 4;
    static constexpr size_t kSlotBytes = 1024;

    HandlerMemory() = default;
    HandlerMemory(const HandlerMemory&) = delete;
    HandlerMemory& operator=(const HandlerMemory&) = delete;

    void* allocate(size_t bytes) {
        if (bytes <= kSlotBytes)
            for (auto& s : m_slots)
                if (!s.used.load(std::memory_order_relaxed) &&
                    !s.used.exchange(true, std::memory_order_acquire))
                    return s.bytes;
        return ::operator new(bytes);
    }

    void deallocate(void* p) {
        for (auto& s : m_slots)
            if (p == s.bytes) {
                s.used.store(false, std::memory_order_release);
                return;
            }
        ::operator delete(p);
    }

private:
    struct Slot {
        alignas(std::max_align_t) unsigned char bytes[kSlotBytes];
        std::atomic<bool> used{false};
    };
    std::array<Slot, kSlots> m_slots;
};

/// A standard allocator over a HandlerMemory, as Asio's operations ask for it.
template <class T>
class HandlerAllocator {
public:
    using value_type = T;
    explicit HandlerAllocator(HandlerMemory& memory) noexcept : m_memory(&memory) {}
    template <class U>
    HandlerAllocator(const HandlerAllocator<U>& other) noexcept : m_memory(other.m_memory) {}

    T* allocate(size_t n) { return static_cast<T*>(m_memory->allocate(sizeof(T) * n)); }
    void deallocate(T* p, size_t) noexcept { m_memory->deallocate(p); }

    template <class U>
    bool operator==(const HandlerAllocator<U>& other) const noexcept {
        return m_memory == other.m_memory;
    }
    template <class U>
    bool operator!=(const HandlerAllocator<U>& other) const noexcept {
        return m_memory != other.m_memory;
    }

private:
    template <class>
    friend class HandlerAllocator;
    HandlerMemory* m_memory;
};

/// A completion handler whose operations live in `memory`. The handler must keep the memory's
/// owner alive (a session's handlers hold shared_from_this()): Asio frees an operation's memory
/// before it calls the handler moved out of it.
template <class Handler>
class MemoryHandler {
public:
    using allocator_type = HandlerAllocator<Handler>;
    MemoryHandler(HandlerMemory& memory, Handler handler)
        : m_memory(&memory), m_handler(std::move(handler)) {}
    allocator_type get_allocator() const noexcept { return allocator_type(*m_memory); }
    template <class... Args>
    void operator()(Args&&... args) {
        m_handler(std::forward<Args>(args)...);
    }

private:
    HandlerMemory* m_memory;
    Handler m_handler;
};

template <class Handler>
MemoryHandler<std::decay_t<Handler>> withMemory(HandlerMemory& memory, Handler&& handler) {
    return MemoryHandler<std::decay_t<Handler>>(memory, std::forward<Handler>(handler));
}

}  // namespace lathe::core::serving

// AllocationScope (core/src/training/memory.h): what perf/activation_mb is measured with.
// LibTorch first: glog (through c10) defines CHECK too, and Catch2's must be the one in force.
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <thread>

#include "training/memory.h"

using lathe::core::AllocationScope;

TEST_CASE("an allocation scope counts this thread's tensor memory and its peak", "[memory]") {
    constexpr size_t kMb = 1 << 20;
    AllocationScope scope;
    CHECK(scope.liveBytes() == 0);
    {
        auto a = torch::empty({static_cast<int64_t>(kMb / 4)}, torch::kFloat);  // 1 MiB
        CHECK(scope.liveBytes() >= kMb);
        {
            auto b = torch::empty({static_cast<int64_t>(2 * kMb / 4)}, torch::kFloat);  // 2 MiB
            CHECK(scope.liveBytes() >= 3 * kMb);
        }
        CHECK(scope.liveBytes() < 2 * kMb);  // b is freed
    }
    CHECK(scope.liveBytes() == 0);
    CHECK(scope.peakBytes() >= 3 * kMb);
    CHECK(scope.peakBytes() < 3 * kMb + 64 * 1024);

    // Another thread's allocations, however large, are not this scope's.
    const size_t before = scope.peakBytes();
    std::thread([] { auto big = torch::ones({static_cast<int64_t>(16 * kMb / 4)}); }).join();
    CHECK(scope.peakBytes() == before);
    CHECK(scope.liveBytes() == 0);
}

TEST_CASE("memory counted in a scope is uncounted when freed after it stopped", "[memory]") {
    torch::Tensor kept;
    AllocationScope scope;
    kept = torch::zeros({1000});
    CHECK(scope.liveBytes() >= 4000);
    scope.stop();
    auto later = torch::zeros({100000});  // not counted: the scope stopped
    CHECK(scope.liveBytes() < 400000);
    kept = torch::Tensor();
    CHECK(scope.liveBytes() == 0);
    // Nested scopes: the inner one counts while it lives, the outer one again after.
    AllocationScope outer;
    {
        AllocationScope inner;
        auto t = torch::zeros({1000});
        CHECK(inner.liveBytes() >= 4000);
        CHECK(outer.liveBytes() == 0);
    }
    auto u = torch::zeros({1000});
    CHECK(outer.liveBytes() >= 4000);
}

TEST_CASE("raw allocations (ideep's engine) go through the counting allocator", "[memory]") {
    AllocationScope scope;
    c10::Allocator* cpu = c10::GetCPUAllocator();
    REQUIRE(cpu->raw_deleter() != nullptr);
    void* p = cpu->raw_allocate(4096);
    REQUIRE(p != nullptr);
    CHECK(scope.liveBytes() >= 4096);
    cpu->raw_deallocate(p);
    CHECK(scope.liveBytes() == 0);
}

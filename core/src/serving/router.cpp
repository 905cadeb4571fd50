#include "router.h"

#include <chrono>
#include <functional>
#include <thread>

namespace lathe::core::serving {
namespace {

// FNV-1a over the bytes, then SplitMix64's finalizer: FNV alone leaves the low bits of short,
// similar ids (user-1, user-2, …) poorly mixed; the finalizer spreads every input bit over the
// whole word. Both are fixed, published functions, so a bucket never changes between builds.
uint64_t fnv1a(uint64_t h, std::string_view bytes) {
    for (const unsigned char c : bytes) {
        h ^= c;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint32_t bucketOf(uint64_t h) {
    // The top 32 bits scaled to 0..9999 (multiply and shift: no modulo bias worth the name).
    return static_cast<uint32_t>(((h >> 32) * kBasisPoints) >> 32);
}

}  // namespace

uint32_t userBucket(std::string_view model, int64_t candidate, std::string_view userId) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv1a(h, model);
    // The candidate as 8 bytes, least significant first (the same on every machine), between
    // separators, so that no model name and version run into each other.
    char salt[10] = {'\x1f'};
    for (int i = 0; i < 8; ++i)
        salt[1 + i] = static_cast<char>((static_cast<uint64_t>(candidate) >> (8 * i)) & 0xff);
    salt[9] = '\x1f';
    h = fnv1a(h, std::string_view(salt, sizeof salt));
    h = fnv1a(h, userId);
    return bucketOf(mix64(h));
}

bool toCandidate(const TrafficSplit& split, std::string_view model, std::string_view userId,
                 uint64_t randomDraw) {
    if (split.candidate == 0 || split.candidateBp <= 0) return false;
    if (split.candidateBp >= kBasisPoints) return true;
    const uint32_t bucket =
        userId.empty() ? bucketOf(mix64(randomDraw)) : userBucket(model, split.candidate, userId);
    return bucket < static_cast<uint32_t>(split.candidateBp);
}

uint64_t splitDraw() {
    // SplitMix64 per thread, seeded from the clock and the thread.
    thread_local uint64_t state =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (std::hash<std::thread::id>{}(std::this_thread::get_id()) << 1);
    state += 0x9e3779b97f4a7c15ULL;
    return mix64(state);
}

}  // namespace lathe::core::serving

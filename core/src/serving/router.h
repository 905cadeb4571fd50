#pragma once
// The traffic split of an A/B test or progressive rollout: which of a model's two served versions
// answers a request that names no version.
//
// A request that carries a user id (the `X-User-Id` header, or the request parameter the rollout
// names) goes by a stable hash of that id, salted with the model and the candidate version, into
// one of 10,000 buckets; buckets below the candidate's weight (in basis points) go to the
// candidate. So:
//  - a user sees the same version for as long as the weights stay (sticky), in every server
//    process and after restarts (the hash depends on nothing but the id and the salt);
//  - raising the candidate's weight only moves baseline users to the candidate, never back
//    (consistent assignment: the candidate's buckets at 5% are among its buckets at 25%);
//  - the next rollout of the model (another candidate) draws a fresh split, so the same users are
//    not always the first to get a new version.
// A request without an id is split at random with the same weight, and counted apart.
#include <cstdint>
#include <string>
#include <string_view>

namespace lathe::core::serving {

constexpr int32_t kBasisPoints = 10000;

/// A model's split; candidate 0 (or weight 0) sends everything to the baseline.
struct TrafficSplit {
    int64_t baseline = 0;
    int64_t candidate = 0;
    int32_t candidateBp = 0;    // 0..10000
    std::string userParameter;  // a request parameter holding the user id, besides X-User-Id
};

/// The bucket 0..9999 of `userId` in the split of `model`'s rollout to `candidate`.
uint32_t userBucket(std::string_view model, int64_t candidate, std::string_view userId);

/// Whether a request goes to the candidate: by its user's bucket, or, with no id, by `randomDraw`
/// (any 64-bit random number).
bool toCandidate(const TrafficSplit& split, std::string_view model, std::string_view userId,
                 uint64_t randomDraw);

/// A fast per-thread random number for requests without a user id (not for anything secret).
uint64_t splitDraw();

}  // namespace lathe::core::serving

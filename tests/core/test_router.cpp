// The A/B traffic split (core/src/serving/router.h) alone: sticky, consistent as weights rise,
// close to its weights, fresh for the next rollout, and independent of the process.
#include "serving/router.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

using namespace lathe::core::serving;

namespace {

constexpr int kUsers = 100000;

std::string userId(int i) { return "user-" + std::to_string(i); }

std::vector<bool> assign(const TrafficSplit& split) {
    std::vector<bool> out(kUsers);
    for (int i = 0; i < kUsers; ++i) out[static_cast<size_t>(i)] = toCandidate(split, "digits", userId(i), 0);
    return out;
}

double share(const std::vector<bool>& v) {
    size_t n = 0;
    for (const bool b : v) n += b;
    return static_cast<double>(n) / static_cast<double>(v.size());
}

}  // namespace

TEST_CASE("the split is sticky, close to its weights, and raising the weight moves only baseline users",
          "[serving][rollout]") {
    TrafficSplit split{1, 2, 500, {}};
    const auto at5 = assign(split);
    // Sticky: the same users, asked again, get the same versions.
    CHECK(assign(split) == at5);
    // Close to the weight: 5% of 100k users is 5,000 ± 3 sigma (about 207).
    CHECK(std::fabs(share(at5) - 0.05) < 0.0021);

    split.candidateBp = 2500;
    const auto at25 = assign(split);
    CHECK(std::fabs(share(at25) - 0.25) < 0.0041);
    // Consistent: every candidate user at 5% is still one at 25%; the new ones came from baseline.
    int moved = 0, movedBack = 0;
    for (size_t i = 0; i < at5.size(); ++i) {
        if (at5[i] && !at25[i]) ++movedBack;
        if (!at5[i] && at25[i]) ++moved;
    }
    CHECK(movedBack == 0);
    CHECK(moved > 15000);

    split.candidateBp = 10000;
    CHECK(share(assign(split)) == 1.0);
    split.candidateBp = 0;
    CHECK(share(assign(split)) == 0.0);
    split.candidateBp = 5000;
    split.candidate = 0;  // no candidate: everything to the baseline, whatever the weight says
    CHECK(share(assign(split)) == 0.0);
}

TEST_CASE("buckets depend only on the model, the candidate and the id", "[serving][rollout]") {
    // Fixed values: a bucket must not change between builds or machines (FNV-1a, SplitMix64's
    // finalizer), or users would change sides when a server is upgraded mid-rollout.
    CHECK(userBucket("digits", 2, "user-42") == 5043u);
    CHECK(userBucket("digits", 3, "user-42") == 924u);
    CHECK(userBucket("mnist", 2, "alice@example.com") == 5891u);
    // Another model's or another candidate's rollout splits users afresh: about as many users
    // share a side by chance as independence predicts (5% of 5% = 0.25%, ±0.05%).
    int both = 0, bothOtherModel = 0;
    for (int i = 0; i < kUsers; ++i) {
        const bool a = userBucket("digits", 2, userId(i)) < 500;
        both += a && userBucket("digits", 3, userId(i)) < 500;
        bothOtherModel += a && userBucket("mnist", 2, userId(i)) < 500;
    }
    CHECK(std::abs(both - 250) < 60);
    CHECK(std::abs(bothOtherModel - 250) < 60);
    // Buckets are spread evenly: each tenth of the range holds about a tenth of the users.
    std::vector<int> tenths(10);
    for (int i = 0; i < kUsers; ++i) ++tenths[userBucket("digits", 2, userId(i)) / 1000];
    for (const int n : tenths) CHECK(std::abs(n - kUsers / 10) < 300);
}

TEST_CASE("requests without a user id are split at random with the same weight", "[serving][rollout]") {
    const TrafficSplit split{1, 2, 2000, {}};
    int toCand = 0;
    for (int i = 0; i < kUsers; ++i) toCand += toCandidate(split, "digits", "", splitDraw());
    CHECK(std::abs(toCand - 20000) < 400);  // 20% ± 3 sigma (about 380)
}

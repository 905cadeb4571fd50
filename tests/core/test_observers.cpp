// Static quantization's activation observers (compression/observers.h) against their definitions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "compression/observers.h"
#include "lathe/core/error.h"

using lathe::core::compression::Observer;

TEST_CASE("minmax keeps the largest |x|, moving-average follows batches with c = 0.01",
          "[compress][observers]") {
    Observer mm(Observer::Kind::MinMax), ma(Observer::Kind::MovingAverage);
    const std::vector<float> a{1.f, -4.f, 2.f}, b{0.5f, 2.f},
        c{-8.f, std::numeric_limits<float>::quiet_NaN()};
    for (auto* o : {&mm, &ma}) {
        o->observe(a.data(), a.size());
        o->observe(b.data(), b.size());
        o->observe(c.data(), c.size());
    }
    CHECK(mm.amax() == 8.f);
    CHECK(mm.scale() == Approx(8.0 / 127));
    CHECK(mm.nonFinite() == 1);
    // 4, then 4 + 0.01 (2 - 4) = 3.98, then 3.98 + 0.01 (8 - 3.98) = 4.0202
    CHECK(ma.amax() == Approx(4.0202));
    CHECK(ma.batches() == 3);
    Observer zeros(Observer::Kind::MinMax);
    const std::vector<float> z(10, 0.f);
    zeros.observe(z.data(), z.size());
    CHECK(zeros.scale() == 0.f);
    CHECK_THROWS_AS(Observer::kindFromName("magic"), lathe::core::ConfigError);
    CHECK(Observer::kindFromName("histogram") == Observer::Kind::Histogram);
}

TEST_CASE("the histogram observer finds the percentile of |x| within a bin, through range doublings",
          "[compress][observers]") {
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.f, 1.f);
    Observer h(Observer::Kind::Histogram, 99.0);
    std::vector<float> all;
    for (int batch = 0; batch < 20; ++batch) {
        std::vector<float> x(1000);
        for (auto& v : x) v = g(rng) * (1.f + static_cast<float>(batch) * 0.2f);  // later batches wider
        h.observe(x.data(), x.size());
        all.insert(all.end(), x.begin(), x.end());
    }
    std::vector<float> mags;
    for (float v : all) mags.push_back(std::fabs(v));
    std::sort(mags.begin(), mags.end());
    const float exact = mags[static_cast<size_t>(0.99 * static_cast<double>(mags.size())) - 1];
    const float maxSeen = mags.back();
    // Bins are at most 2 * max / 2048 wide after doublings.
    CHECK(std::fabs(h.amax() - exact) <= 2.f * 2 * maxSeen / 2048);
    CHECK(h.amax() < maxSeen);  // outliers do not set the scale
    // One outlier among many small values: minmax follows it, the histogram does not.
    Observer mm(Observer::Kind::MinMax), hist(Observer::Kind::Histogram);
    std::vector<float> x(100000, 0.01f);
    x[5] = 100.f;
    mm.observe(x.data(), x.size());
    hist.observe(x.data(), x.size());
    CHECK(mm.amax() == 100.f);
    CHECK(hist.amax() < 0.2f);
}

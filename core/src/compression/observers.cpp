// Activation observers (observers.h).
#include "compression/observers.h"

#include <algorithm>
#include <cmath>

#include "lathe/core/error.h"

namespace lathe::core::compression {

namespace {
constexpr std::size_t kBins = 2048;
constexpr double kAveraging = 0.01;
}  // namespace

Observer::Kind Observer::kindFromName(const std::string& name) {
    if (name == "minmax") return Kind::MinMax;
    if (name == "moving-average") return Kind::MovingAverage;
    if (name == "histogram") return Kind::Histogram;
    throw ConfigError("unknown observer '" + name + "' (minmax, moving-average or histogram)");
}

Observer::Observer(Kind kind, double percentile) : m_kind(kind), m_percentile(percentile) {
    if (kind == Kind::Histogram && !(percentile > 0 && percentile <= 100))
        throw ConfigError("the histogram observer's percentile must be in (0, 100] (got " +
                          std::to_string(percentile) + ")");
    if (kind == Kind::Histogram) m_bins.assign(kBins, 0.0);
}

void Observer::observe(const float* x, std::size_t n) {
    double batchMax = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double a = std::fabs(static_cast<double>(x[i]));
        if (!std::isfinite(a)) {
            ++m_nonFinite;
            continue;
        }
        batchMax = std::max(batchMax, a);
    }
    ++m_batches;
    switch (m_kind) {
        case Kind::MinMax:
            m_amax = std::max(m_amax, batchMax);
            return;
        case Kind::MovingAverage:
            m_amax = m_batches == 1 ? batchMax : m_amax + kAveraging * (batchMax - m_amax);
            return;
        case Kind::Histogram:
            break;
    }
    if (batchMax == 0 && m_amax == 0) {
        m_bins[0] += static_cast<double>(n);  // zeros only, so far
        return;
    }
    if (m_amax == 0) {
        // The first range: this batch's maximum, and the zeros counted before stay in bin 0.
        m_amax = batchMax;
    }
    while (batchMax > m_amax) {  // double the range: bin pairs merge, the upper half empties
        for (std::size_t b = 0; b < kBins / 2; ++b) m_bins[b] = m_bins[2 * b] + m_bins[2 * b + 1];
        std::fill(m_bins.begin() + kBins / 2, m_bins.end(), 0.0);
        m_amax *= 2;
    }
    const double perBin = static_cast<double>(kBins) / m_amax;
    for (std::size_t i = 0; i < n; ++i) {
        const double a = std::fabs(static_cast<double>(x[i]));
        if (!std::isfinite(a)) continue;
        m_bins[std::min(kBins - 1, static_cast<std::size_t>(a * perBin))] += 1;
    }
}

float Observer::amax() const {
    if (m_kind != Kind::Histogram) return static_cast<float>(m_amax);
    double total = 0;
    for (double c : m_bins) total += c;
    if (total == 0 || m_amax == 0) return 0.f;
    const double want = total * m_percentile / 100.0;
    double seen = 0;
    for (std::size_t b = 0; b < kBins; ++b) {
        seen += m_bins[b];
        if (seen >= want)
            return static_cast<float>(m_amax * static_cast<double>(b + 1) / kBins);  // the bin's top
    }
    return static_cast<float>(m_amax);
}

float Observer::scale() const { return amax() / 127.f; }

}  // namespace lathe::core::compression

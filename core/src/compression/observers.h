#pragma once
// Activation observers for static quantization (torch-free): each sees the calibration batches
// that reach one quantized layer's input and proposes the symmetric int8 scale (amax / 127) that
// layer will quantize its inputs with.
//
//   minmax          amax = the largest |x| seen (PyTorch's MinMaxObserver, symmetric)
//   moving-average  amax_t = amax_{t-1} + c (batch amax - amax_{t-1}), c = 0.01, the first
//                   batch's amax to start (MovingAverageMinMaxObserver)
//   histogram       amax = the `percentile` (default 99.99) of |x| over every value seen, from a
//                   2048-bin histogram whose range doubles (merging bin pairs) when a batch goes
//                   past it: outliers no longer set the scale (HistogramObserver's intent)
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lathe::core::compression {

class Observer {
public:
    enum class Kind { MinMax, MovingAverage, Histogram };
    /// "minmax", "moving-average", "histogram"; throws ConfigError for another name.
    static Kind kindFromName(const std::string& name);

    explicit Observer(Kind kind, double percentile = 99.99);
    /// One batch of values. Non-finite values are counted (nonFinite()) and otherwise ignored.
    void observe(const float* x, std::size_t n);
    /// The int8 scale: amax / 127; 0 when nothing but zeros was seen.
    float scale() const;
    float amax() const;
    int64_t batches() const { return m_batches; }
    int64_t nonFinite() const { return m_nonFinite; }

private:
    Kind m_kind;
    double m_percentile;
    double m_amax = 0;  // minmax, moving average; histogram: its range
    int64_t m_batches = 0, m_nonFinite = 0;
    std::vector<double> m_bins;  // histogram counts over [0, m_amax]
};

}  // namespace lathe::core::compression

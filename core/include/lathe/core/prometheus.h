#pragma once
// The Prometheus text exposition format, parsed defensively (serving/prometheus.cpp).
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lathe::core {

struct PromSample {
    std::string name;                           // e.g. lathe_request_duration_seconds_bucket
    std::map<std::string, std::string> labels;  // unescaped
    double value = 0;
};
/// Parses the text exposition format (version 0.0.4). Comments and TYPE/HELP lines are
/// skipped; a malformed line throws Error naming its line number. Defensive: any input is safe.
std::vector<PromSample> parsePrometheusText(const std::string& text);

/// Quantile q (0..1) of a cumulative histogram given as (upper bound, cumulative count)
/// pairs sorted by bound, +Inf last; linear interpolation inside the bucket, as Prometheus'
/// histogram_quantile. NaN when the histogram is empty.
double histogramQuantile(double q, const std::vector<std::pair<double, double>>& buckets);

}  // namespace lathe::core

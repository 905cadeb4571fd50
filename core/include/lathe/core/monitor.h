#pragma once
// Watching deployments: scrapes a server's Prometheus /metrics every second, turns counters and
// histograms into per-interval series (QPS, P50/P90/P99 latency, error rate, batch sizes, queue
// depth, CPU, memory, GPU) stored in the workspace, and evaluates alert rules on them.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/registry.h"

namespace lathe::core {

// ---- Prometheus text format ----------------------------------------------------------
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

/// One scrape interval's figures for one model. Keys stored in the workspace:
///   up (1/0), qps, error_rate (share of answers with status >= 500, 0..1; absent for an interval
///   without requests), p50_ms, p90_ms, p99_ms,
///   queue_ms_p99, compute_ms_p99, batch_mean, queue_depth, cpu_percent, rss_mb, gpu_util (0..100),
///   gpu_mem_mb, and batch_hist/<upper bound> (batches in the interval per batch-size bucket).
struct IntervalStats {
    double t = 0;
    int64_t version = 0;
    std::map<std::string, double> values;
    double requests = -1;  // answered in the interval (not stored); -1 = unknown
    double errors = 0;     // of which status >= 500
};

/// Computes interval figures from two consecutive scrapes (`prev` may be empty: first scrape
/// gives only gauges). `dt` in seconds.
IntervalStats intervalStats(const std::string& model, const std::vector<PromSample>& prev,
                            const std::vector<PromSample>& cur, double dt, double t);

// ---- alert rules ---------------------------------------------------------------------
struct AlertRules {
    double p99ThresholdMs = 100;     // P99 above this ...
    int p99Samples = 3;              // ... for this many consecutive samples
    double errorRateRisePoints = 5;  // error rate up by more than 5 percentage points ...
    double errorRateWindowS = 300;   // ... within 5 minutes, each rate taken over at least
    int errorRateMinRequests = 20;   // ... this many requests (quiet intervals are pooled)
    double gpuIdlePercent = 20;      // GPU utilisation under 20% ...
    double gpuIdleWindowS = 600;     // ... for 10 minutes (only when a GPU reports)
};
/// Reads rules from TOML keys of the same names (snake_case: p99_threshold_ms, ...). Throws ConfigError.
AlertRules alertRulesFromToml(const std::string& toml);

struct AlertEvent {
    bool fired = true;     // false = resolved
    std::string rule;
    std::string message;
    double value = 0;
};

/// Evaluates rules on a stream of IntervalStats (one per scrape); pure logic, no I/O.
class AlertEvaluator {
public:
    explicit AlertEvaluator(AlertRules rules = {});
    std::vector<AlertEvent> add(const IntervalStats& s);
    bool firing(const std::string& rule) const;

private:
    AlertRules m_rules;
    int m_p99Run = 0;
    std::vector<std::pair<double, double>> m_errorHistory;  // (t, error rate %)
    double m_errorBaseline = 0;                             // the low the error_rate alert fired against
    double m_poolStart = 0, m_poolRequests = 0, m_poolErrors = 0;  // quiet intervals not yet judged
    std::vector<std::pair<double, double>> m_gpuHistory;    // (t, util %)
    std::map<std::string, bool> m_firing;
};

/// Scrapes `url`/metrics every `intervalS` until `stop`, storing IntervalStats of `model` into the
/// registry and firing/resolving alerts there. A failed scrape stores up = 0 and carries on.
class Scraper {
public:
    Scraper(Registry& registry, std::string model, std::string url, AlertRules rules = {}, double intervalS = 1.0);
    ~Scraper();  // stops and joins
    void start();
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

/// GET http://host:port/path with a timeout (seconds); returns status and body. Throws Error on
/// transport failure. Small blocking client shared by scraper, deploy and tests.
struct HttpResult {
    int status = 0;
    std::string body;
    std::map<std::string, std::string> headers;  // lower-case names
};
HttpResult httpRequest(const std::string& method, const std::string& url, const std::string& body = {},
                       double timeoutS = 5.0, const std::string& contentType = "application/json");

}  // namespace lathe::core

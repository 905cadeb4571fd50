#pragma once
// Watching deployments: turns two scrapes of a server's Prometheus /metrics into one interval's
// series (QPS, P50/P90/P99 latency, error rate, batch sizes, queue depth, CPU, memory, GPU) and
// evaluates alert rules on them. Pure logic; scraper.h does the I/O.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lathe/core/prometheus.h"

namespace lathe::core {

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
    /// While more than one version of the model answers (a rollout), each one's own figures,
    /// stored with that version under "variant/" keys: variant/qps, variant/requests,
    /// variant/error_rate, variant/p50_ms, variant/p90_ms, variant/p99_ms, variant/batch_mean, and
    /// variant/weight_bp (the share the rollout sends to a candidate).
    std::map<int64_t, std::map<std::string, double>> variants;
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
    /// What a firing p99_latency or error_rate alert does besides being recorded: "" nothing,
    /// "rollback": roll the model back to the version before the live one, when the live one was
    /// deployed less than rollbackWithinS ago and is not itself a rollback (once: no flapping).
    std::string action;
    double rollbackWithinS = 900;
};
/// Reads rules from TOML keys of the same names (snake_case: p99_threshold_ms, ...). Throws ConfigError.
AlertRules alertRulesFromToml(const std::string& toml);

struct AlertEvent {
    bool fired = true;  // false = resolved
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
    std::vector<std::pair<double, double>> m_gpuHistory;           // (t, util %)
    std::map<std::string, bool> m_firing;
};

}  // namespace lathe::core

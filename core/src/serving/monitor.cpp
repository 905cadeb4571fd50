// Turning two scrapes of a server's /metrics into one interval's figures, and the alert rules
// evaluated on those figures. Pure logic: the scraper (scraper.cpp) does the I/O.
#include <toml++/toml.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <unordered_map>

#include "lathe/core/error.h"
#include "lathe/core/monitor.h"

namespace lathe::core {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;  // rss_mb and gpu_mem_mb are MiB, as nvidia-smi and top show

bool endsWith(const std::string& s, const char* suffix) {
    const size_t n = std::char_traits<char>::length(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// A server may host several models; process-wide series carry no model label and count for all.
bool forModel(const PromSample& s, const std::string& model) {
    const auto it = s.labels.find("model");
    return it == s.labels.end() || it->second == model;
}

// Counters (by the Prometheus naming conventions) only ever grow while the process lives.
bool isCounter(const std::string& name) {
    return endsWith(name, "_total") || endsWith(name, "_bucket") || endsWith(name, "_count") ||
           endsWith(name, "_sum");
}

std::string seriesKey(const PromSample& s) {
    std::string k = s.name;
    for (const auto& [name, value] : s.labels) {
        k += '\x1f';
        k += name;
        k += '=';
        k += value;
    }
    return k;
}

bool parseBound(const std::string& text, double& out) {
    if (text == "+Inf" || text == "Inf") {
        out = std::numeric_limits<double>::infinity();
        return true;
    }
    const char* end = text.data() + text.size();
    const auto res = std::from_chars(text.data(), end, out);
    return res.ec == std::errc() && res.ptr == end && !std::isnan(out);
}

bool parseInt(std::string text, int64_t& out) {
    if (!text.empty() && (text.front() == 'v' || text.front() == 'V')) text.erase(0, 1);
    const char* end = text.data() + text.size();
    const auto res = std::from_chars(text.data(), end, out);
    return !text.empty() && res.ec == std::errc() && res.ptr == end;
}

std::string format(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// One model's samples of the current scrape, with deltas against the previous one.
class Diff {
public:
    Diff(const std::string& model, const std::vector<PromSample>& prev, const std::vector<PromSample>& cur) {
        for (const auto& s : cur)
            if (forModel(s, model)) m_cur.push_back(&s);
        for (const auto& s : prev)
            if (forModel(s, model)) m_prev.emplace(seriesKey(s), s.value);
        m_havePrev = !m_prev.empty();
        // A restarted server starts its counters from zero: any counter that went down, or a new
        // process start time, makes the previous scrape useless as a baseline.
        for (const PromSample* s : m_cur) {
            const bool counter = isCounter(s->name);
            if (!counter && s->name != "process_start_time_seconds") continue;
            const auto it = m_prev.find(seriesKey(*s));
            if (it == m_prev.end()) continue;
            if ((counter && s->value < it->second) || (!counter && s->value != it->second)) {
                m_prev.clear();
                m_havePrev = false;
                break;
            }
        }
    }

    bool havePrev() const { return m_havePrev; }
    const std::vector<const PromSample*>& samples() const { return m_cur; }

    /// Sum of a gauge over all series of `name`; false when there is none.
    bool gaugeSum(const std::string& name, double& sum, int* series = nullptr) const {
        int n = 0;
        sum = 0;
        for (const PromSample* s : m_cur)
            if (s->name == name && std::isfinite(s->value)) {
                sum += s->value;
                ++n;
            }
        if (series) *series = n;
        return n > 0;
    }

    /// Growth of a counter summed over its series (all versions, all codes) accepted by `keep`.
    /// A series absent last time (first request with a new code, a version swapped in) counts
    /// from zero, which is what prometheus-cpp starts it at.
    template <typename Keep>
    double delta(const std::string& name, Keep keep) const {
        double d = 0;
        for (const PromSample* s : m_cur) {
            if (s->name != name || !keep(*s) || !std::isfinite(s->value)) continue;
            const auto it = m_prev.find(seriesKey(*s));
            const double before = it == m_prev.end() || !std::isfinite(it->second) ? 0.0 : it->second;
            d += s->value - before;
        }
        return d;
    }
    double delta(const std::string& name) const {
        return delta(name, [](const PromSample&) { return true; });
    }

    struct Bucket {
        std::string le;  // as the server printed it, for batch_hist/<le>
        double count = 0;
    };
    /// Growth of each cumulative bucket of histogram `base`, summed over versions, by bound.
    std::map<double, Bucket> bucketDeltas(const std::string& base) const {
        return bucketDeltas(base, [](const PromSample&) { return true; });
    }
    template <typename Keep>
    std::map<double, Bucket> bucketDeltas(const std::string& base, Keep keep) const {
        std::map<double, Bucket> out;
        const std::string name = base + "_bucket";
        for (const PromSample* s : m_cur) {
            if (s->name != name || !keep(*s) || !std::isfinite(s->value)) continue;
            const auto le = s->labels.find("le");
            double bound = 0;
            if (le == s->labels.end() || !parseBound(le->second, bound)) continue;
            const auto it = m_prev.find(seriesKey(*s));
            const double before = it == m_prev.end() || !std::isfinite(it->second) ? 0.0 : it->second;
            auto& b = out[bound];
            if (b.le.empty()) b.le = le->second;
            b.count += s->value - before;
        }
        return out;
    }

    int64_t servedVersion() const {
        int64_t best = 0;
        for (const PromSample* s : m_cur) {
            if (s->name != "lathe_model_info" || !(s->value > 0)) continue;
            const auto it = s->labels.find("version");
            int64_t v = 0;
            if (it != s->labels.end() && parseInt(it->second, v)) best = std::max(best, v);
        }
        return best;
    }

private:
    std::vector<const PromSample*> m_cur;
    std::unordered_map<std::string, double> m_prev;
    bool m_havePrev = false;
};

// Adds key = quantile q of the interval's observations (in ms); nothing when there were none.
void putQuantileMs(std::map<std::string, double>& values, const std::string& key, double q,
                   const std::map<double, Diff::Bucket>& buckets) {
    std::vector<std::pair<double, double>> cumulative;
    cumulative.reserve(buckets.size());
    for (const auto& [bound, b] : buckets) cumulative.emplace_back(bound, b.count);
    const double v = histogramQuantile(q, cumulative);
    if (std::isfinite(v)) values[key] = v * 1000.0;
}

// The version label of a series (0 when it has none or it does not parse).
int64_t versionOf(const PromSample& s) {
    const auto it = s.labels.find("version");
    int64_t v = 0;
    return it != s.labels.end() && parseInt(it->second, v) ? v : 0;
}

// Each version's own figures while several answer (a rollout): the dashboard's A/B view.
void putVariants(IntervalStats& st, const Diff& diff, double dt) {
    std::map<int64_t, double> weights;
    for (const PromSample* s : diff.samples())
        if (s->name == "lathe_rollout_weight_bp" && versionOf(*s) > 0 && std::isfinite(s->value))
            weights[versionOf(*s)] = s->value;
    std::map<int64_t, bool> versions;
    for (const PromSample* s : diff.samples())
        if (s->name == "lathe_requests_total" && versionOf(*s) > 0) versions[versionOf(*s)] = true;
    bool rollout = false;
    for (const auto& [v, w] : weights) rollout = rollout || w > 0;
    if (versions.size() < 2 && !rollout) return;
    for (const auto& [version, seen] : versions) {
        auto mine = [version = version](const PromSample& s) { return versionOf(s) == version; };
        auto& out = st.variants[version];
        const double requests = std::max(0.0, diff.delta("lathe_requests_total", mine));
        const double errors = diff.delta("lathe_requests_total", [&](const PromSample& s) {
            const auto it = s.labels.find("code");
            int64_t code = 0;
            return mine(s) && it != s.labels.end() && parseInt(it->second, code) && code >= 500;
        });
        out["variant/requests"] = requests;
        out["variant/qps"] = requests / dt;
        if (requests > 0) out["variant/error_rate"] = std::clamp(errors / requests, 0.0, 1.0);
        const auto latency = diff.bucketDeltas("lathe_request_duration_seconds", mine);
        putQuantileMs(out, "variant/p50_ms", 0.50, latency);
        putQuantileMs(out, "variant/p90_ms", 0.90, latency);
        putQuantileMs(out, "variant/p99_ms", 0.99, latency);
        const double batches = diff.delta("lathe_batch_size_count", mine);
        if (batches > 0) out["variant/batch_mean"] = diff.delta("lathe_batch_size_sum", mine) / batches;
        if (const auto w = weights.find(version); w != weights.end()) out["variant/weight_bp"] = w->second;
        for (auto it = out.begin(); it != out.end();)
            it = std::isfinite(it->second) ? std::next(it) : out.erase(it);
    }
}

}  // namespace

IntervalStats intervalStats(const std::string& model, const std::vector<PromSample>& prev,
                            const std::vector<PromSample>& cur, double dt, double t) {
    IntervalStats st;
    st.t = t;
    auto& v = st.values;
    const Diff diff(model, prev, cur);
    st.version = diff.servedVersion();
    v["up"] = 1;

    double g = 0;
    int n = 0;
    if (diff.gaugeSum("lathe_queue_depth", g)) v["queue_depth"] = g;
    if (diff.gaugeSum("process_resident_memory_bytes", g)) v["rss_mb"] = g / kMiB;
    if (diff.gaugeSum("lathe_gpu_utilization_percent", g, &n)) v["gpu_util"] = g / n;  // mean over GPUs
    if (diff.gaugeSum("lathe_gpu_memory_used_bytes", g)) v["gpu_mem_mb"] = g / kMiB;

    if (!diff.havePrev() || !(dt > 0)) return st;  // rates need a baseline

    const double requests = diff.delta("lathe_requests_total");
    const double errors = diff.delta("lathe_requests_total", [](const PromSample& s) {
        const auto it = s.labels.find("code");
        int64_t code = 0;
        return it != s.labels.end() && parseInt(it->second, code) && code >= 500;
    });
    v["qps"] = std::max(0.0, requests) / dt;
    // No requests, no error rate: a quiet second at 0% would drag the alert's baseline down and
    // resolve a real rise.
    st.requests = std::max(0.0, requests);
    st.errors = std::clamp(errors, 0.0, st.requests);
    if (requests > 0) v["error_rate"] = std::clamp(errors / requests, 0.0, 1.0);

    const auto latency = diff.bucketDeltas("lathe_request_duration_seconds");
    putQuantileMs(v, "p50_ms", 0.50, latency);
    putQuantileMs(v, "p90_ms", 0.90, latency);
    putQuantileMs(v, "p99_ms", 0.99, latency);
    putQuantileMs(v, "queue_ms_p99", 0.99, diff.bucketDeltas("lathe_queue_duration_seconds"));
    putQuantileMs(v, "compute_ms_p99", 0.99, diff.bucketDeltas("lathe_compute_duration_seconds"));

    const double batches = diff.delta("lathe_batch_size_count");
    if (batches > 0) v["batch_mean"] = diff.delta("lathe_batch_size_sum") / batches;
    double below = 0;
    for (const auto& [bound, b] : diff.bucketDeltas("lathe_batch_size")) {
        // Buckets are read one by one while requests arrive, so a cumulative count can lag the
        // one below it by a little; clamp rather than store negative batch counts.
        v["batch_hist/" + b.le] = std::max(0.0, b.count - below);
        below = std::max(below, b.count);
    }

    putVariants(st, diff, dt);

    double cpuNow = 0;
    if (diff.gaugeSum("process_cpu_seconds_total", cpuNow))
        v["cpu_percent"] = std::max(0.0, diff.delta("process_cpu_seconds_total")) / dt * 100.0;

    for (auto it = v.begin(); it != v.end();)  // NaN or Inf would not survive the store
        it = std::isfinite(it->second) ? std::next(it) : v.erase(it);
    return st;
}

// ---- alert rules ---------------------------------------------------------------------------

AlertRules alertRulesFromToml(const std::string& text) {
    toml::table root;
    try {
        root = toml::parse(text, std::string_view("alert rules"));
    } catch (const toml::parse_error& ex) {
        throw ConfigError("alert rules line " + std::to_string(ex.source().begin.line) + ": " +
                          std::string(ex.description()));
    }
    // The rules may stand alone or sit in an [alerts] table of a larger deployment file.
    const toml::table* tbl = &root;
    if (const auto* alerts = root.get_as<toml::table>("alerts")) tbl = alerts;

    AlertRules r;
    struct Key {
        const char* name;
        double* real;
        int* integer;
        double min, max;
        const char* range;
    };
    const double inf = std::numeric_limits<double>::infinity();
    const Key keys[] = {
        {"p99_threshold_ms", &r.p99ThresholdMs, nullptr, 0, inf, "> 0"},
        {"p99_samples", nullptr, &r.p99Samples, 1, 1e6, "an integer >= 1"},
        {"error_rate_rise_points", &r.errorRateRisePoints, nullptr, 0, 100, "> 0 and <= 100"},
        {"error_rate_window_s", &r.errorRateWindowS, nullptr, 0, inf, "> 0"},
        {"error_rate_min_requests", nullptr, &r.errorRateMinRequests, 1, 1e9, "an integer >= 1"},
        {"gpu_idle_percent", &r.gpuIdlePercent, nullptr, 0, 100, "> 0 and <= 100"},
        {"gpu_idle_window_s", &r.gpuIdleWindowS, nullptr, 0, inf, "> 0"},
        {"rollback_within_s", &r.rollbackWithinS, nullptr, 0, inf, "> 0"},
    };
    for (const auto& [k, node] : *tbl) {
        const std::string key(k.str());
        const std::string where = "alert rules line " + std::to_string(node.source().begin.line) + ": ";
        if (key == "action") {
            const auto a = node.value_exact<std::string>();
            if (!a || (*a != "rollback" && *a != "none"))
                throw ConfigError(where + "'action' must be \"rollback\" or \"none\"");
            r.action = *a == "none" ? std::string() : *a;
            continue;
        }
        const Key* def = nullptr;
        for (const auto& d : keys)
            if (key == d.name) def = &d;
        if (!def) {
            std::string known;
            for (const auto& d : keys) known += (known.empty() ? "" : ", ") + std::string(d.name);
            known += ", action";
            throw ConfigError(where + "unknown key '" + key + "' (known keys: " + known + ")");
        }
        double value = 0;
        if (const auto i = node.value_exact<int64_t>())
            value = static_cast<double>(*i);
        else if (const auto f = node.value_exact<double>(); f && !def->integer)
            value = *f;
        else
            throw ConfigError(where + "'" + key + "' must be " + (def->integer ? "an integer" : "a number"));
        // Zero-width windows and thresholds would make a rule fire on every sample or never.
        const bool ok = def->integer ? value >= def->min && value <= def->max
                                     : value > def->min && value <= def->max && std::isfinite(value);
        if (!ok)
            throw ConfigError(where + "'" + key + "' must be " + def->range + ", got " + format("%g", value));
        if (def->integer)
            *def->integer = static_cast<int>(value);
        else
            *def->real = value;
    }
    return r;
}

AlertEvaluator::AlertEvaluator(AlertRules rules) : m_rules(rules) {}

bool AlertEvaluator::firing(const std::string& rule) const {
    const auto it = m_firing.find(rule);
    return it != m_firing.end() && it->second;
}

std::vector<AlertEvent> AlertEvaluator::add(const IntervalStats& s) {
    std::vector<AlertEvent> events;
    auto emit = [&](bool fired, const char* rule, std::string message, double value) {
        m_firing[rule] = fired;
        events.push_back({fired, rule, std::move(message), value});
    };
    auto get = [&](const char* key, double& out) {
        const auto it = s.values.find(key);
        if (it == s.values.end() || !std::isfinite(it->second)) return false;
        out = it->second;
        return true;
    };

    // P99 latency. An interval without requests (or a failed scrape) has no P99: it neither
    // extends nor breaks a run, so sparse traffic is judged on the requests that did come.
    if (double p99 = 0; get("p99_ms", p99)) {
        if (p99 > m_rules.p99ThresholdMs) {
            ++m_p99Run;
            if (m_p99Run >= m_rules.p99Samples && !firing("p99_latency"))
                emit(true, "p99_latency",
                     format("P99 latency %.0f ms above %g ms for %d samples", p99, m_rules.p99ThresholdMs,
                            m_p99Run),
                     p99);
        } else {
            m_p99Run = 0;
            if (firing("p99_latency"))
                emit(false, "p99_latency",
                     format("P99 latency %.0f ms back under %g ms", p99, m_rules.p99ThresholdMs), p99);
        }
    }

    // Error rate, in percentage points, against the lowest rate seen within the window. While
    // firing, the baseline stays the one it fired against: a rate that jumped and stayed high
    // must not resolve just because the window has filled with high values.
    // At low traffic one failed request in a second reads as tens of percent: intervals are pooled
    // until they hold error_rate_min_requests requests, and judged as one. A pool never spans more
    // than the window: one still short of the minimum when the window has passed is judged on
    // what it holds (so a firing alert resolves even at a trickle of traffic), and the new
    // interval starts the next pool.
    auto judgeErrorRate = [&](double pct) {
        const double cutoff = s.t - m_rules.errorRateWindowS;
        m_errorHistory.erase(std::remove_if(m_errorHistory.begin(), m_errorHistory.end(),
                                            [&](const auto& p) { return p.first < cutoff || p.first > s.t; }),
                             m_errorHistory.end());
        m_errorHistory.emplace_back(s.t, pct);
        if (!firing("error_rate")) {
            double low = pct;
            for (const auto& p : m_errorHistory) low = std::min(low, p.second);
            if (pct - low > m_rules.errorRateRisePoints) {
                m_errorBaseline = low;
                emit(true, "error_rate",
                     format("Error rate %.1f%% up %.1f points from %.1f%% within %g s", pct, pct - low, low,
                            m_rules.errorRateWindowS),
                     pct);
            }
        } else if (pct - m_errorBaseline <= m_rules.errorRateRisePoints) {
            emit(false, "error_rate",
                 format("Error rate %.1f%% back within %g points of %.1f%%", pct, m_rules.errorRateRisePoints,
                        m_errorBaseline),
                 pct);
        }
    };
    if (double rate = 0; get("error_rate", rate)) {
        if (s.requests < 0) {
            judgeErrorRate(rate * 100.0);  // counts unknown: the interval's rate stands alone
        } else {
            if (m_poolRequests > 0 && s.t - m_poolStart > m_rules.errorRateWindowS) {
                judgeErrorRate(100.0 * m_poolErrors / m_poolRequests);
                m_poolRequests = m_poolErrors = 0;
            }
            if (m_poolRequests == 0) m_poolStart = s.t;
            m_poolRequests += s.requests;
            m_poolErrors += s.errors;
            if (m_poolRequests >= m_rules.errorRateMinRequests) {
                judgeErrorRate(100.0 * m_poolErrors / m_poolRequests);
                m_poolRequests = m_poolErrors = 0;
            }
        }
    }

    // GPU idle: only judged once the samples span a whole window, so a freshly started server
    // (or one whose GPU just appeared) is not called idle after a few seconds.
    if (double util = 0; get("gpu_util", util)) {
        const double cutoff = s.t - m_rules.gpuIdleWindowS;
        auto& h = m_gpuHistory;
        h.erase(std::remove_if(h.begin(), h.end(), [&](const auto& p) { return p.first > s.t; }), h.end());
        h.emplace_back(s.t, util);
        // Keep the newest sample at or before the window start: it shows the window is covered.
        while (h.size() >= 2 && h[1].first <= cutoff) h.erase(h.begin());
        const bool covered = h.front().first <= cutoff;
        const bool allIdle =
            std::all_of(h.begin(), h.end(), [&](const auto& p) { return p.second < m_rules.gpuIdlePercent; });
        if (!firing("gpu_idle") && covered && allIdle) {
            emit(true, "gpu_idle",
                 format("GPU utilisation under %g%% for %g s (now %.0f%%)", m_rules.gpuIdlePercent,
                        m_rules.gpuIdleWindowS, util),
                 util);
        } else if (firing("gpu_idle") && util >= m_rules.gpuIdlePercent) {
            emit(false, "gpu_idle",
                 format("GPU utilisation back at %.0f%% (threshold %g%%)", util, m_rules.gpuIdlePercent),
                 util);
        }
    }
    return events;
}

}  // namespace lathe::core

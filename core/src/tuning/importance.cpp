// Parameter importance of a study (studies.h): eta-squared per parameter — the share of the
// objective's variance between groups of trials with similar values of it — normalised over the
// parameters. Cheap and model-free (no forest as Optuna's fANOVA): a few dozen trials are all a
// study has, and the Studies page recomputes it on every read.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "lathe/core/studies.h"

namespace lathe::core {

namespace {

constexpr size_t kMinTrials = 4;
constexpr size_t kMaxBins = 4;

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    const auto e = s.find_last_not_of(" \t");
    return s.substr(b, e - b + 1);
}

bool parseNumber(const std::string& text, double& out) {
    const std::string t = trim(text);
    if (t.empty()) return false;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
    out = v;
    return true;
}

// How the space describes a key: "lr=loguniform(1e-4,0.1)" → log; "batch=choice(32,64)" → choice.
struct KeyScale {
    bool log = false;
    bool choice = false;
};

std::map<std::string, KeyScale> scalesOf(const StudyRecord& study) {
    std::map<std::string, KeyScale> out;
    for (const auto& entry : study.space) {
        const auto eq = entry.find('=');
        if (eq == std::string::npos) continue;
        const std::string dist = trim(entry.substr(eq + 1));
        KeyScale s;
        s.log = dist.find("log") != std::string::npos;
        s.choice = dist.rfind("choice", 0) == 0;
        out[trim(entry.substr(0, eq))] = s;
    }
    return out;
}

// Group index of every trial for one parameter: quantile bins of a numeric parameter (on its log
// scale when log-distributed; ties share a bin), else one group per distinct value.
std::vector<size_t> groupsOf(const std::vector<std::string>& values, const KeyScale& scale) {
    const size_t n = values.size();
    std::vector<size_t> group(n, 0);
    std::vector<double> x(n);
    bool numeric = !scale.choice;
    for (size_t i = 0; i < n && numeric; ++i) numeric = parseNumber(values[i], x[i]);
    if (numeric && scale.log && std::all_of(x.begin(), x.end(), [](double v) { return v > 0; }))
        for (double& v : x) v = std::log(v);
    if (!numeric) {
        std::map<std::string, size_t> ids;
        for (size_t i = 0; i < n; ++i) group[i] = ids.emplace(values[i], ids.size()).first->second;
        return group;
    }
    const size_t bins = std::min(kMaxBins, n / 2);
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
    for (size_t r = 0; r < n; ++r) {
        const size_t i = order[r];
        // Equal values never straddle two bins: a tie joins the bin of its first occurrence.
        group[i] = r > 0 && x[order[r - 1]] == x[i] ? group[order[r - 1]] : r * bins / n;
    }
    return group;
}

}  // namespace

std::vector<ParamImportance> parameterImportance(const StudyRecord& study,
                                                 const std::vector<TrialRecord>& trials) {
    std::vector<const TrialRecord*> used;
    for (const auto& t : trials)
        if (t.state == TrialState::Complete && t.value && std::isfinite(*t.value)) used.push_back(&t);
    if (used.size() < kMinTrials) return {};

    std::set<std::string> keys;
    for (const TrialRecord* t : used)
        for (const auto& [key, value] : t->params) keys.insert(key);
    std::vector<ParamImportance> out;
    for (const auto& key : keys) out.push_back({key, 0.0});
    if (out.empty()) return out;

    const size_t n = used.size();
    std::vector<double> y(n);
    for (size_t i = 0; i < n; ++i) y[i] = *used[i]->value;
    const auto [lo, hi] = std::minmax_element(y.begin(), y.end());
    if (*lo == *hi) return out;  // nothing to explain: every parameter gets 0
    const double mean = std::accumulate(y.begin(), y.end(), 0.0) / double(n);
    double total = 0;
    for (double v : y) total += (v - mean) * (v - mean);

    const auto scales = scalesOf(study);
    double sum = 0;
    for (auto& p : out) {
        std::vector<std::string> values(n);
        for (size_t i = 0; i < n; ++i) {
            const auto it = used[i]->params.find(p.key);
            if (it != used[i]->params.end()) values[i] = it->second;
        }
        const auto sc = scales.find(p.key);
        const std::vector<size_t> group = groupsOf(values, sc == scales.end() ? KeyScale{} : sc->second);
        const size_t groups = *std::max_element(group.begin(), group.end()) + 1;
        std::vector<double> gsum(groups, 0.0), gcount(groups, 0.0);
        for (size_t i = 0; i < n; ++i) {
            gsum[group[i]] += y[i];
            gcount[group[i]] += 1;
        }
        double between = 0;
        for (size_t g = 0; g < groups; ++g) {
            if (gcount[g] == 0) continue;
            const double d = gsum[g] / gcount[g] - mean;
            between += gcount[g] * d * d;
        }
        p.importance = std::clamp(between / total, 0.0, 1.0);
        sum += p.importance;
    }
    if (sum > 0)
        for (auto& p : out) p.importance /= sum;
    std::stable_sort(out.begin(), out.end(), [](const ParamImportance& a, const ParamImportance& b) {
        return a.importance > b.importance;
    });
    return out;
}

}  // namespace lathe::core

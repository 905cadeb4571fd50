#pragma once
// Live metric points for the per-run views (loss scale, communication): every point of every
// run is kept, so a run selected mid-training gets what the store writer has not committed yet,
// and the shown run's new points are staged for the next coalesced flush.
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/store.h"

namespace lathe::widgets {

class LiveSeries {
public:
    using Points = std::vector<core::MetricPoint>;

    /// A new run is shown: nothing is loaded or staged any more.
    void resetShown() {
        m_lastStep.clear();
        m_staged.clear();
        m_stagedCount = 0;
    }

    /// The store's points of (run, key), topped up with live ones it has not committed yet;
    /// live points up to the last one returned count as loaded.
    Points load(const core::Store& store, int64_t runId, const std::string& key) {
        Points points = store.metrics(runId, key);
        auto live = m_live.find({runId, key});
        if (live != m_live.end()) {
            const int64_t last = points.empty() ? kNone : points.back().step;
            for (const auto& p : live->second)
                if (p.step > last) points.push_back(p);
        }
        m_lastStep[key] = points.empty() ? kNone : points.back().step;
        return points;
    }

    /// Keys with live points of a run.
    std::vector<std::string> liveKeys(int64_t runId) const {
        std::vector<std::string> keys;
        for (const auto& [k, points] : m_live)
            if (k.first == runId) keys.push_back(k.second);
        return keys;
    }

    /// Keeps the metric events whose key `wanted` accepts; stages the shown run's new ones.
    template <typename Wanted>
    void add(int64_t runId, int64_t shownRunId, const std::vector<core::Event>& events, Wanted wanted) {
        for (const auto& e : events) {
            if (e.type != core::Event::Type::Metric || !wanted(e.key)) continue;
            core::MetricPoint p;
            p.step = e.step;
            p.value = e.value;
            p.wallTime = e.wallTime;
            m_live[{runId, e.key}].push_back(p);
            if (runId != shownRunId) continue;
            auto [it, inserted] = m_lastStep.try_emplace(e.key, kNone);
            if (p.step <= it->second) continue;  // already loaded from the store
            it->second = p.step;
            m_staged[e.key].push_back(p);
            ++m_stagedCount;
        }
    }

    void forget(int64_t runId) {
        for (auto it = m_live.begin(); it != m_live.end();) {
            if (it->first.first == runId)
                it = m_live.erase(it);
            else
                ++it;
        }
    }

    int stagedCount() const { return m_stagedCount; }

    /// The staged points by key, leaving nothing staged.
    std::map<std::string, Points> takeStaged() {
        std::map<std::string, Points> out;
        out.swap(m_staged);
        m_stagedCount = 0;
        return out;
    }

private:
    static constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
    std::map<std::string, int64_t> m_lastStep;  // per key: live points at or before are loaded
    std::map<std::string, Points> m_staged;
    int m_stagedCount = 0;
    std::map<std::pair<int64_t, std::string>, Points> m_live;
};

}  // namespace lathe::widgets

#include "lathe/core/profile_analysis.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <unordered_map>

namespace lathe::core {

namespace {
// Position of `step` in its schedule cycle, or -1 once all cycles are done.
int64_t cyclePosition(const ProfileSchedule& s, int64_t step) {
    const int64_t len = s.wait + s.warmup + s.active;
    if (len <= 0 || step < 1) return -1;
    const int64_t idx = step - 1;
    if (s.repeat > 0 && idx / len >= s.repeat) return -1;
    return idx % len;
}
}  // namespace

bool ProfileSchedule::attached(int64_t step) const {
    const int64_t pos = cyclePosition(*this, step);
    return pos >= wait;
}

bool ProfileSchedule::recording(int64_t step) const {
    const int64_t pos = cyclePosition(*this, step);
    return pos >= wait + warmup;
}

std::vector<OpSummary> topOps(const std::vector<ProfileSpan>& spans, int top) {
    // Per thread, ops sorted by start (longer first on ties) nest by interval: a stack of open
    // ops gives each op its parent, whose self time loses the child's duration.
    std::map<int64_t, std::vector<const ProfileSpan*>> byThread;
    for (const auto& s : spans)
        if (s.kind == ProfileSpan::Kind::Op) byThread[s.thread].push_back(&s);
    std::unordered_map<std::string, OpSummary> agg;
    for (auto& [thread, ops] : byThread) {
        std::sort(ops.begin(), ops.end(), [](const ProfileSpan* a, const ProfileSpan* b) {
            return a->startNs != b->startNs ? a->startNs < b->startNs : a->durationNs > b->durationNs;
        });
        std::vector<int64_t> childNs(ops.size(), 0), childCudaNs(ops.size(), 0);
        std::vector<size_t> stack;
        for (size_t i = 0; i < ops.size(); ++i) {
            const auto* op = ops[i];
            while (!stack.empty() &&
                   ops[stack.back()]->startNs + ops[stack.back()]->durationNs <= op->startNs)
                stack.pop_back();
            if (!stack.empty()) {
                childNs[stack.back()] += op->durationNs;
                childCudaNs[stack.back()] += std::max<int64_t>(0, op->cudaNs);
            }
            stack.push_back(i);
        }
        for (size_t i = 0; i < ops.size(); ++i) {
            auto& a = agg[ops[i]->name];
            a.name = ops[i]->name;
            a.calls += 1;
            a.totalNs += ops[i]->durationNs;
            a.selfNs += std::max<int64_t>(0, ops[i]->durationNs - childNs[i]);
            if (ops[i]->cudaNs >= 0) {  // device time nests as the host intervals do
                a.cudaTotalNs = std::max<int64_t>(0, a.cudaTotalNs) + ops[i]->cudaNs;
                a.cudaSelfNs = std::max<int64_t>(0, a.cudaSelfNs) +
                               std::max<int64_t>(0, ops[i]->cudaNs - childCudaNs[i]);
            }
        }
    }
    std::vector<OpSummary> out;
    int64_t selfSum = 0;
    for (auto& [name, a] : agg) {
        selfSum += a.selfNs;
        out.push_back(a);
    }
    for (auto& a : out)
        a.share = selfSum > 0 ? static_cast<double>(a.selfNs) / static_cast<double>(selfSum) : 0.0;
    std::sort(out.begin(), out.end(), [](const OpSummary& a, const OpSummary& b) {
        return a.selfNs != b.selfNs ? a.selfNs > b.selfNs : a.name < b.name;
    });
    if (top > 0 && out.size() > static_cast<size_t>(top)) out.resize(static_cast<size_t>(top));
    return out;
}

std::vector<PhaseSummary> phasesByStep(const std::vector<ProfileSpan>& spans) {
    std::map<int64_t, PhaseSummary> steps;
    for (const auto& s : spans) {
        if (s.kind != ProfileSpan::Kind::Phase || spanStage(s) != 0) continue;
        auto& ps = steps[s.step];
        ps.step = s.step;
        auto it = std::find_if(ps.phases.begin(), ps.phases.end(),
                               [&](const auto& p) { return p.first == s.name; });
        if (it == ps.phases.end())
            ps.phases.emplace_back(s.name, s.durationNs);
        else
            it->second += s.durationNs;
    }
    std::vector<PhaseSummary> out;
    for (auto& [step, ps] : steps) out.push_back(std::move(ps));
    return out;
}

void writeChromeTrace(const std::vector<ProfileSpan>& spans, std::ostream& out,
                      const std::string& processName) {
    using nlohmann::json;
    json events = json::array();
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", processName}}}});
    std::map<int64_t, bool> threads;
    for (const auto& s : spans) threads[s.thread] = true;
    for (const auto& [t, unused] : threads)
        events.push_back(
            {{"name", "thread_name"},
             {"ph", "M"},
             {"pid", 1},
             {"tid", t},
             {"args", {{"name", t == 0 ? std::string("training") : "thread " + std::to_string(t)}}}});
    // Microseconds from the first span: absolute epoch times would not keep nanosecond fractions
    // in a double, and nesting must survive the unit change.
    int64_t origin = spans.empty() ? 0 : spans.front().startNs;
    for (const auto& s : spans) origin = std::min(origin, s.startNs);
    for (const auto& s : spans) {
        json args{{"step", s.step}};
        if (!s.shapes.empty()) args["shapes"] = s.shapes;
        if (s.cudaNs >= 0) args["cuda_us"] = static_cast<double>(s.cudaNs) / 1000.0;
        events.push_back({{"name", s.name},
                          {"cat", s.kind == ProfileSpan::Kind::Phase ? "phase" : "op"},
                          {"ph", "X"},
                          {"ts", static_cast<double>(s.startNs - origin) / 1000.0},
                          {"dur", static_cast<double>(s.durationNs) / 1000.0},
                          {"pid", 1},
                          {"tid", s.thread},
                          {"args", args}});
    }
    // Run names are free text: invalid UTF-8 is replaced rather than failing the export.
    out << json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump(-1, ' ', false,
                                                                         json::error_handler_t::replace)
        << '\n';
}

}  // namespace lathe::core

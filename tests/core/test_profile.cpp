// The profiler: schedule, recorded spans, top-ops summary and Chrome trace export.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <atomic>

#include "lathe/core/error.h"
#include "lathe/core/profile_analysis.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;

namespace {

ProfileSpan op(const char* name, int64_t start, int64_t dur, int64_t thread = 0, int64_t step = 1) {
    ProfileSpan s;
    s.name = name;
    s.startNs = start;
    s.durationNs = dur;
    s.thread = thread;
    s.step = step;
    return s;
}

// Checks that complete events nest per thread: each one lies inside the enclosing open one.
void checkNesting(const nlohmann::json& events) {
    std::map<int64_t, std::vector<std::pair<double, double>>> byTid;
    for (const auto& e : events) {
        if (e.at("ph") != "X") continue;
        byTid[e.at("tid").get<int64_t>()].emplace_back(e.at("ts").get<double>(), e.at("dur").get<double>());
    }
    for (auto& [tid, spans] : byTid) {
        std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) {
            return a.first != b.first ? a.first < b.first : a.second > b.second;
        });
        std::vector<double> openEnds;
        for (const auto& [ts, dur] : spans) {
            while (!openEnds.empty() && openEnds.back() <= ts) openEnds.pop_back();
            if (!openEnds.empty()) {
                INFO("tid " << tid << " span at " << ts << " ends after its parent");
                CHECK(ts + dur <= openEnds.back() + 1e-9);
            }
            openEnds.push_back(ts + dur);
        }
    }
}

}  // namespace

TEST_CASE("the profiler schedule waits, warms up, records and repeats", "[profile]") {
    ProfileSchedule s{2, 1, 3, 2};
    std::string recorded, attached;
    for (int step = 1; step <= 14; ++step) {
        recorded += s.recording(step) ? 'R' : '.';
        attached += s.attached(step) ? 'A' : '.';
    }
    CHECK(recorded == "...RRR...RRR..");
    CHECK(attached == "..AAAA..AAAA..");
    ProfileSchedule forever{0, 0, 1, 0};
    CHECK(forever.recording(100000));
}

TEST_CASE("top ops split self from total time by nesting, per thread", "[profile]") {
    // thread 0: linear [0,100) contains addmm [10,70) which contains copy [20,30); thread 1: copy [5,25)
    std::vector<ProfileSpan> spans{op("aten::linear", 0, 100), op("aten::addmm", 10, 60),
                                   op("aten::copy_", 20, 10), op("aten::copy_", 5, 20, 1)};
    ProfileSpan phase = op("forward", 0, 120);
    phase.kind = ProfileSpan::Kind::Phase;
    spans.push_back(phase);  // phases are not ops
    const auto ops = topOps(spans);
    REQUIRE(ops.size() == 3);
    std::map<std::string, OpSummary> by;
    for (const auto& o : ops) by[o.name] = o;
    CHECK(by["aten::linear"].selfNs == 40);
    CHECK(by["aten::linear"].totalNs == 100);
    CHECK(by["aten::addmm"].selfNs == 50);
    CHECK(by["aten::copy_"].selfNs == 30);
    CHECK(by["aten::copy_"].calls == 2);
    CHECK(ops[0].name == "aten::addmm");  // sorted by self time
    // Self times add up to the time covered by top-level ops (100 + 20).
    int64_t selfSum = 0;
    double shareSum = 0;
    for (const auto& o : ops) selfSum += o.selfNs, shareSum += o.share;
    CHECK(selfSum == 120);
    CHECK(shareSum == Approx(1.0));
    CHECK(topOps(spans, 1).size() == 1);
}

TEST_CASE("device times of ops measured on a GPU split into self and total like host times", "[profile]") {
    // linear [0,100) with 80 ns on the device contains addmm [10,70) with 60, which contains
    // copy [20,30) with 5; a second addmm has no device time (-1: not measured).
    std::vector<ProfileSpan> spans{op("aten::linear", 0, 100), op("aten::addmm", 10, 60),
                                   op("aten::copy_", 20, 10), op("aten::addmm", 200, 10)};
    spans[0].cudaNs = 80;
    spans[1].cudaNs = 60;
    spans[2].cudaNs = 5;
    std::map<std::string, OpSummary> by;
    for (const auto& o : topOps(spans)) by[o.name] = o;
    CHECK(by["aten::linear"].cudaTotalNs == 80);
    CHECK(by["aten::linear"].cudaSelfNs == 20);
    CHECK(by["aten::addmm"].cudaTotalNs == 60);
    CHECK(by["aten::addmm"].cudaSelfNs == 55);
    CHECK(by["aten::copy_"].cudaSelfNs == 5);
    // Host-only ops report none.
    std::vector<ProfileSpan> host{op("aten::relu", 0, 10)};
    CHECK(topOps(host)[0].cudaTotalNs == -1);
    CHECK(topOps(host)[0].cudaSelfNs == -1);
}

TEST_CASE("a profiled run stores op spans and phases by schedule, and its trace is valid", "[profile]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 2;  // 46 steps
    spec.profile = true;
    spec.profileWait = 2;
    spec.profileWarmup = 1;
    spec.profileActive = 4;
    spec.profileRepeat = 2;
    const auto rec = trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    const auto spans = store.profileSpans(rec.runId);
    REQUIRE(store.profileSpanCount(rec.runId) == static_cast<int64_t>(spans.size()));
    std::set<int64_t> steps;
    for (const auto& s : spans) steps.insert(s.step);
    CHECK(steps == std::set<int64_t>{4, 5, 6, 7, 11, 12, 13, 14});

    const auto phases = phasesByStep(spans);
    REQUIRE(phases.size() == 8);
    std::vector<std::string> names;
    for (const auto& [name, ns] : phases[0].phases) names.push_back(name);
    CHECK(names == std::vector<std::string>{"data", "forward", "backward", "optimizer"});

    bool sawAddmm = false, sawBackward = false, sawShapes = false;
    for (const auto& s : spans) {
        if (s.kind != ProfileSpan::Kind::Op) continue;
        sawAddmm |= s.name == "aten::addmm";
        sawBackward |= s.name.find("Backward") != std::string::npos;
        sawShapes |= s.name == "aten::addmm" && s.shapes.find("[64, 64]") != std::string::npos;
    }
    CHECK(sawAddmm);
    CHECK(sawBackward);
    CHECK(sawShapes);
    // Ops the trainer's thread (lane 0) runs inside a phase are that phase's work: their self
    // times, nested correctly, cannot add up to more than the phases' time. Ops between phases
    // (the loss read-out, the accuracy tally) and ops on LibTorch's pool threads are not part of
    // any phase, so they are left out of the comparison.
    std::vector<ProfileSpan> phaseSpans, inPhase;
    for (const auto& s : spans)
        if (s.kind == ProfileSpan::Kind::Phase) phaseSpans.push_back(s);
    for (const auto& s : spans) {
        if (s.kind != ProfileSpan::Kind::Op || s.thread != 0) continue;
        for (const auto& ph : phaseSpans)
            if (s.startNs >= ph.startNs && s.startNs < ph.startNs + ph.durationNs) {
                inPhase.push_back(s);
                break;
            }
    }
    int64_t opSelf = 0, phaseTime = 0;
    for (const auto& o : topOps(inPhase)) opSelf += o.selfNs;
    for (const auto& p : phases)
        for (const auto& [name, ns] : p.phases) phaseTime += ns;
    CHECK(opSelf > 0);
    CHECK(opSelf <= phaseTime);

    std::stringstream trace;
    writeChromeTrace(spans, trace, "test");
    const auto j = nlohmann::json::parse(trace.str());
    const auto& events = j.at("traceEvents");
    size_t complete = 0;
    for (const auto& e : events)
        if (e.at("ph") == "X") {
            ++complete;
            CHECK(e.at("dur").get<double>() >= 0);
            CHECK(e.contains("name"));
        }
    CHECK(complete == spans.size());
    checkNesting(events);
}

TEST_CASE("an unprofiled run has no spans, and profile spans travel through the event stream", "[profile]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 1;
    const auto rec = trainAndRecord(store, spec, {});
    CHECK(store.profileSpanCount(rec.runId) == 0);
    ProfileSpan s = op("aten::mm", 5, 7, 2, 9);
    s.shapes = "[2, 3], [3, 4]";
    s.cudaNs = 11;
    const auto back = decodeEvent(encodeEvent(Event::profileSpan(s)));
    REQUIRE(back.type == Event::Type::Span);
    CHECK(back.span.name == "aten::mm");
    CHECK(back.span.shapes == s.shapes);
    CHECK(back.span.thread == 2);
    CHECK(back.span.step == 9);
    CHECK(back.span.startNs == 5);
    CHECK(back.span.durationNs == 7);
    CHECK(back.span.cudaNs == 11);
}

TEST_CASE("a resumed profiled run replaces the replayed steps' spans instead of overlapping them",
          "[profile]") {
    TempDir dir;
    Store store(dir.file("lathe.db"));
    RunSpec spec;
    spec.epochs = 2;
    spec.profile = true;
    spec.profileWait = 0;
    spec.profileWarmup = 0;
    spec.profileActive = 1;
    spec.profileRepeat = 0;  // every step
    std::atomic<bool> stop{false};
    RecordOptions first;
    first.stop = &stop;
    int64_t seenSteps = 0;
    const auto partial = trainAndRecord(store, spec, first, [&](const Event& e) {
        if (e.type == Event::Type::Checkpoint) stop = true;  // after epoch 1 (23 steps)
        if (e.type == Event::Type::Metric && e.key == "train/grad_norm") seenSteps = e.step;
    });
    REQUIRE(partial.result.status == lathe::core::RunStatus::Stopped);
    RecordOptions again;
    again.resumeRunId = partial.runId;
    REQUIRE(trainAndRecord(store, spec, again).result.status == lathe::core::RunStatus::Completed);
    const auto phases = phasesByStep(store.profileSpans(partial.runId));
    REQUIRE(phases.size() == 46);
    for (const auto& p : phases) {
        INFO("step " << p.step);
        CHECK(p.phases.size() == 4);  // one of each phase: no duplicates from the stopped attempt
    }
    // Later steps start later, across the resume too.
    const auto spans = store.profileSpans(partial.runId);
    std::map<int64_t, int64_t> firstStart;
    for (const auto& s : spans) firstStart.try_emplace(s.step, s.startNs);
    int64_t prev = 0;
    for (const auto& [step, start] : firstStart) {
        CHECK(start > prev);
        prev = start;
    }
}

TEST_CASE("span records out of range are refused", "[profile][events]") {
    CHECK_THROWS_AS(
        decodeEvent(R"({"v":2,"type":"span","kind":"op","name":"x","step":1,"start_ns":5,"dur_ns":-3})"),
        EventStreamError);
    CHECK_THROWS_AS(
        decodeEvent(
            R"({"v":2,"type":"span","kind":"op","name":"x","step":1,"start_ns":5,"dur_ns":3,"thread":99999})"),
        EventStreamError);
    CHECK_THROWS_AS(
        decodeEvent(R"({"v":2,"type":"span","kind":"blob","name":"x","step":1,"start_ns":5,"dur_ns":3})"),
        EventStreamError);
    CHECK(decodeEvent(R"({"v":1,"type":"status","status":"running"})").text ==
          "running");  // version 1 still reads
}

// The rollout controller's pure parts (core/include/lathe/core/rollout.h): the command's values,
// per-version windows from two /metrics scrapes, the two-proportion and rank tests, the verdict;
// and the workspace's rollout records.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/registry.h"
#include "lathe/core/rollout.h"
#include "temp_dir.h"

using namespace lathe::core;

namespace {

const std::vector<double> kBounds{0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
                                  0.05,   0.075, 0.1,   0.15,  0.25,  0.5,    1,    2.5,   5,    10};

// A window of `n` requests (`errors` of them failed) whose latencies are spread evenly over
// [lowS, highS].
VariantWindow window(int64_t version, double n, double errors, double lowS, double highS) {
    VariantWindow w;
    w.version = version;
    w.requests = n;
    w.errors = errors;
    std::vector<double> lat;
    for (int i = 0; i < static_cast<int>(n); ++i) lat.push_back(lowS + (highS - lowS) * (i + 0.5) / n);
    for (double b : kBounds) {
        double c = 0;
        for (double x : lat) c += x <= b;
        w.latency.emplace_back(b, c);
    }
    w.latency.emplace_back(std::numeric_limits<double>::infinity(), n);
    return w;
}

Rollout plan() {
    Rollout r;
    r.model = "digits";
    r.baseline = 1;
    r.candidate = 2;
    r.weightBp = 2500;
    r.minRequests = 200;
    r.maxErrorRate = 0.01;
    return r;
}

template <typename F>
std::string errorOf(F f) {
    try {
        f();
    } catch (const ConfigError& ex) {
        return ex.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("rollout steps, intervals and rates are parsed strictly", "[rollout]") {
    CHECK(parseRolloutSteps("5,25,50,100") == std::vector<int32_t>{500, 2500, 5000, 10000});
    CHECK(parseRolloutSteps(" 2.5%, 10 ,100") == std::vector<int32_t>{250, 1000, 10000});
    CHECK_THAT(errorOf([] { parseRolloutSteps("0,50"); }), Catch::Contains("out of 1..100"));
    CHECK_THAT(errorOf([] { parseRolloutSteps("5,101"); }), Catch::Contains("out of 1..100"));
    CHECK_THAT(errorOf([] { parseRolloutSteps("50,25"); }), Catch::Contains("must rise"));
    CHECK_THAT(errorOf([] { parseRolloutSteps("5,5"); }), Catch::Contains("must rise"));
    CHECK_THAT(errorOf([] { parseRolloutSteps("5,,50"); }), Catch::Contains("not a percentage"));
    CHECK_THAT(errorOf([] { parseRolloutSteps("five"); }), Catch::Contains("not a percentage"));
    CHECK_THAT(errorOf([] { parseRolloutSteps(""); }), Catch::Contains("empty"));

    CHECK(parseDurationSeconds("10m") == 600);
    CHECK(parseDurationSeconds("72h") == 72 * 3600);
    CHECK(parseDurationSeconds("1d") == 86400);
    CHECK(parseDurationSeconds("2.5s") == 2.5);
    CHECK(parseDurationSeconds("45") == 45);
    for (const char* bad : {"0", "-1m", "10x", "", "m", "nan", "inf", "400d"})
        CHECK_THAT(errorOf([&] { parseDurationSeconds(bad); }),
                   Catch::Contains("--interval must be a duration"));

    CHECK(parseRate("1%") == Approx(0.01));
    CHECK(parseRate("0.5%") == Approx(0.005));
    CHECK(parseRate("0.02") == Approx(0.02));
    for (const char* bad : {"0%", "150%", "2", "-1%", "x", ""})
        CHECK_THAT(errorOf([&] { parseRate(bad); }), Catch::Contains("--max-error-rate must be a share"));
}

TEST_CASE("the two-proportion test finds a higher error rate and nothing where there is none", "[rollout]") {
    CHECK(twoProportionPValue(100, 1000, 0, 1000) < 1e-9);
    CHECK(twoProportionPValue(0, 1000, 100, 1000) > 0.999);
    const double same = twoProportionPValue(10, 1000, 10, 1000);
    CHECK(same > 0.4);
    CHECK(same < 0.6);
    CHECK(twoProportionPValue(0, 1000, 0, 1000) == 1.0);  // both clean: nothing to tell apart
    CHECK(twoProportionPValue(1, 0, 0, 10) == 1.0);
    // Small samples stay inconclusive: 2 of 20 against 0 of 20 is not proof.
    CHECK(twoProportionPValue(2, 20, 0, 20) > 0.05);
}

TEST_CASE("the rank test on latency histograms finds a slower variant and only that", "[rollout]") {
    const auto base = window(1, 1000, 0, 0.0002, 0.0018);
    CHECK(rankTestPValue(window(2, 1000, 0, 0.001, 0.009), base) < 1e-9);   // 5x slower
    CHECK(rankTestPValue(base, window(2, 1000, 0, 0.001, 0.009)) > 0.999);  // faster
    const double same = rankTestPValue(window(2, 800, 0, 0.0002, 0.0018), base);
    CHECK(same > 0.2);
    CHECK(same < 0.8);
    // Everything in one bucket: no ranking is possible, never "slower".
    CHECK(rankTestPValue(window(2, 500, 0, 0.0001, 0.0004), window(1, 500, 0, 0.0001, 0.0004)) == 1.0);
    CHECK(rankTestPValue(VariantWindow{}, base) == 1.0);
}

TEST_CASE("a window per version comes from two scrapes, and a restart voids it", "[rollout]") {
    const std::string start = R"(lathe_requests_total{model="digits",version="1",code="200"} 100
lathe_requests_total{model="digits",version="2",code="200"} 10
lathe_requests_total{model="other",version="2",code="200"} 5000
lathe_request_duration_seconds_bucket{model="digits",version="1",le="0.001"} 90
lathe_request_duration_seconds_bucket{model="digits",version="1",le="+Inf"} 100
lathe_request_duration_seconds_bucket{model="digits",version="2",le="0.001"} 10
lathe_request_duration_seconds_bucket{model="digits",version="2",le="+Inf"} 10
)";
    const std::string end = R"(lathe_requests_total{model="digits",version="1",code="200"} 400
lathe_requests_total{model="digits",version="2",code="200"} 90
lathe_requests_total{model="digits",version="2",code="500"} 20
lathe_requests_total{model="digits",version="2",code="503"} 5
lathe_requests_total{model="digits",version="2",code="400"} 5
lathe_requests_total{model="other",version="2",code="200"} 9000
lathe_request_duration_seconds_bucket{model="digits",version="1",le="0.001"} 380
lathe_request_duration_seconds_bucket{model="digits",version="1",le="+Inf"} 400
lathe_request_duration_seconds_bucket{model="digits",version="2",le="0.001"} 30
lathe_request_duration_seconds_bucket{model="digits",version="2",le="+Inf"} 130
)";
    const auto w = variantWindows("digits", parsePrometheusText(start), parsePrometheusText(end));
    REQUIRE(w.size() == 2);
    CHECK(w.at(1).requests == 300);
    CHECK(w.at(1).errors == 0);
    CHECK(w.at(2).requests == 110);  // 80 + 20 + 5 + 5: every answer, 4xx included
    CHECK(w.at(2).errors == 25);     // 5xx only
    REQUIRE(w.at(2).latency.size() == 2);
    CHECK(w.at(2).latency[0] == std::make_pair(0.001, 20.0));
    CHECK(std::isinf(w.at(2).latency[1].first));
    CHECK(w.at(2).latency[1].second == 120);
    CHECK(w.at(1).p99Ms() ==
          Approx(1.0));  // 10 of 300 above 1 ms: the highest finite bound, as Prometheus says
    // The server restarted: its counters went down, so nothing of this window can be judged.
    CHECK(variantWindows("digits", parsePrometheusText(end), parsePrometheusText(start)).empty());
}

TEST_CASE("a rollout window is judged: too little data holds, errors and latency roll back", "[rollout]") {
    const auto p = plan();
    const auto base = window(1, 3000, 0, 0.0002, 0.0018);

    SECTION("no traffic to the candidate holds and says so, never passes") {
        const auto v = judgeRolloutWindow(p, base, VariantWindow{});
        CHECK(v.kind == "hold");
        CHECK(v.extendWindow);
        CHECK_THAT(v.reason, Catch::Contains("no traffic"));
    }
    SECTION("a small sample holds with its count") {
        const auto v = judgeRolloutWindow(p, base, window(2, 57, 0, 0.0002, 0.0018));
        CHECK(v.kind == "hold");
        CHECK(v.extendWindow);
        CHECK_THAT(v.reason, Catch::Contains("57 of the 200"));
    }
    SECTION("a baseline without enough requests holds while it still serves some") {
        const auto v =
            judgeRolloutWindow(p, window(1, 20, 0, 0.0002, 0.0018), window(2, 1000, 0, 0.0002, 0.0018));
        CHECK(v.kind == "hold");
        CHECK_THAT(v.reason, Catch::Contains("baseline has answered 20"));
    }
    SECTION("the same behaviour passes") {
        const auto v = judgeRolloutWindow(p, base, window(2, 1000, 0, 0.0002, 0.0018));
        CHECK(v.kind == "healthy");
        CHECK(v.numbers.at("candidate_requests") == 1000);
        CHECK(v.numbers.at("candidate_error_rate") == 0);
    }
    SECTION("10% failures are unhealthy, with the figures") {
        const auto v = judgeRolloutWindow(p, base, window(2, 1000, 100, 0.0002, 0.0018));
        CHECK(v.kind == "unhealthy");
        CHECK_THAT(v.reason, Catch::Contains("error rate 10.00% vs 0.00%"));
        CHECK(v.numbers.at("error_p") < 1e-6);
    }
    SECTION("5x slower is unhealthy by the rank test and the relative P99 limit") {
        const auto v = judgeRolloutWindow(p, base, window(2, 1000, 0, 0.001, 0.009));
        CHECK(v.kind == "unhealthy");
        CHECK_THAT(v.reason, Catch::Contains("P99"));
        CHECK(v.numbers.at("latency_p") < 1e-6);
    }
    SECTION("an absolute P99 limit is applied when given") {
        auto q = p;
        q.maxP99Ms = 20;
        CHECK(judgeRolloutWindow(q, base, window(2, 1000, 0, 0.001, 0.009)).kind == "healthy");
        q.maxP99Ms = 5;
        CHECK(judgeRolloutWindow(q, base, window(2, 1000, 0, 0.001, 0.009)).kind == "unhealthy");
    }
    SECTION("a limit both versions break is not the candidate's fault: hold") {
        const auto v =
            judgeRolloutWindow(p, window(1, 3000, 150, 0.0002, 0.0018), window(2, 1000, 50, 0.0002, 0.0018));
        CHECK(v.kind == "hold");
        CHECK_FALSE(v.extendWindow);
        CHECK_THAT(v.reason, Catch::Contains("not worse"));
    }
    SECTION("at 100% the candidate is judged on the limits alone") {
        auto q = p;
        q.weightBp = 10000;
        CHECK(judgeRolloutWindow(q, VariantWindow{}, window(2, 1000, 0, 0.0002, 0.0018)).kind == "healthy");
        CHECK(judgeRolloutWindow(q, VariantWindow{}, window(2, 1000, 30, 0.0002, 0.0018)).kind ==
              "unhealthy");
    }
}

TEST_CASE("the workspace keeps one active rollout per model and folds repeated holds",
          "[rollout][registry]") {
    lathe::test::TempDir dir;
    Registry registry(dir.file("ws.db"));
    Rollout r = plan();
    r.stepsBp = {500, 10000};
    r.intervalS = 2;
    r.userParameter = "user_id";
    r.weightBp = 500;
    const int64_t id = registry.createRollout(r);
    CHECK_THAT(errorOf([&] { registry.createRollout(r); }), Catch::Contains("under way"));
    Rollout other = r;
    other.model = "mnist";
    CHECK(registry.createRollout(other) > id);  // another model's is its own

    auto got = registry.activeRollout("digits");
    REQUIRE(got);
    CHECK(got->id == id);
    CHECK(got->stepsBp == std::vector<int32_t>{500, 10000});
    CHECK(got->intervalS == 2);
    CHECK(got->userParameter == "user_id");
    CHECK(got->state == "running");

    RolloutDecision d;
    d.rolloutId = id;
    d.kind = "hold";
    d.weightBp = 500;
    d.reason = "the candidate has answered 3 of the 200";
    registry.addRolloutDecision(d);
    d.reason = "the candidate has answered 9 of the 200";
    registry.addRolloutDecision(d);
    d.kind = "healthy";
    registry.addRolloutDecision(d);
    d.kind = "hold";
    registry.addRolloutDecision(d);
    auto decisions = registry.rolloutDecisions(id);
    REQUIRE(decisions.size() == 3);
    CHECK(decisions[0].repeats == 2);
    CHECK(decisions[0].reason == "the candidate has answered 9 of the 200");
    CHECK(decisions[1].kind == "healthy");
    CHECK(decisions[2].repeats == 1);

    got->state = "rolled_back";
    got->endedAt = nowSeconds();
    got->endReason = "v2 rolled back";
    registry.updateRollout(*got);
    CHECK_FALSE(registry.activeRollout("digits"));
    const int64_t next = registry.createRollout(r);  // the model is free again
    CHECK(registry.rollouts("digits").size() == 2);
    CHECK(registry.rollouts("digits").front().id == next);
    registry.deleteRollout(next);
    CHECK(registry.rollouts("digits").size() == 1);
    CHECK(registry.rollout(id)->endReason == "v2 rolled back");
}

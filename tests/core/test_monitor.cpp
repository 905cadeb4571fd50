// Prometheus text parsing, histogram quantiles, interval figures and alert rules: the pure logic
// of the serving monitor (the scraper's I/O is in test_scraper.cpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "lathe/core/error.h"
#include "lathe/core/http_client.h"
#include "lathe/core/monitor.h"
#include "lathe/core/scraper.h"

using namespace lathe::core;

namespace {

const PromSample* find(const std::vector<PromSample>& v, const std::string& name,
                       const std::map<std::string, std::string>& labels = {}) {
    for (const auto& s : v) {
        if (s.name != name) continue;
        bool all = true;
        for (const auto& [k, val] : labels) {
            const auto it = s.labels.find(k);
            all = all && it != s.labels.end() && it->second == val;
        }
        if (all) return &s;
    }
    return nullptr;
}

std::string message(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

IntervalStats sample(double t, std::map<std::string, double> values) {
    return IntervalStats{t, 1, std::move(values)};
}

}  // namespace

TEST_CASE("Prometheus text: samples, labels, special values, comments and timestamps", "[monitor]") {
    const std::string text =
        "# HELP lathe_requests_total Requests answered\n"
        "# TYPE lathe_requests_total counter\n"
        "lathe_requests_total{model=\"digits\",version=\"1\",code=\"200\"} 42\n"
        "lathe_requests_total{code=\"503\", model=\"digits\" , version=\"1\",} 3 1700000000000\n"
        "\n"
        "   \t\n"
        "process_cpu_seconds_total 1.5e1\n"
        "  indented_gauge\t-0.25\r\n"
        "empty_labels{} +Inf\n"
        "nan_gauge NaN\n"
        "neg_inf -Inf\n"
        "plus_sign +7\n"
        "namespaced:metric_name 1 -5\n"
        "#comment without space\n"
        "last_line_without_newline 0";
    const auto s = parsePrometheusText(text);
    REQUIRE(s.size() == 10);
    const auto* ok = find(s, "lathe_requests_total", {{"code", "200"}});
    REQUIRE(ok);
    CHECK(ok->value == 42);
    CHECK(ok->labels ==
          std::map<std::string, std::string>{{"model", "digits"}, {"version", "1"}, {"code", "200"}});
    const auto* err = find(s, "lathe_requests_total", {{"code", "503"}});
    REQUIRE(err);
    CHECK(err->value == 3);
    CHECK(err->labels.size() == 3);
    CHECK(find(s, "process_cpu_seconds_total")->value == 15);
    CHECK(find(s, "indented_gauge")->value == -0.25);
    CHECK(find(s, "empty_labels")->labels.empty());
    CHECK(std::isinf(find(s, "empty_labels")->value));
    CHECK(find(s, "empty_labels")->value > 0);
    CHECK(std::isnan(find(s, "nan_gauge")->value));
    CHECK(find(s, "neg_inf")->value == -std::numeric_limits<double>::infinity());
    CHECK(find(s, "plus_sign")->value == 7);
    CHECK(find(s, "namespaced:metric_name")->value == 1);
    CHECK(find(s, "last_line_without_newline")->value == 0);
    CHECK(parsePrometheusText("").empty());
    CHECK(parsePrometheusText("# only a comment\n\n").empty());
}

TEST_CASE("Prometheus text: label values are unescaped", "[monitor]") {
    const auto s =
        parsePrometheusText(R"(m{path="C:\\dir\\x",msg="say \"hi\"\nbye",brace="a}b,c=\"d\"",empty=""} 1)"
                            "\n");
    REQUIRE(s.size() == 1);
    CHECK(s[0].labels.at("path") == "C:\\dir\\x");
    CHECK(s[0].labels.at("msg") == "say \"hi\"\nbye");
    CHECK(s[0].labels.at("brace") == "a}b,c=\"d\"");
    CHECK(s[0].labels.at("empty").empty());
}

TEST_CASE("Prometheus text: malformed lines are refused with their line number", "[monitor]") {
    const char* bad[] = {
        "m{a=\"x} 1",            // unterminated value
        "m{a=x} 1",              // unquoted value
        "m{a=\"x\" b=\"y\"} 1",  // missing comma
        "m{a=\"x\"",             // unterminated label set
        "m{a=\"\\q\"} 1",        // unknown escape
        "m{a=\"x\\",             // escape at the end
        "m{=\"x\"} 1",           // no label name
        "m{a:b=\"x\"} 1",        // ':' is not allowed in label names
        "m{a=\"1\",a=\"2\"} 1",  // label given twice
        "m",                     // no value
        "m ",                    // no value
        "m abc",                 // not a number
        "m 1,5",                 // not a number either
        "m 0x10",                // hex is not in the format
        "m 1 1.5",               // timestamp must be an integer
        "m 1 2 3",               // junk after the timestamp
        "m{a=\"x\"}1",           // no space before the value
        "1m 1",                  // name starts with a digit
        "{a=\"x\"} 1",           // no name
        "m\x01 1",               // control byte in the name
    };
    for (const char* line : bad) {
        INFO(line);
        const std::string msg =
            message([&] { parsePrometheusText(std::string("ok_line 1\n# c\n") + line + "\n"); });
        CHECK(msg.find("metrics line 3") != std::string::npos);
    }
    CHECK_NOTHROW(parsePrometheusText("m 1e400\nn -1e-400\n"));  // out of range saturates, as in Go
    CHECK(std::isinf(parsePrometheusText("m 1e400\n")[0].value));
    CHECK(parsePrometheusText("m 1e-400\n")[0].value == 0);
}

TEST_CASE("Prometheus text: arbitrary bytes either parse or throw Error, never crash", "[monitor]") {
    std::mt19937 rng(1234);
    const std::string seed =
        "lathe_request_duration_seconds_bucket{model=\"m\",version=\"1\",le=\"0.005\"} 12 1700000000\n"
        "x{a=\"\\\\\\\"\\n\"} NaN\n# HELP y\ny -Inf\n";
    const std::string alphabet = "{}=\",\\ \t\n#+-.eE0123456789abcINfNa_:le\"\r";
    int parsed = 0, refused = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string text;
        switch (i % 3) {
            case 0: {  // raw random bytes, NULs included
                text.resize(rng() % 200);
                for (char& c : text) c = static_cast<char>(rng() % 256);
                break;
            }
            case 1: {  // characters that matter to the grammar
                text.resize(rng() % 120);
                for (char& c : text) c = alphabet[rng() % alphabet.size()];
                break;
            }
            default: {  // a valid scrape with a few bytes changed, cut or duplicated
                text = seed;
                const int edits = 1 + rng() % 4;
                for (int e = 0; e < edits && !text.empty(); ++e) {
                    const size_t at = rng() % text.size();
                    switch (rng() % 3) {
                        case 0:
                            text[at] = static_cast<char>(rng() % 256);
                            break;
                        case 1:
                            text.erase(at, 1 + rng() % 8);
                            break;
                        default:
                            text.insert(at, text.substr(rng() % text.size(), 1 + rng() % 8));
                    }
                }
            }
        }
        try {
            const auto samples = parsePrometheusText(text);
            for (const auto& s : samples) CHECK_FALSE(s.name.empty());
            ++parsed;
        } catch (const Error&) {
            ++refused;
        }
    }
    // Both outcomes must have happened, or the generator is not exercising the parser.
    CHECK(parsed > 100);
    CHECK(refused > 100);
}

TEST_CASE("histogramQuantile matches Prometheus' histogram_quantile", "[monitor]") {
    const double inf = std::numeric_limits<double>::infinity();
    const std::vector<std::pair<double, double>> h = {{0.1, 10}, {0.5, 30}, {1, 40}, {inf, 40}};
    CHECK(histogramQuantile(0.5, h) == Approx(0.3));    // rank 20: 0.1 + 0.4 * 10/20
    CHECK(histogramQuantile(0.25, h) == Approx(0.1));   // rank 10: top of the first bucket
    CHECK(histogramQuantile(0.9, h) == Approx(0.8));    // rank 36: 0.5 + 0.5 * 6/10
    CHECK(histogramQuantile(0.05, h) == Approx(0.02));  // rank 2: the first bucket starts at 0
    // In the +Inf bucket: the highest finite bound.
    CHECK(histogramQuantile(0.99, {{0.1, 10}, {0.5, 30}, {1, 40}, {inf, 50}}) == 1);
    // Order of the input does not matter.
    CHECK(histogramQuantile(0.5, {{inf, 40}, {1, 40}, {0.1, 10}, {0.5, 30}}) == Approx(0.3));
    // Counts that dip (non-atomic reads) are made monotonic.
    CHECK(histogramQuantile(0.5, {{0.1, 10}, {0.5, 9}, {1, 40}, {inf, 40}}) == Approx(0.5 + 0.5 * 10 / 30.0));
    CHECK(std::isnan(histogramQuantile(0.5, {{0.1, 0}, {1, 0}, {inf, 0}})));  // empty
    CHECK(std::isnan(histogramQuantile(0.5, {{0.1, 5}, {1, 10}})));           // no +Inf bucket
    CHECK(std::isnan(histogramQuantile(0.5, {{inf, 10}})));                   // too few buckets
    CHECK(std::isnan(histogramQuantile(0.5, {})));
    CHECK(histogramQuantile(-0.1, h) == -inf);
    CHECK(histogramQuantile(1.5, h) == inf);
    CHECK(std::isnan(histogramQuantile(std::nan(""), h)));
}

namespace {

// Scrape 1 (t = 100): version 1 serving. Another model shares the server.
const char* kScrape1 = R"(# TYPE lathe_model_info gauge
lathe_model_info{model="m",version="1"} 1
lathe_model_info{model="other",version="9"} 1
lathe_requests_total{model="m",version="1",code="200"} 100
lathe_requests_total{model="m",version="1",code="500"} 0
lathe_requests_total{model="other",version="9",code="200"} 5000
lathe_request_duration_seconds_bucket{model="m",version="1",le="0.01"} 50
lathe_request_duration_seconds_bucket{model="m",version="1",le="0.1"} 90
lathe_request_duration_seconds_bucket{model="m",version="1",le="1"} 100
lathe_request_duration_seconds_bucket{model="m",version="1",le="+Inf"} 100
lathe_request_duration_seconds_sum{model="m",version="1"} 3.2
lathe_request_duration_seconds_count{model="m",version="1"} 100
lathe_batch_size_bucket{model="m",version="1",le="1"} 10
lathe_batch_size_bucket{model="m",version="1",le="2"} 10
lathe_batch_size_bucket{model="m",version="1",le="4"} 20
lathe_batch_size_bucket{model="m",version="1",le="8"} 30
lathe_batch_size_bucket{model="m",version="1",le="+Inf"} 30
lathe_batch_size_sum{model="m",version="1"} 150
lathe_batch_size_count{model="m",version="1"} 30
lathe_queue_depth{model="m"} 3
lathe_queue_depth{model="other"} 100
process_cpu_seconds_total 10
process_resident_memory_bytes 104857600
)";

// Scrape 2 (t = 102): version 2 was swapped in; both versions have series.
const char* kScrape2 = R"(lathe_model_info{model="m",version="1"} 0
lathe_model_info{model="m",version="2"} 1
lathe_model_info{model="other",version="9"} 1
lathe_requests_total{model="m",version="1",code="200"} 150
lathe_requests_total{model="m",version="1",code="500"} 10
lathe_requests_total{model="m",version="2",code="200"} 40
lathe_requests_total{model="m",version="2",code="400"} 20
lathe_requests_total{model="other",version="9",code="200"} 9000
lathe_request_duration_seconds_bucket{model="m",version="1",le="0.01"} 80
lathe_request_duration_seconds_bucket{model="m",version="1",le="0.1"} 144
lathe_request_duration_seconds_bucket{model="m",version="1",le="1"} 160
lathe_request_duration_seconds_bucket{model="m",version="1",le="+Inf"} 160
lathe_request_duration_seconds_sum{model="m",version="1"} 9.2
lathe_request_duration_seconds_count{model="m",version="1"} 160
lathe_request_duration_seconds_bucket{model="m",version="2",le="0.01"} 30
lathe_request_duration_seconds_bucket{model="m",version="2",le="0.1"} 54
lathe_request_duration_seconds_bucket{model="m",version="2",le="1"} 60
lathe_request_duration_seconds_bucket{model="m",version="2",le="+Inf"} 60
lathe_request_duration_seconds_sum{model="m",version="2"} 4
lathe_request_duration_seconds_count{model="m",version="2"} 60
lathe_queue_duration_seconds_bucket{model="m",version="2",le="0.001"} 5
lathe_queue_duration_seconds_bucket{model="m",version="2",le="0.01"} 10
lathe_queue_duration_seconds_bucket{model="m",version="2",le="+Inf"} 10
lathe_queue_duration_seconds_sum{model="m",version="2"} 0.03
lathe_queue_duration_seconds_count{model="m",version="2"} 10
lathe_batch_size_bucket{model="m",version="1",le="1"} 12
lathe_batch_size_bucket{model="m",version="1",le="2"} 15
lathe_batch_size_bucket{model="m",version="1",le="4"} 25
lathe_batch_size_bucket{model="m",version="1",le="8"} 35
lathe_batch_size_bucket{model="m",version="1",le="+Inf"} 35
lathe_batch_size_sum{model="m",version="1"} 170
lathe_batch_size_count{model="m",version="1"} 35
lathe_batch_size_bucket{model="m",version="2",le="1"} 0
lathe_batch_size_bucket{model="m",version="2",le="2"} 0
lathe_batch_size_bucket{model="m",version="2",le="4"} 0
lathe_batch_size_bucket{model="m",version="2",le="8"} 4
lathe_batch_size_bucket{model="m",version="2",le="+Inf"} 5
lathe_batch_size_sum{model="m",version="2"} 1000
lathe_batch_size_count{model="m",version="2"} 5
lathe_queue_depth{model="m"} 7
lathe_queue_depth{model="other"} 100
process_cpu_seconds_total 11
process_resident_memory_bytes 209715200
lathe_gpu_utilization_percent{gpu="0"} 40
lathe_gpu_utilization_percent{gpu="1"} 60
lathe_gpu_memory_used_bytes{gpu="0"} 1073741824
lathe_gpu_memory_used_bytes{gpu="1"} 1073741824
)";

}  // namespace

TEST_CASE("interval figures from two scrapes, aggregated over versions of one model", "[monitor]") {
    const auto s1 = parsePrometheusText(kScrape1);
    const auto s2 = parsePrometheusText(kScrape2);

    // First scrape: gauges only.
    const auto first = intervalStats("m", {}, s1, 0, 100);
    CHECK(first.version == 1);
    CHECK(first.t == 100);
    CHECK(first.values == std::map<std::string, double>{{"up", 1}, {"queue_depth", 3}, {"rss_mb", 100}});

    const auto st = intervalStats("m", s1, s2, 2.0, 102);
    const auto& v = st.values;
    CHECK(st.version == 2);
    CHECK(v.at("up") == 1);
    // 50 + 10 (v1) + 40 + 20 (v2, new series) = 120 requests in 2 s; the other model's are not counted.
    CHECK(v.at("qps") == Approx(60));
    CHECK(v.at("error_rate") == Approx(10.0 / 120));  // 400 is the client's fault, not an error
    // Cumulative deltas over both versions: le 0.01: 60, 0.1: 108, 1: 120, +Inf: 120.
    CHECK(v.at("p50_ms") == Approx(10));          // rank 60: top of the first bucket
    CHECK(v.at("p90_ms") == Approx(100));         // rank 108: top of the second
    CHECK(v.at("p99_ms") == Approx(910));         // rank 118.8: 0.1 + 0.9 * 10.8 / 12
    CHECK(v.at("queue_ms_p99") == Approx(9.82));  // rank 9.9: 0.001 + 0.009 * 4.9 / 5
    CHECK(v.count("compute_ms_p99") == 0);        // the server reported no compute histogram
    CHECK(v.at("batch_mean") == Approx((20 + 1000) / 10.0));
    CHECK(v.at("batch_hist/1") == 2);
    CHECK(v.at("batch_hist/2") == 3);
    CHECK(v.at("batch_hist/4") == 0);
    CHECK(v.at("batch_hist/8") == 4);
    CHECK(v.at("batch_hist/+Inf") == 1);
    CHECK(v.at("queue_depth") == 7);
    CHECK(v.at("cpu_percent") == Approx(50));
    CHECK(v.at("rss_mb") == Approx(200));
    CHECK(v.at("gpu_util") == Approx(50));
    CHECK(v.at("gpu_mem_mb") == Approx(2048));

    CHECK(st.requests == 120);
    CHECK(st.errors == 10);

    // An idle interval: rates are zero; percentiles, the batch mean and the error rate (a share
    // of no requests) are absent.
    const auto idle = intervalStats("m", s2, s2, 1.0, 103);
    CHECK(idle.values.at("qps") == 0);
    CHECK(idle.values.count("error_rate") == 0);
    CHECK(idle.requests == 0);
    CHECK(idle.values.at("batch_hist/8") == 0);
    CHECK(idle.values.at("cpu_percent") == 0);
    for (const char* k : {"p50_ms", "p90_ms", "p99_ms", "queue_ms_p99", "batch_mean"}) {
        INFO(k);
        CHECK(idle.values.count(k) == 0);
    }

    // The other model on the same server sees only its own traffic.
    const auto other = intervalStats("other", s1, s2, 2.0, 102);
    CHECK(other.version == 9);
    CHECK(other.values.at("qps") == Approx(2000));
    CHECK(other.values.at("queue_depth") == 100);
}

TEST_CASE("while two versions answer, each one's figures are kept apart as variant/ keys",
          "[monitor][rollout]") {
    const auto st =
        intervalStats("m", parsePrometheusText(kScrape1), parsePrometheusText(kScrape2), 2.0, 102);
    REQUIRE(st.variants.size() == 2);
    const auto& v1 = st.variants.at(1);
    const auto& v2 = st.variants.at(2);
    CHECK(v1.at("variant/requests") == 60);
    CHECK(v1.at("variant/qps") == 30);
    CHECK(v1.at("variant/error_rate") == Approx(10.0 / 60));
    CHECK(v2.at("variant/requests") == 60);
    CHECK(v2.at("variant/error_rate") == 0);  // a 400 is the client's error
    CHECK(v2.at("variant/batch_mean") == 200);
    CHECK(v2.at("variant/p50_ms") <= 10);  // 30 of 60 within 10 ms
    CHECK(v2.at("variant/p99_ms") > 100);  // 6 of 60 above 100 ms
    CHECK(v1.count("variant/weight_bp") == 0);

    // A rollout at 25%: the candidate's weight rides along; one version alone has no variants.
    std::string withWeight = kScrape2;
    withWeight += "lathe_rollout_weight_bp{model=\"m\",version=\"2\"} 2500\n";
    const auto r =
        intervalStats("m", parsePrometheusText(kScrape1), parsePrometheusText(withWeight), 2.0, 102);
    CHECK(r.variants.at(2).at("variant/weight_bp") == 2500);
    CHECK(intervalStats("m", parsePrometheusText(kScrape1), parsePrometheusText(kScrape1), 2.0, 102)
              .variants.empty());
}

TEST_CASE("a counter that went down means the server restarted: start over", "[monitor]") {
    const auto s2 = parsePrometheusText(kScrape2);
    // After a restart: v2 only, counters small again.
    const auto restarted = parsePrometheusText(
        "lathe_model_info{model=\"m\",version=\"2\"} 1\n"
        "lathe_requests_total{model=\"m\",version=\"2\",code=\"200\"} 3\n"
        "lathe_queue_depth{model=\"m\"} 1\n"
        "process_cpu_seconds_total 0.5\n");
    const auto st = intervalStats("m", s2, restarted, 1.0, 104);
    CHECK(st.values == std::map<std::string, double>{{"up", 1}, {"queue_depth", 1}});
    // And the next interval counts from the restarted baseline.
    auto later = restarted;
    later[1].value = 13;
    later[3].value = 1.0;
    const auto next = intervalStats("m", restarted, later, 2.0, 106);
    CHECK(next.values.at("qps") == Approx(5));
    CHECK(next.values.at("cpu_percent") == Approx(25));

    // Only the process CPU counter going down is enough.
    auto cpuReset = parsePrometheusText(kScrape2);
    for (auto& s : cpuReset)
        if (s.name == "process_cpu_seconds_total") s.value = 0.1;
    CHECK(intervalStats("m", s2, cpuReset, 1.0, 105).values.count("qps") == 0);
}

TEST_CASE("p99 latency alert fires after N consecutive samples and resolves", "[monitor][alerts]") {
    AlertEvaluator ev;  // 100 ms, 3 samples
    CHECK(ev.add(sample(1, {{"p99_ms", 150}})).empty());
    CHECK(ev.add(sample(2, {{"p99_ms", 150}})).empty());
    CHECK(ev.add(sample(3, {{"p99_ms", 50}})).empty());  // breaks the run
    CHECK(ev.add(sample(4, {{"p99_ms", 150}})).empty());
    CHECK(ev.add(sample(5, {{"p99_ms", 160}})).empty());
    CHECK(ev.add(sample(6, {{"up", 1}, {"qps", 0}})).empty());  // no traffic: neither over nor under
    CHECK_FALSE(ev.firing("p99_latency"));
    auto e = ev.add(sample(7, {{"p99_ms", 182}}));
    REQUIRE(e.size() == 1);
    CHECK(e[0].fired);
    CHECK(e[0].rule == "p99_latency");
    CHECK(e[0].message == "P99 latency 182 ms above 100 ms for 3 samples");
    CHECK(e[0].value == 182);
    CHECK(ev.firing("p99_latency"));
    CHECK(ev.add(sample(8, {{"p99_ms", 300}})).empty());  // fires once
    CHECK(ev.add(sample(9, {{"up", 0}})).empty());        // a failed scrape changes nothing
    e = ev.add(sample(10, {{"p99_ms", 80}}));
    REQUIRE(e.size() == 1);
    CHECK_FALSE(e[0].fired);
    CHECK(e[0].rule == "p99_latency");
    CHECK(e[0].message == "P99 latency 80 ms back under 100 ms");
    CHECK_FALSE(ev.firing("p99_latency"));
    // The next firing needs a whole new run.
    CHECK(ev.add(sample(11, {{"p99_ms", 150}})).empty());
    CHECK(ev.add(sample(12, {{"p99_ms", 150}})).empty());
    CHECK(ev.add(sample(13, {{"p99_ms", 150}})).size() == 1);
}

TEST_CASE("error-rate alert fires on a rise within the window and resolves when back down",
          "[monitor][alerts]") {
    AlertEvaluator ev;  // +5 points within 300 s
    double t = 0;
    for (int i = 0; i < 5; ++i) CHECK(ev.add(sample(t += 10, {{"error_rate", 0.01}})).empty());
    CHECK(ev.add(sample(t += 10, {{"error_rate", 0.05}})).empty());  // +4 points: not yet
    auto e = ev.add(sample(t += 10, {{"error_rate", 0.07}}));        // +6 points
    REQUIRE(e.size() == 1);
    CHECK(e[0].fired);
    CHECK(e[0].rule == "error_rate");
    CHECK(e[0].value == Approx(7));
    CHECK(e[0].message == "Error rate 7.0% up 6.0 points from 1.0% within 300 s");
    // Staying high past the window does not resolve it: the baseline is the one it fired against.
    for (int i = 0; i < 60; ++i) CHECK(ev.add(sample(t += 10, {{"error_rate", 0.08}})).empty());
    CHECK(ev.firing("error_rate"));
    e = ev.add(sample(t += 10, {{"error_rate", 0.03}}));
    REQUIRE(e.size() == 1);
    CHECK_FALSE(e[0].fired);
    CHECK(e[0].message.find("Error rate 3.0%") == 0);
    CHECK_FALSE(ev.firing("error_rate"));

    // A rise against a low older than the window does not count.
    AlertEvaluator slow;
    CHECK(slow.add(sample(0, {{"error_rate", 0.01}})).empty());
    CHECK(slow.add(sample(400, {{"error_rate", 0.07}})).empty());
    CHECK_FALSE(slow.firing("error_rate"));
    // A custom window and rise.
    AlertRules r;
    r.errorRateRisePoints = 1;
    r.errorRateWindowS = 1000;
    AlertEvaluator strict(r);
    CHECK(strict.add(sample(0, {{"error_rate", 0.0}})).empty());
    CHECK(strict.add(sample(400, {{"error_rate", 0.015}})).size() == 1);
}

namespace {
IntervalStats counted(double t, double requests, double errors) {
    IntervalStats s{t, 1, {}};
    s.requests = requests;
    s.errors = errors;
    if (requests > 0) s.values["error_rate"] = errors / requests;
    return s;
}
}  // namespace

TEST_CASE("error-rate alert: quiet intervals are pooled, idle ones neither fire nor resolve it",
          "[monitor][alerts]") {
    AlertEvaluator ev;  // +5 points within 300 s, rates over >= 20 requests
    double t = 0;
    // 3 requests a second with a failure now and then (3 in 147): a second with one reads 33%
    // alone, and must not fire it; pooled by 7 seconds (21 requests) the rate is 0% or 4.8%.
    for (int i = 0; i < 49; ++i) {
        const bool error = i % 17 == 0;
        CHECK(ev.add(counted(t += 1, 3, error ? 1 : 0)).empty());
        CHECK(ev.add(counted(t += 1, 0, 0)).empty());  // an idle second: no rate, no baseline of 0%
    }
    CHECK_FALSE(ev.firing("error_rate"));
    // A real rise to 50% fires once 20 requests show it, and idle seconds do not resolve it.
    std::vector<AlertEvent> fired;
    for (int i = 0; i < 7 && fired.empty(); ++i) fired = ev.add(counted(t += 1, 4, 2));
    REQUIRE(fired.size() == 1);
    CHECK(fired[0].fired);
    CHECK(fired[0].value == Approx(50));
    for (int i = 0; i < 30; ++i) CHECK(ev.add(counted(t += 1, 0, 0)).empty());
    CHECK(ev.firing("error_rate"));
    // Back to no errors: resolved once a pooled 20 requests show it.
    std::vector<AlertEvent> resolved;
    int seconds = 0;
    for (; seconds < 10 && resolved.empty(); ++seconds) resolved = ev.add(counted(t += 1, 4, 0));
    REQUIRE(resolved.size() == 1);
    CHECK_FALSE(resolved[0].fired);
    CHECK(seconds == 5);  // 5 x 4 requests
    // A pool never spans more than the window: 10 requests long ago and 10 now are not judged together.
    AlertEvaluator sparse;
    CHECK(sparse.add(counted(0, 10, 0)).empty());
    CHECK(sparse.add(counted(1000, 10, 10)).empty());
    CHECK_FALSE(sparse.firing("error_rate"));
    // At a trickle a firing alert still resolves: once the window has passed, the pool is judged
    // on the few requests it holds.
    AlertEvaluator trickle;
    CHECK(trickle.add(counted(0, 40, 0)).empty());
    REQUIRE(trickle.add(counted(1, 40, 20)).size() == 1);  // 50%
    CHECK(trickle.add(counted(100, 5, 0)).empty());
    CHECK(trickle.add(counted(200, 5, 0)).empty());
    const auto back = trickle.add(counted(401, 1, 0));  // 301 s since the pool began: its 10 requests judged
    REQUIRE(back.size() == 1);
    CHECK_FALSE(back[0].fired);
    CHECK_FALSE(trickle.firing("error_rate"));
    AlertRules perSample;
    perSample.errorRateMinRequests = 1;
    AlertEvaluator eager(perSample);
    CHECK(eager.add(counted(0, 10, 0)).empty());
    CHECK(eager.add(counted(1, 10, 10)).size() == 1);
}

TEST_CASE("GPU-idle alert fires after a whole idle window and resolves on use", "[monitor][alerts]") {
    AlertEvaluator ev;  // under 20% for 600 s
    double firedAt = -1;
    for (double t = 0; t <= 600; t += 60) {
        const auto e = ev.add(sample(t, {{"gpu_util", 5}}));
        if (!e.empty()) firedAt = t;
    }
    CHECK(firedAt == 600);  // not before the samples span the window
    CHECK(ev.firing("gpu_idle"));
    auto e = ev.add(sample(660, {{"gpu_util", 50}}));
    REQUIRE(e.size() == 1);
    CHECK_FALSE(e[0].fired);
    CHECK(e[0].rule == "gpu_idle");
    // Idle again: a new whole window, not counting the busy sample at 660.
    firedAt = -1;
    for (double t = 720; t <= 1500; t += 60) {
        const auto ev2 = ev.add(sample(t, {{"gpu_util", 1}}));
        if (!ev2.empty()) {
            CHECK(ev2[0].fired);
            CHECK(ev2[0].message == "GPU utilisation under 20% for 600 s (now 1%)");
            if (firedAt < 0) firedAt = t;
        }
    }
    CHECK(firedAt == 1320);
    // One busy sample inside the window keeps it quiet.
    AlertEvaluator busy;
    for (double t = 0; t <= 900; t += 60)
        CHECK(busy.add(sample(t, {{"gpu_util", t == 300 ? 90.0 : 5.0}})).empty());
    CHECK_FALSE(busy.firing("gpu_idle"));
    CHECK(busy.add(sample(960, {{"gpu_util", 5}})).size() == 1);  // the busy sample left the window
    // No GPU reported: never idle.
    AlertEvaluator cpuOnly;
    for (double t = 0; t <= 2000; t += 60) CHECK(cpuOnly.add(sample(t, {{"qps", 0}, {"up", 1}})).empty());
}

TEST_CASE("alert rules from TOML, bad keys and values refused as ConfigError", "[monitor][alerts]") {
    auto r = alertRulesFromToml("p99_threshold_ms = 250\np99_samples = 5\ngpu_idle_window_s = 60.5\n");
    CHECK(r.p99ThresholdMs == 250);
    CHECK(r.p99Samples == 5);
    CHECK(r.gpuIdleWindowS == 60.5);
    CHECK(r.errorRateRisePoints == AlertRules{}.errorRateRisePoints);  // untouched keys keep defaults
    r = alertRulesFromToml(
        "[alerts]\nerror_rate_rise_points = 2.5\nerror_rate_window_s = 60\nerror_rate_min_requests = 5\n");
    CHECK(r.errorRateRisePoints == 2.5);
    CHECK(r.errorRateWindowS == 60);
    CHECK(r.errorRateMinRequests == 5);
    CHECK(alertRulesFromToml("").p99Samples == 3);

    auto err = [](const std::string& toml) {
        try {
            alertRulesFromToml(toml);
        } catch (const ConfigError& e) {
            return std::string(e.what());
        }
        return std::string("(no ConfigError)");
    };
    CHECK(err("p99_threshold_ms = 1\np99_treshold_ms = 2\n").find("line 2: unknown key 'p99_treshold_ms'") !=
          std::string::npos);
    CHECK(err("p99_samples = 2.5\n").find("'p99_samples' must be an integer") != std::string::npos);
    CHECK(err("p99_samples = 0\n").find("'p99_samples' must be an integer >= 1") != std::string::npos);
    CHECK(err("p99_threshold_ms = \"fast\"\n").find("'p99_threshold_ms' must be a number") !=
          std::string::npos);
    CHECK(err("p99_threshold_ms = -5\n").find("must be > 0") != std::string::npos);
    CHECK(err("gpu_idle_percent = 150\n").find("'gpu_idle_percent' must be > 0 and <= 100") !=
          std::string::npos);
    CHECK(err("error_rate_window_s = nan\n").find("'error_rate_window_s' must be > 0") != std::string::npos);
    CHECK(err("p99_samples = true\n").find("must be an integer") != std::string::npos);
    CHECK(err("p99_samples = = 3\n").find("alert rules line 1") != std::string::npos);  // syntax error
}

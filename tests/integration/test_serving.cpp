// The inference server end to end: real HTTP clients against the real server on loopback.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "lathe/core/deploy.h"
#include "lathe/core/loadgen.h"
#include "run_process.h"
#include "serving/model_runner.h"
#include "serving_fixture.h"
#include "skip.h"

using namespace lathe;
using lathe::test::httpGet;
using lathe::test::httpRequest;
using nlohmann::json;

namespace {

std::string inferBody(int rows, float value = 0.5f, const std::string& name = "input",
                      const std::string& datatype = "FP32") {
    json data = json::array();
    for (int i = 0; i < rows * 64; ++i) data.push_back(value + 0.001f * static_cast<float>(i % 64));
    return json{
        {"id", "req-1"},
        {"inputs", {{{"name", name}, {"shape", {rows, 1, 8, 8}}, {"datatype", datatype}, {"data", data}}}}}
        .dump();
}

// Sends raw bytes, then reads whatever comes back until the server closes or `waitS` passes.
std::string rawExchange(uint16_t port, const std::string& bytes, double waitS) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    timeval tv{static_cast<time_t>(waitS), static_cast<suseconds_t>((waitS - std::floor(waitS)) * 1e6)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (!bytes.empty()) (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::string out;
    char buf[4096];
    for (;;) {
        const auto n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
}

// Alive and not a zombie (an orphaned server waits for init to reap it).
bool running(int64_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    return !stat.empty() && close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

double metricDouble(const std::string& metrics, const std::string& prefix) {
    const auto pos = metrics.find(prefix);
    if (pos == std::string::npos) return 0;
    return std::stod(metrics.substr(metrics.find(' ', pos) + 1));
}

int64_t metricValue(const std::string& metrics, const std::string& prefix) {
    return static_cast<int64_t>(metricDouble(metrics, prefix));
}

// Another run of the digits MLP in the workspace (seed 11, one epoch: other weights than v1's).
int64_t trainOtherWeights(const test::ServingWorkspace& ws) {
    core::Store store(ws.db());
    core::RunSpec spec;
    spec.epochs = 1;
    spec.seed = 11;
    const auto rec = core::trainAndRecord(store, spec, {});
    REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
    store.flush();
    return rec.runId;
}

// That run registered as digits v2.
core::ModelVersion registerOtherWeights(const test::ServingWorkspace& ws) {
    const auto runId = trainOtherWeights(ws);
    core::Store store(ws.db());
    core::Registry registry(ws.db());
    const auto v2 = core::registerModel(registry, &store, "digits", runId, "", {});
    REQUIRE(v2.version == 2);
    return v2;
}

// The swap tests' inputs: a few single-row requests that differ.
constexpr int kSwapInputs = 6;
std::string swapInput(int r) { return inferBody(1, 0.15f * static_cast<float>(r)); }

// Each of the swap inputs answered, one request at a time, by a server of its own that only
// ever serves `version`: the reference an answer labelled with that version must equal.
std::vector<std::vector<double>> referenceAnswers(const core::ModelVersion& version) {
    core::ServeOptions o;
    o.port = 0;
    core::InferenceServer server(o);
    server.load({"digits", version.version, version.path});
    const auto port = server.start();
    std::vector<std::vector<double>> out;
    for (int r = 0; r < kSwapInputs; ++r) {
        const auto a = httpRequest(port, "POST", "/v2/models/digits/infer", swapInput(r));
        REQUIRE(a.status == 200);
        REQUIRE(json::parse(a.body)["model_version"] == std::to_string(version.version));
        out.push_back(json::parse(a.body)["outputs"][0]["data"].get<std::vector<double>>());
    }
    return out;
}

// References per version ("1", "2"), checked to tell the versions apart on every input: an
// answer computed by one version cannot pass for the other's.
std::map<std::string, std::vector<std::vector<double>>> versionReferences(const core::ModelVersion& v1,
                                                                          const core::ModelVersion& v2) {
    std::map<std::string, std::vector<std::vector<double>>> refs{{"1", referenceAnswers(v1)},
                                                                 {"2", referenceAnswers(v2)}};
    for (int r = 0; r < kSwapInputs; ++r) {
        REQUIRE(refs["1"][r].size() == refs["2"][r].size());
        double differ = 0;
        for (size_t k = 0; k < refs["1"][r].size(); ++k)
            differ = std::max(differ, std::fabs(refs["1"][r][k] - refs["2"][r][k]));
        INFO("input " << r);
        REQUIRE(differ > 1e-2);
    }
    return refs;
}

// Whether `answer` (an infer response body) carries, for input r, the outputs of the version its
// model_version names, within `margin`. Explains a mismatch in `why`.
bool answersAsLabelled(const std::string& answer, int r,
                       const std::map<std::string, std::vector<std::vector<double>>>& refs, double margin,
                       std::string& why) {
    const auto j = json::parse(answer);
    const auto label = j["model_version"].get<std::string>();
    const auto ref = refs.find(label);
    if (ref == refs.end()) {
        why = "answer labelled with version " + label;
        return false;
    }
    const auto got = j["outputs"][0]["data"].get<std::vector<double>>();
    const auto& want = ref->second[static_cast<size_t>(r)];
    if (got.size() != want.size()) {
        why = "answer of " + std::to_string(got.size()) + " values";
        return false;
    }
    for (size_t k = 0; k < got.size(); ++k)
        if (std::fabs(got[k] - want[k]) > margin) {
            why = "input " + std::to_string(r) + " labelled v" + label + ": output " + std::to_string(k) +
                  " is " + std::to_string(got[k]) + ", v" + label + " gives " + std::to_string(want[k]);
            return false;
        }
    return true;
}

}  // namespace

TEST_CASE("every KServe v2 endpoint answers as the protocol says, errors included", "[serving]") {
    test::ServingWorkspace ws;
    core::ServeOptions o;
    o.maxBatch = 8;
    o.maxBodyBytes = 64 * 1024;
    const auto server = ws.serve(o);
    const auto port = server->port();

    CHECK(httpGet(port, "/v2/health/live").status == 200);
    const auto ready = httpGet(port, "/v2/health/ready");
    CHECK(ready.status == 200);
    CHECK(json::parse(ready.body)["ready"] == true);
    CHECK(json::parse(httpGet(port, "/v2").body)["name"] == "lathe");
    const auto meta = json::parse(httpGet(port, "/v2/models/digits").body);
    CHECK(meta["name"] == "digits");
    CHECK(meta["versions"][0] == "1");
    CHECK(meta["inputs"][0]["shape"] == json({-1, 1, 8, 8}));
    CHECK(meta["outputs"][0]["datatype"] == "FP32");
    CHECK(httpGet(port, "/v2/models/digits/ready").status == 200);
    CHECK(httpGet(port, "/v2/models/digits/versions/1").status == 200);
    CHECK(httpGet(port, "/v2/models/digits/versions/7").status == 404);

    // A batch of two different rows answers the same as each row alone: batching is invisible.
    const auto two = httpRequest(port, "POST", "/v2/models/digits/infer", inferBody(2));
    REQUIRE(two.status == 200);
    const auto j = json::parse(two.body);
    CHECK(j["model_name"] == "digits");
    CHECK(j["model_version"] == "1");
    CHECK(j["id"] == "req-1");
    CHECK(j["outputs"][0]["name"] == "logits");
    CHECK(j["outputs"][0]["shape"] == json({2, 10}));
    REQUIRE(j["outputs"][0]["data"].size() == 20);
    const auto one =
        json::parse(httpRequest(port, "POST", "/v2/models/digits/versions/1/infer", inferBody(1)).body);
    for (int k = 0; k < 10; ++k)
        CHECK(one["outputs"][0]["data"][k].get<double>() ==
              Approx(j["outputs"][0]["data"][k].get<double>()).margin(1e-5));
    // Nested data is accepted as well as flat.
    json nested = json::parse(inferBody(1));
    json rows = json::array();
    for (int r = 0; r < 8; ++r) {
        json row = json::array();
        for (int c = 0; c < 8; ++c) row.push_back(nested["inputs"][0]["data"][r * 8 + c]);
        rows.push_back({row});
    }
    nested["inputs"][0]["data"] = json::array({rows});
    CHECK(httpRequest(port, "POST", "/v2/models/digits/infer", nested.dump()).status == 200);

    struct Bad {
        const char* what;
        std::string target, method, body;
        int status;
        const char* says;
    };
    json unknown = json::parse(inferBody(1));
    unknown["outputs"] = json::array({{{"name", "probs"}}});
    const std::string unknownOutput = unknown.dump();
    const std::vector<Bad> bad{
        {"malformed JSON", "/v2/models/digits/infer", "POST", "{\"inputs\": [", 400, "malformed JSON"},
        {"not an object", "/v2/models/digits/infer", "POST", "[1,2]", 400, "JSON object"},
        {"no inputs", "/v2/models/digits/infer", "POST", "{}", 400, "inputs"},
        {"wrong input name", "/v2/models/digits/infer", "POST", inferBody(1, 0.5f, "pixels"), 400,
         "unknown input 'pixels'"},
        {"wrong datatype", "/v2/models/digits/infer", "POST", inferBody(1, 0.5f, "input", "INT64"), 400,
         "FP32"},
        {"wrong shape", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,64],"datatype":"FP32","data":[1]}]})", 400,
         "expects [-1, 1, 8, 8]"},
        {"too few values", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1,2,3]}]})", 400,
         "needs 64"},
        {"a number beyond double (fuzz find)", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1e400]}]})", 400,
         "malformed JSON"},
        {"a number beyond FP32", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1e300]}]})", 400,
         "does not fit FP32"},
        {"strings as data", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":["a"]}]})", 400, "string"},
        // After numbers read on the flat path: the element that is not a number gets its own word.
        {"null after numbers", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1,2.5,null]}]})", 400,
         "null"},
        {"a boolean after nested numbers", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1,[2,3],4,true]}]})", 400,
         "boolean"},
        {"an object after numbers", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[0.5,{"a":1}]}]})", 400,
         "object"},
        {"a broken number after numbers", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1,2,-]}]})", 400,
         "malformed JSON"},
        {"FP32 overflow after numbers", "/v2/models/digits/infer", "POST",
         R"({"inputs":[{"name":"input","shape":[1,1,8,8],"datatype":"FP32","data":[1,-1e39]}]})", 400,
         "does not fit FP32"},
        {"more rows than max batch", "/v2/models/digits/infer", "POST", inferBody(9), 400, "at most 8"},
        {"unknown output", "/v2/models/digits/infer", "POST", unknownOutput, 400, "unknown output 'probs'"},
        {"unknown model", "/v2/models/nope/infer", "POST", inferBody(1), 404, "no model named 'nope'"},
        {"unknown endpoint", "/v3/anything", "GET", "", 404, "no such endpoint"},
        {"wrong method", "/v2/models/digits/infer", "GET", "", 405, "POST"},
        {"body over the limit", "/v2/models/digits/infer", "POST", std::string(100 * 1024, ' '), 413,
         "larger than"},
        {"load without a version", "/v2/repository/models/digits/load", "POST",
         "{\"parameters\":{\"version\":\"x\"}}", 400, "bad load request"},
    };
    for (const auto& b : bad) {
        INFO(b.what);
        const auto a = httpRequest(port, b.method, b.target, b.body);
        CHECK(a.status == b.status);
        if (a.status >= 400 && b.status != 413) {
            const auto e = json::parse(a.body, nullptr, false);
            REQUIRE_FALSE(e.is_discarded());
            CHECK(e["error"].get<std::string>().find(b.says) != std::string::npos);
        }
    }
    // Garbage that is not HTTP at all, and a client that stalls mid-request: answered or dropped,
    // never a hung or crashed server.
    CHECK(rawExchange(port, "\x16\x03\x01 hello not http\r\n\r\n", 2).find("400") != std::string::npos);
    const auto metrics = httpGet(port, "/metrics");
    REQUIRE(metrics.status == 200);
    CHECK(metricValue(metrics.body, "lathe_requests_total{code=\"400\",model=\"digits\",version=\"1\"}") >=
          8);
    CHECK(metricValue(metrics.body, "lathe_requests_total{code=\"200\",model=\"digits\",version=\"1\"}") ==
          3);
    CHECK(metrics.body.find("lathe_batch_size_bucket") != std::string::npos);
    CHECK(metrics.body.find("process_resident_memory_bytes") != std::string::npos);
    CHECK(httpGet(port, "/v2/health/live").status == 200);
}

namespace {

// A binary tensor data request as Triton's Python client sends it by default: the input's
// bytes after a JSON header, the output asked for in binary unless `outputs` says otherwise.
struct BinaryRequest {
    std::string body;
    size_t jsonLength = 0;
};

BinaryRequest binaryBody(const std::vector<float>& values, int rows, const json& outputs = nullptr,
                         int64_t declared = -1) {
    json j{
        {"id", "bin-1"},
        {"inputs",
         {{{"name", "input"},
           {"shape", {rows, 1, 8, 8}},
           {"datatype", "FP32"},
           {"parameters", {{"binary_data_size", declared >= 0 ? declared : int64_t(values.size() * 4)}}}}}}};
    if (outputs.is_null())
        j["parameters"] = {{"binary_data_output", true}};
    else
        j["outputs"] = outputs;
    BinaryRequest r;
    r.body = j.dump();
    r.jsonLength = r.body.size();
    r.body.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    return r;
}

// `length`: the header's value as sent; nullopt sends the JSON part's true length.
test::HttpAnswer postBinary(uint16_t port, const BinaryRequest& r,
                            std::optional<std::string> length = std::nullopt) {
    return httpRequest(port, "POST", "/v2/models/digits/infer", r.body, 5,
                       {{"Inference-Header-Content-Length", length ? *length : std::to_string(r.jsonLength)},
                        {"Content-Type", "application/octet-stream"}});
}

}  // namespace

TEST_CASE("binary tensor data requests (Triton's extension) answer as their JSON twins", "[serving]") {
    test::ServingWorkspace ws;
    const auto server = ws.serve();
    const auto port = server->port();
    const auto extensions = json::parse(httpGet(port, "/v2").body)["extensions"];
    CHECK(std::find(extensions.begin(), extensions.end(), "binary_tensor_data") != extensions.end());

    // The JSON answer for two rows is the reference.
    const auto text = inferBody(2);
    const auto reference = json::parse(httpRequest(port, "POST", "/v2/models/digits/infer", text).body);
    REQUIRE(reference["outputs"][0]["data"].size() == 20);
    std::vector<float> values;
    const auto parsed = json::parse(text);  // kept: a loop over a temporary's member would dangle
    for (const auto& v : parsed["inputs"][0]["data"]) values.push_back(v.get<float>());

    SECTION("binary in, binary out") {
        auto a = postBinary(port, binaryBody(values, 2));
        INFO(a.body.substr(0, 300));
        REQUIRE(a.status == 200);
        CHECK(a.headers["content-type"] == "application/octet-stream");
        REQUIRE(a.headers.count("inference-header-content-length") == 1);
        const size_t n = std::stoul(a.headers["inference-header-content-length"]);
        REQUIRE(n < a.body.size());
        const auto head = json::parse(a.body.substr(0, n));
        CHECK(head["id"] == "bin-1");
        CHECK(head["outputs"][0]["shape"] == json({2, 10}));
        CHECK(head["outputs"][0]["parameters"]["binary_data_size"] == 80);
        CHECK_FALSE(head["outputs"][0].contains("data"));
        REQUIRE(a.body.size() == n + 80);
        std::vector<float> out(20);
        std::memcpy(out.data(), a.body.data() + n, 80);
        for (int k = 0; k < 20; ++k)
            CHECK(out[k] == Approx(reference["outputs"][0]["data"][k].get<double>()).margin(1e-5));
    }
    SECTION("binary in, JSON out when the output says so") {
        const auto a = postBinary(
            port, binaryBody(values, 2,
                             json::array({{{"name", "logits"}, {"parameters", {{"binary_data", false}}}}})));
        REQUIRE(a.status == 200);
        CHECK(a.headers.count("inference-header-content-length") == 0);
        const auto j = json::parse(a.body);
        for (int k = 0; k < 20; ++k)
            CHECK(j["outputs"][0]["data"][k].get<double>() ==
                  Approx(reference["outputs"][0]["data"][k].get<double>()).margin(1e-5));
    }
    SECTION("JSON in, binary out") {
        json j = json::parse(text);
        j["outputs"] = json::array({{{"name", "logits"}, {"parameters", {{"binary_data", true}}}}});
        auto a = httpRequest(port, "POST", "/v2/models/digits/infer", j.dump());
        REQUIRE(a.status == 200);
        const size_t n = std::stoul(a.headers["inference-header-content-length"]);
        CHECK(a.body.size() == n + 80);
    }
    SECTION("malformed binary requests are refused with a reason") {
        struct Bad {
            const char* what;
            BinaryRequest request;
            std::optional<std::string> length;
            const char* says;
        };
        auto extra = binaryBody(values, 2);
        extra.body += "xxxx";
        const std::vector<Bad> bad{
            {"header length beyond the body", binaryBody(values, 2), "100000", "holds only"},
            {"header length not a number", binaryBody(values, 2), "12a", "byte count"},
            {"header present but empty", binaryBody(values, 2), "", "byte count"},
            {"declared size does not fit the shape", binaryBody(values, 2, nullptr, 256), std::nullopt,
             "needs 512"},
            {"bytes left over", extra, std::nullopt, "after its JSON header"},
            {"too few bytes",
             binaryBody(std::vector<float>(values.begin(), values.begin() + 64), 2, nullptr, 512),
             std::nullopt, "after its JSON header"},
            {"classification asked for",
             binaryBody(values, 2,
                        json::array({{{"name", "logits"}, {"parameters", {{"classification", 3}}}}})),
             std::nullopt, "classification"},
        };
        for (const auto& b : bad) {
            INFO(b.what);
            const auto a = postBinary(port, b.request, b.length);
            CHECK(a.status == 400);
            const auto e = json::parse(a.body, nullptr, false);
            REQUIRE_FALSE(e.is_discarded());
            CHECK(e["error"].get<std::string>().find(b.says) != std::string::npos);
        }
        // Declaring binary data without the header that says where it begins.
        const auto noHeader = binaryBody(values, 2);
        const auto a = httpRequest(port, "POST", "/v2/models/digits/infer",
                                   noHeader.body.substr(0, noHeader.jsonLength));
        CHECK(a.status == 400);
        CHECK(a.body.find("Inference-Header-Content-Length") != std::string::npos);
        // Both `data` and binary bytes for one input.
        json both = json::parse(text);
        both["inputs"][0]["parameters"] = {{"binary_data_size", 512}};
        BinaryRequest b{both.dump(), 0};
        b.jsonLength = b.body.size();
        b.body.append(reinterpret_cast<const char*>(values.data()), 512);
        const auto c = postBinary(port, b);
        CHECK(c.status == 400);
        CHECK(c.body.find("both `data` and `binary_data_size`") != std::string::npos);
    }
    CHECK(httpGet(port, "/v2/health/live").status == 200);
}

TEST_CASE("a client that stalls mid-request is dropped after the timeout, others are served meanwhile",
          "[serving]") {
    test::ServingWorkspace ws;
    core::ServeOptions o;
    o.idleTimeoutS = 1;
    const auto server = ws.serve(o);
    std::string stalled;
    const auto t0 = std::chrono::steady_clock::now();
    double stalledS = 0;
    std::thread slow([&] {
        stalled = rawExchange(
            server->port(),
            "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", 8);
        stalledS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(1)).status == 200);
    slow.join();
    CHECK(stalled.find("408") != std::string::npos);
    CHECK(stalled.find("\"error\"") != std::string::npos);
    CHECK(stalledS < 6);  // dropped after about 1 s, not held until the client gave up (8 s)
    // An idle keep-alive connection that never starts a request is closed silently.
    CHECK(rawExchange(server->port(), "", 8).empty());
}

TEST_CASE("concurrent single-row requests are batched together", "[serving]") {
    test::ServingWorkspace ws;
    core::ServeOptions o;
    o.batching = "fixed";  // adaptive would run the first arrivals at once, alone
    o.maxBatch = 16;
    o.maxDelayMs = 200;  // generous: all 12 requests arrive well within it
    o.ioThreads = 4;
    const auto server = ws.serve(o);
    std::vector<std::thread> clients;
    std::atomic<int> ok{0};
    for (int i = 0; i < 12; ++i)
        clients.emplace_back([&] {
            if (httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(1)).status == 200)
                ++ok;
        });
    for (auto& c : clients) c.join();
    CHECK(ok == 12);
    const auto m = httpGet(server->port(), "/metrics").body;
    const auto batches = metricValue(m, "lathe_batch_size_count{model=\"digits\",version=\"1\"}");
    CHECK(metricValue(m, "lathe_batch_size_sum{model=\"digits\",version=\"1\"}") == 12);
    CHECK(batches >= 1);
    CHECK(batches <= 4);  // one row per batch would be 12
    // The forward's CPU on the worker's thread: some, and no more than the forward's wall time
    // (both cover the same code; CPU time excludes waiting for a core).
    const double cpu = metricDouble(m, "lathe_compute_cpu_seconds_total{model=\"digits\",version=\"1\"}");
    const double wall = metricDouble(m, "lathe_compute_duration_seconds_sum{model=\"digits\",version=\"1\"}");
    CHECK(cpu > 0);
    CHECK(cpu <= wall * 1.05 + 1e-4);
}

TEST_CASE("adaptive batching runs a lone request at once, fixed holds it for the delay", "[serving]") {
    test::ServingWorkspace ws;
    const char* queued = "lathe_queue_duration_seconds_sum{model=\"digits\",version=\"1\"}";
    const char* batches = "lathe_batch_size_count{model=\"digits\",version=\"1\"}";
    core::ServeOptions o;
    o.maxBatch = 16;
    o.maxDelayMs = 1500;  // a fixed batch of one waits this long; an adaptive one never does
    {
        const auto server = ws.serve(o);  // adaptive, the default
        for (int i = 0; i < 5; ++i)
            REQUIRE(httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(1)).status ==
                    200);
        const auto m = httpGet(server->port(), "/metrics").body;
        CHECK(metricValue(m, batches) == 5);
        // Five requests, one after another, each taken by the idle worker as it came: their
        // queueing together is a small fraction of one delay (each would wait 1.5 s under fixed).
        CHECK(metricDouble(m, queued) < 0.75);
    }
    o.batching = "fixed";
    const auto server = ws.serve(o);
    REQUIRE(httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(1)).status == 200);
    const auto m = httpGet(server->port(), "/metrics").body;
    CHECK(metricValue(m, batches) == 1);
    CHECK(metricDouble(m, queued) >= 1.4);
    // An unknown policy is refused up front.
    core::ServeOptions bad;
    bad.batching = "eager";
    CHECK_THROWS_WITH(core::InferenceServer(bad), Catch::Contains("--batching 'eager'"));
}

TEST_CASE("several model instances run batches at once and keep every answer to its own request",
          "[serving]") {
    // Wide layers: a batch's forward lasts long enough (about a millisecond) for instances to overlap.
    test::ServingWorkspace ws(1, {1024, 1024, 1024});
    // Reference answers, one request at a time, from a single-instance server.
    std::vector<std::vector<double>> expected;
    {
        const auto one = ws.serve();
        for (int r = 0; r < 16; ++r) {
            const auto a =
                httpRequest(one->port(), "POST", "/v2/models/digits/infer", inferBody(1, 0.05f * r));
            REQUIRE(a.status == 200);
            expected.push_back(json::parse(a.body)["outputs"][0]["data"].get<std::vector<double>>());
        }
    }
    core::ServeOptions o;
    o.instances = 3;
    o.maxBatch = 4;
    o.maxDelayMs = 2;
    o.ioThreads = 4;
    const auto server = ws.serve(o);
    std::atomic<int> ok{0}, wrong{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 8; ++t)
        clients.emplace_back([&, t] {
            for (int i = 0; i < 20; ++i) {
                const int r = (t * 7 + i) % 16;
                const auto a =
                    httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(1, 0.05f * r));
                if (a.status != 200) continue;
                ++ok;
                const auto got = json::parse(a.body)["outputs"][0]["data"].get<std::vector<double>>();
                for (size_t k = 0; k < got.size(); ++k)
                    if (std::fabs(got[k] - expected[r][k]) > 1e-4) {
                        ++wrong;
                        break;
                    }
            }
        });
    for (auto& c : clients) c.join();
    CHECK(ok == 160);
    CHECK(wrong == 0);  // a batch buffer shared between instances would mix rows across requests
    const auto m = httpGet(server->port(), "/metrics").body;
    CHECK(metricValue(m, "lathe_batch_size_sum{model=\"digits\",version=\"1\"}") == 160);
    // A hot swap loads the new version with as many instances, and it serves.
    server->load({"digits", ws.version().version, ws.version().path});
    CHECK(httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(2)).status == 200);
    CHECK_THROWS_WITH(core::InferenceServer([] {
                          core::ServeOptions bad;
                          bad.instances = 0;
                          return bad;
                      }()),
                      Catch::Contains("--instances"));
}

TEST_CASE(
    "serve --optimize: the optimized graph answers as the model does, and auto keeps it only when faster",
    "[serving]") {
    // Wide layers in Lathe's export form (addmm with W.t(), like nn.Linear): the optimized graph
    // runs them on weights transposed once, faster than LibTorch's default on a CPU.
    test::ServingWorkspace ws(1, {1024, 1024});
    auto answers = [](uint16_t port) {
        std::vector<std::vector<double>> out;
        for (int r = 0; r < 8; ++r) {
            const auto a =
                httpRequest(port, "POST", "/v2/models/digits/infer", inferBody(1 + r % 3, 0.1f * r));
            REQUIRE(a.status == 200);
            out.push_back(json::parse(a.body)["outputs"][0]["data"].get<std::vector<double>>());
        }
        return out;
    };
    core::ServeOptions o;
    o.device = "cpu";  // the rewrite is for CPUs; on a GPU the module runs as loaded
    o.optimize = "off";
    const auto plain = ws.serve(o);
    CHECK(plain->optimization("digits").empty());
    const auto expected = answers(plain->port());
    for (const char* mode : {"on", "auto"}) {
        INFO(mode);
        o.optimize = mode;
        const auto server = ws.serve(o);
        const auto note = server->optimization("digits");
        if (std::string(mode) == "on") {
            CHECK(note.rfind("optimized for inference: ", 0) == 0);
        } else {
            // Which one auto keeps depends on this machine's timing; it says which and why.
            CHECK((note.rfind("optimized for inference: ", 0) == 0 ||
                   note.rfind("kept as loaded: the optimized graph is not faster", 0) == 0));
        }
        CHECK(note.find(" per 32-row batch, ") != std::string::npos);
        CHECK(note.find(" per row") != std::string::npos);
        const auto got = answers(server->port());
        REQUIRE(got.size() == expected.size());
        for (size_t r = 0; r < got.size(); ++r) {
            REQUIRE(got[r].size() == expected[r].size());
            for (size_t k = 0; k < got[r].size(); ++k)
                CHECK(got[r][k] == Approx(expected[r][k]).margin(1e-4));
        }
        // A hot swap optimises the new version the same way.
        server->load({"digits", ws.version().version, ws.version().path});
        CHECK(!server->optimization("digits").empty());
        CHECK(httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(2)).status == 200);
    }
    CHECK_THROWS_WITH(core::InferenceServer([] {
                          core::ServeOptions bad;
                          bad.optimize = "fast";
                          return bad;
                      }()),
                      Catch::Contains("--optimize 'fast': use auto, on or off"));
    const auto r =
        test::runShell(test::binPath("lathectl") + " serve --model digits --optimize fast --db " + ws.db());
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("--optimize") != std::string::npos);
}

TEST_CASE("an overloaded server answers 503 with Retry-After and stays up", "[serving]") {
    test::ServingWorkspace ws;
    core::ServeOptions o;
    o.maxBatch = 1;
    o.maxQueue = 1;
    o.maxDelayMs = 0;
    o.ioThreads = 4;
    const auto server = ws.serve(o);
    std::map<int, int> codes;
    std::mutex mutex;
    std::vector<std::thread> clients;
    for (int t = 0; t < 16; ++t)
        clients.emplace_back([&] {
            for (int i = 0; i < 20; ++i) {
                const auto a = httpRequest(server->port(), "POST", "/v2/models/digits/infer", inferBody(1));
                std::lock_guard<std::mutex> lk(mutex);
                ++codes[a.status];
            }
        });
    for (auto& c : clients) c.join();
    CHECK(codes[200] > 0);
    CHECK(codes[503] > 0);
    CHECK(codes[200] + codes[503] == 320);                // nothing else: no dropped connection, no 500
    const auto raw = rawExchange(server->port(), "", 0);  // connect/close: server still accepts
    (void)raw;
    CHECK(httpGet(server->port(), "/v2/health/ready").status == 200);
}

TEST_CASE("hot swap under load: zero failed requests, a failed load keeps the old version", "[serving]") {
    test::ServingWorkspace ws;
    // Version 2: another run of the same model (different weights), so that every answer shows
    // which version computed it: it must be the one its model_version names. A batch that mixed
    // versions, or ran on one and was labelled with the other, gives answers that match neither.
    const auto v2 = registerOtherWeights(ws);
    const auto refs = versionReferences(ws.version(), v2);
    core::ServeOptions o;
    o.ioThreads = 4;
    o.maxDelayMs = 2;
    const auto server = ws.serve(o);
    std::atomic<bool> stop{false};
    std::atomic<int> failed{0}, total{0}, mismatched{0};
    std::mutex mutex;
    std::map<std::string, int> versions;
    std::string firstMismatch;
    std::vector<std::thread> clients;
    for (int t = 0; t < 6; ++t)
        clients.emplace_back([&, t] {
            for (int i = 0; !stop; ++i) {
                const int r =
                    (t + i) % kSwapInputs;  // concurrent requests differ: batches hold several inputs
                const auto a = httpRequest(server->port(), "POST", "/v2/models/digits/infer", swapInput(r));
                ++total;
                if (a.status != 200) {
                    ++failed;
                    continue;
                }
                std::string why;
                const bool right = answersAsLabelled(a.body, r, refs, 1e-4, why);
                std::lock_guard<std::mutex> lk(mutex);
                ++versions[json::parse(a.body)["model_version"].get<std::string>()];
                if (!right && mismatched++ == 0) firstMismatch = why;
            }
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    // Through the repository API, as `lathectl deploy` does.
    const auto load2 = httpRequest(server->port(), "POST", "/v2/repository/models/digits/load",
                                   R"({"parameters":{"version":"2"}})", 60);
    CHECK(load2.status == 200);
    CHECK(server->servedVersion("digits") == 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    // A version that does not exist, and one whose artifact was damaged: refused, v2 keeps serving.
    CHECK(httpRequest(server->port(), "POST", "/v2/repository/models/digits/load",
                      R"({"parameters":{"version":"9"}})")
              .status == 404);
    {
        core::Registry registry(ws.db());
        const auto v1 = registry.resolve({"digits", 1, {}});
        const auto copy = ws.file("damaged.pt");
        {
            std::ofstream out(copy, std::ios::binary);
            out << "not a model";
        }
        core::ModelVersion broken = v1;
        broken.path = copy;
        REQUIRE(registry.addVersion(broken).version == 3);
    }
    const auto load3 = httpRequest(server->port(), "POST", "/v2/repository/models/digits/load",
                                   R"({"parameters":{"version":3}})", 60);
    CHECK(load3.status == 500);
    CHECK(load3.body.find("keeps serving") != std::string::npos);
    CHECK(server->servedVersion("digits") == 2);
    // And back to 1, in-process this time.
    server->load({"digits", 1, ws.version().path});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
    for (auto& c : clients) c.join();
    CHECK(failed == 0);
    CHECK(total > 50);
    CHECK(versions["1"] > 0);
    CHECK(versions["2"] > 0);
    INFO(firstMismatch);
    CHECK(mismatched == 0);
    CHECK(versions.size() == 2);  // the damaged v3 never answered
}

namespace {

// One request of the swap inputs as user `user` (X-User-Id, or the body's `user_id` parameter):
// the version that answered, after checking that the answer is that version's and that the
// header says the same; -1 when the request failed.
int askAs(uint16_t port, const std::string& user, int r,
          const std::map<std::string, std::vector<std::vector<double>>>& refs, bool inBody = false,
          const std::string& target = "/v2/models/digits/infer") {
    std::string body = swapInput(r);
    test::HttpHeaders headers;
    if (inBody) {
        auto j = json::parse(body);
        j["parameters"] = {{"user_id", user}};
        body = j.dump();
    } else if (!user.empty()) {
        headers.push_back({"X-User-Id", user});
    }
    const auto a = httpRequest(port, "POST", target, body, 5, headers);
    if (a.status != 200) return -1;
    std::string why;
    if (!answersAsLabelled(a.body, r, refs, 1e-4, why)) return -1;
    const std::string v = json::parse(a.body)["model_version"].get<std::string>();
    const auto h = a.headers.find("x-model-version");
    if (h == a.headers.end() || h->second != v) return -1;
    return std::stoi(v);
}

test::HttpAnswer rollout(uint16_t port, const std::string& body) {
    return httpRequest(port, "POST", "/v2/repository/models/digits/rollout", body, 60);
}

}  // namespace

TEST_CASE(
    "a rollout serves two versions side by side: sticky per user, consistent as the weight rises, "
    "abort and promote lose no request",
    "[serving][rollout]") {
    test::ServingWorkspace ws;
    const auto v2 = registerOtherWeights(ws);
    const auto refs = versionReferences(ws.version(), v2);
    core::ServeOptions o;
    o.maxDelayMs = 2;
    const auto server = ws.serve(o);
    const auto port = server->port();

    // Bad requests change nothing.
    struct Bad {
        const char* body;
        int status;
        const char* says;
    };
    for (const Bad& b : std::vector<Bad>{
             {R"({"candidate":{"version":1},"weight_bp":500})", 400, "version served now"},
             {R"({"candidate":{"version":2},"weight_bp":20000})", 400, "0 to 10000"},
             {R"({"candidate":{"version":2},"weight_bp":"5%"})", 400, "integer"},
             {R"({"candidate":{"version":9},"weight_bp":500})", 404, "9"},
             {R"({"candidate":{"version":2},"user_parameter":7})", 400, "user_parameter"},
             {R"({"weight_bp":100})", 400, "no rollout"},
             {R"({"end":"abort"})", 400, "no rollout"},
             {R"({"end":"later"})", 400, "abort"},
             {R"({})", 400, "say what to do"},
             {R"([1])", 400, "object"},
         }) {
        INFO(b.body);
        const auto a = rollout(port, b.body);
        CHECK(a.status == b.status);
        CHECK_THAT(a.body, Catch::Contains(b.says));
    }
    auto state = json::parse(httpGet(port, "/v2/repository/models/digits/rollout").body);
    CHECK(state["baseline"] == 1);
    CHECK(state["candidate"] == 0);

    // Clients without a user id all along: every request answered, by the version it names.
    std::atomic<bool> stop{false};
    std::atomic<int> failed{0}, total{0};
    std::mutex mutex;
    std::map<int, int> randomVersions;
    std::vector<std::thread> clients;
    for (int t = 0; t < 3; ++t)
        clients.emplace_back([&, t] {
            for (int i = 0; !stop; ++i) {
                const int v = askAs(port, "", (t + i) % kSwapInputs, refs);
                ++total;
                if (v < 0) ++failed;
                std::lock_guard<std::mutex> lk(mutex);
                ++randomVersions[v];
            }
        });

    auto a = rollout(port, R"({"candidate":{"version":2},"weight_bp":2000,"user_parameter":"user_id"})");
    REQUIRE(a.status == 200);
    state = json::parse(a.body);
    CHECK(state["baseline"] == 1);
    CHECK(state["candidate"] == 2);
    CHECK(state["weight_bp"] == 2000);

    constexpr int kUsers = 300;
    const auto user = [](int i) { return "user-" + std::to_string(i); };
    std::vector<int> at20(kUsers);
    int onCandidate = 0;
    for (int i = 0; i < kUsers; ++i) {
        at20[i] = askAs(port, user(i), i % kSwapInputs, refs);
        REQUIRE(at20[i] > 0);
        onCandidate += at20[i] == 2;
    }
    // About 20% (60 of 300, ±3 sigma ≈ 21).
    CHECK(onCandidate > 38);
    CHECK(onCandidate < 82);
    // Sticky: asked again, by header or by the rollout's request parameter, the same version.
    for (int i = 0; i < 60; ++i) {
        CHECK(askAs(port, user(i), (i + 1) % kSwapInputs, refs) == at20[i]);
        CHECK(askAs(port, user(i), (i + 2) % kSwapInputs, refs, true) == at20[i]);
    }
    // A version named in the path is reached directly, whatever the split.
    CHECK(askAs(port, user(0), 0, refs, false, "/v2/models/digits/versions/2/infer") == 2);
    CHECK(askAs(port, user(0), 0, refs, false, "/v2/models/digits/versions/1/infer") == 1);
    a = httpRequest(port, "POST", "/v2/models/digits/versions/3/infer", swapInput(0));
    CHECK(a.status == 404);
    CHECK_THAT(a.body, Catch::Contains("in a rollout, 2"));

    // 20% -> 50%: only baseline users move.
    REQUIRE(rollout(port, R"({"weight_bp":5000})").status == 200);
    int moved = 0, movedBack = 0;
    for (int i = 0; i < kUsers; ++i) {
        const int v = askAs(port, user(i), i % kSwapInputs, refs);
        REQUIRE(v > 0);
        movedBack += at20[i] == 2 && v == 1;
        moved += at20[i] == 1 && v == 2;
    }
    CHECK(movedBack == 0);
    CHECK(moved > 50);
    const auto metrics = httpGet(port, "/metrics").body;
    CHECK(metricValue(metrics, "lathe_rollout_weight_bp{model=\"digits\",version=\"2\"}") == 5000);
    CHECK(metricValue(metrics, "lathe_routed_requests_total{by=\"user\",model=\"digits\",version=\"2\"}") >
          0);
    CHECK(metricValue(metrics, "lathe_routed_requests_total{by=\"user\",model=\"digits\",version=\"1\"}") >
          0);
    CHECK(metricValue(metrics, "lathe_routed_requests_total{by=\"random\",model=\"digits\",version=\"2\"}") >
          0);
    CHECK(metricValue(metrics, "lathe_requests_total{code=\"200\",model=\"digits\",version=\"2\"}") > 0);

    // Abort: the current version serves everyone again.
    a = rollout(port, R"({"end":"abort"})");
    REQUIRE(a.status == 200);
    CHECK(json::parse(a.body)["candidate"] == 0);
    for (int i = 0; i < 40; ++i) CHECK(askAs(port, user(i), i % kSwapInputs, refs) == 1);

    // Again, then promote: v2 is loaded as the current version and the rollout ends.
    REQUIRE(rollout(port, R"({"candidate":{"version":2},"weight_bp":500})").status == 200);
    a = rollout(port, R"({"end":"promote"})");
    REQUIRE(a.status == 200);
    state = json::parse(a.body);
    CHECK(state["baseline"] == 2);
    CHECK(state["candidate"] == 0);
    CHECK(server->servedVersion("digits") == 2);
    for (int i = 0; i < 40; ++i) CHECK(askAs(port, user(i), i % kSwapInputs, refs) == 2);
    CHECK(httpRequest(port, "POST", "/v2/models/digits/versions/1/infer", swapInput(0)).status == 404);

    stop = true;
    for (auto& c : clients) c.join();
    CHECK(failed == 0);
    CHECK(total > 30);
    CHECK(randomVersions[1] > 0);
    CHECK(randomVersions[2] > 0);
}

TEST_CASE("lathectl deploy, rollback and undeploy under steady load lose no request", "[serving][cli]") {
    test::ServingWorkspace ws;
    const std::string db = " --db " + ws.db();
    // v2 from another run (other weights): every answer must be the labelled version's.
    REQUIRE(test::runShell(test::binPath("lathectl") + " models register digits --run " +
                           std::to_string(trainOtherWeights(ws)) + db)
                .exitCode == 0);
    const auto refs = versionReferences(ws.version(), core::Registry(ws.db()).resolve({"digits", 2, {}}));
    auto r = test::runShell(test::binPath("lathectl") + " deploy digits:1 --port 0 --json" + db);
    // --port 0 means "pick": the server gets the first free port from 8500 upwards.
    REQUIRE(r.exitCode == 0);
    const auto dep = json::parse(r.out);
    const std::string url = dep["url"].get<std::string>();
    CHECK(dep["started_server"] == true);
    const auto port = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
    // Server flags cannot reach a live server (a version change hot-swaps it): refused, not ignored.
    r = test::runShell(test::binPath("lathectl") + " deploy digits:2 --max-batch 8" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("--max-batch would not apply") != std::string::npos);
    r = test::runShell(test::binPath("lathectl") + " deploy digits:2 --ready-timeout nan" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("--ready-timeout must be a positive number") != std::string::npos);

    core::LoadOptions lo;
    lo.url = url;
    lo.model = "digits";
    lo.rate = 150;
    lo.durationS = 4;
    lo.users = 4;
    core::LoadReport report;
    std::thread load([&] { report = core::runLoad(lo); });
    // Beside the load, two clients check every answer against the version it is labelled with.
    std::atomic<bool> stop{false};
    std::atomic<int> checkedFailed{0}, mismatched{0};
    std::mutex mutex;
    std::map<std::string, int> versions;
    std::string firstMismatch;
    std::vector<std::thread> checkers;
    for (int t = 0; t < 2; ++t)
        checkers.emplace_back([&, t] {
            for (int i = 0; !stop; ++i) {
                const int input = (3 * t + i) % kSwapInputs;
                const auto a = httpRequest(port, "POST", "/v2/models/digits/infer", swapInput(input));
                if (a.status != 200) {
                    ++checkedFailed;
                    continue;
                }
                std::string why;
                // Another process (on a GPU where there is one): a little more room than in-process.
                const bool right = answersAsLabelled(a.body, input, refs, 1e-3, why);
                std::lock_guard<std::mutex> lk(mutex);
                ++versions[json::parse(a.body)["model_version"].get<std::string>()];
                if (!right && mismatched++ == 0) firstMismatch = why;
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    r = test::runShell(test::binPath("lathectl") + " deploy digits:2 --json" + db);
    CHECK(r.exitCode == 0);
    CHECK(json::parse(r.out)["started_server"] == false);
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    r = test::runShell(test::binPath("lathectl") + " rollback digits --json" + db);
    CHECK(r.exitCode == 0);
    CHECK(json::parse(r.out)["version"] == 1);
    load.join();
    stop = true;
    for (auto& c : checkers) c.join();
    CHECK(report.sent > 300);
    CHECK(report.errors == 0);
    CHECK(report.ok == report.sent);
    CHECK(checkedFailed == 0);
    CHECK(versions["1"] > 0);
    CHECK(versions["2"] > 0);
    INFO(firstMismatch);
    CHECK(mismatched == 0);

    r = test::runShell(test::binPath("lathectl") + " deployments digits --json" + db);
    REQUIRE(r.exitCode == 0);
    const auto hist = json::parse(r.out);
    REQUIRE(hist.size() == 3);
    CHECK(hist[0]["action"] == "rollback");
    CHECK(hist[0]["up"] == true);
    CHECK(hist[1]["end_reason"] == "replaced by v1");
    // A rollback with nothing earlier than v1 in the way: v2 is the previous one now.
    r = test::runShell(test::binPath("lathectl") + " undeploy digits" + db);
    CHECK(r.exitCode == 0);
    const auto pid = dep["pid"].get<int64_t>();
    CHECK_FALSE(running(pid));
    r = test::runShell(test::binPath("lathectl") + " rollback digits" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("not deployed") != std::string::npos);
    r = test::runShell(test::binPath("lathectl") + " deploy digits:9" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("no version 9") != std::string::npos);
}

TEST_CASE("a deployed server's metrics are scraped into the workspace and alert rules fire and resolve",
          "[serving][cli]") {
    test::ServingWorkspace ws;
    const std::string db = " --db " + ws.db();
    const auto rules = ws.file("rules.toml");
    {
        std::ofstream out(rules);
        out << "p99_threshold_ms = 0.001\np99_samples = 2\n";  // any traffic breaks it
    }
    std::ofstream(ws.file("bad.toml")) << "p99_threshold_ms = \"fast\"\n";
    auto r = test::runShell(test::binPath("lathectl") + " deploy digits --alert-rules " +
                            ws.file("bad.toml") + db);
    CHECK(r.exitCode == 2);  // refused before any server starts
    r = test::runShell(test::binPath("lathectl") + " deploy digits --json --alert-rules " + rules + db);
    REQUIRE(r.exitCode == 0);
    const auto url = json::parse(r.out)["url"].get<std::string>();
    core::LoadOptions lo;
    lo.url = url;
    lo.model = "digits";
    lo.rate = 100;
    lo.durationS = 4;
    const auto report = core::runLoad(lo);
    CHECK(report.errors == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the last interval is scraped
    core::Registry registry(ws.db());
    const auto qps = registry.servingMetrics("digits", "qps");
    const auto p99 = registry.servingMetrics("digits", "p99_ms");
    CHECK(registry.servingMetrics("digits", "up").size() >= 6);
    REQUIRE(p99.size() >= 2);
    double peak = 0;
    for (const auto& p : qps) peak = std::max(peak, p.value);
    CHECK(peak > 50);  // about 100 requests per second while the load ran
    CHECK(peak < 200);
    CHECK(p99.front().version == 1);
    const auto alerts = registry.alerts("digits");
    REQUIRE_FALSE(alerts.empty());
    CHECK(alerts.back().rule == "p99_latency");
    CHECK(alerts.back().message.find("above 0.001 ms") != std::string::npos);
    CHECK(test::runShell(test::binPath("lathectl") + " undeploy digits" + db).exitCode == 0);
    // Watching ended with the server: nothing is left firing.
    for (const auto& a : registry.alerts("digits")) CHECK(a.resolvedAt >= a.firedAt);
}

TEST_CASE("served answers equal PyTorch's own for a run's artifact and for a model traced in Python",
          "[serving][cli]") {
    if (test::runShell("/usr/bin/python3 -c 'import torch'").exitCode != 0)
        LATHE_SKIP("python3-torch is not installed");
    test::ServingWorkspace ws;
    // A model made by PyTorch users: traced in Python, registered with its input shape.
    const auto traced = ws.file("traced.pt");
    auto r = test::runShell(
        "/usr/bin/python3 -c \"import torch; torch.manual_seed(3); "
        "m=torch.nn.Sequential(torch.nn.Linear(12,16),torch.nn.Tanh(),torch.nn.Linear(16,3)); "
        "torch.jit.trace(m, torch.zeros(1,12)).save('" +
        traced + "')\"");
    REQUIRE(r.exitCode == 0);
    r = test::runShell(test::binPath("lathectl") + " models register traced --file " + traced + " --db " +
                       ws.db());
    CHECK(r.exitCode == 2);  // no Lathe metadata and no --input-shape: refused, saying what to add
    CHECK(r.err.find("--input-shape") != std::string::npos);
    r = test::runShell(test::binPath("lathectl") + " models register traced --file " + traced +
                       " --input-shape 12 --json --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    const auto tracedPath = json::parse(r.out)["path"].get<std::string>();
    CHECK(json::parse(r.out)["signature"]["outputs"][0]["shape"] == json({-1, 3}));

    core::ServeOptions o;
    o.port = 0;
    core::InferenceServer server(o);
    server.load({"digits", 1, ws.version().path});
    server.load({"traced", 1, tracedPath});
    const auto port = server.start();

    struct Case {
        std::string model, artifact;
        std::vector<int64_t> shape;
    };
    for (const Case& c :
         {Case{"digits", ws.version().path, {3, 1, 8, 8}}, Case{"traced", tracedPath, {3, 12}}}) {
        INFO(c.model);
        int64_t n = 1;
        for (auto d : c.shape) n *= d;
        json data = json::array();
        for (int64_t i = 0; i < n; ++i) data.push_back(std::sin(0.37 * static_cast<double>(i)) * 0.5 + 0.5);
        const json body{
            {"inputs", {{{"name", "input"}, {"shape", c.shape}, {"datatype", "FP32"}, {"data", data}}}}};
        const auto a = httpRequest(port, "POST", "/v2/models/" + c.model + "/infer", body.dump());
        REQUIRE(a.status == 200);
        const auto served = json::parse(a.body)["outputs"][0]["data"];
        // The same artifact and input through PyTorch (Debian's python3-torch), eagerly.
        std::string shape;
        for (auto d : c.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        const auto inFile = ws.file(c.model + "-in.json");
        std::ofstream(inFile) << data.dump();
        r = test::runShell("/usr/bin/python3 -c \"import torch,json; m=torch.jit.load('" + c.artifact +
                           "'); x=torch.tensor(json.load(open('" + inFile +
                           "')),dtype=torch.float32).reshape(" + shape +
                           "); print(json.dumps(m(x).flatten().tolist()))\"");
        REQUIRE(r.exitCode == 0);
        const auto expected = json::parse(r.out);
        REQUIRE(expected.size() == served.size());
        for (size_t i = 0; i < served.size(); ++i)
            CHECK(served[i].get<double>() == Approx(expected[i].get<double>()).margin(1e-5));
    }
}

TEST_CASE("a deployment whose server died shows DOWN, and deploying again starts a new one",
          "[serving][cli]") {
    test::ServingWorkspace ws;
    const std::string db = " --db " + ws.db();
    auto r = test::runShell(test::binPath("lathectl") + " deploy digits --json" + db);
    REQUIRE(r.exitCode == 0);
    const auto first = json::parse(r.out);
    const auto pid = first["pid"].get<int64_t>();
    REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
    for (int i = 0; i < 50 && running(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    r = test::runShell(test::binPath("lathectl") + " deployments digits --json" + db);
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out)[0]["live"] == true);
    CHECK(json::parse(r.out)[0]["up"] == false);
    r = test::runShell(test::binPath("lathectl") + " deployments digits" + db);
    CHECK(r.out.find("DOWN") != std::string::npos);
    r = test::runShell(test::binPath("lathectl") + " deploy digits --json" + db);
    REQUIRE(r.exitCode == 0);
    const auto second = json::parse(r.out);
    CHECK(second["started_server"] == true);
    CHECK(second["pid"] != first["pid"]);
    r = test::runShell(test::binPath("lathectl") + " deployments digits --json" + db);
    const auto hist = json::parse(r.out);
    REQUIRE(hist.size() == 2);
    CHECK(hist[0]["up"] == true);
    CHECK(hist[1]["end_reason"] == "server not running");
    CHECK(test::runShell(test::binPath("lathectl") + " undeploy digits" + db).exitCode == 0);
}

namespace {

// Starts `program` with `args` (argv[0] first) in `dir`, in its own process group (so that a
// shell and its children go together), stdin and output on /dev/null.
pid_t spawnQuiet(const std::string& program, const std::vector<std::string>& args, const std::string& dir) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setpgid(0, 0);
        const int null = ::open("/dev/null", O_RDWR);
        ::dup2(null, 0);
        ::dup2(null, 1);
        ::dup2(null, 2);
        if (::chdir(dir.c_str()) != 0) ::_exit(126);
        ::execv(program.c_str(), argv.data());
        ::_exit(127);
    }
    return pid;
}

// Kills and reaps a spawnQuiet process group when the test ends, however it ends.
struct GroupKiller {
    pid_t pid;
    ~GroupKiller() {
        if (pid <= 0) return;
        ::kill(-pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
};

// A loopback port nothing listens on: bound, read, released.
uint16_t unusedPort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    ::close(fd);
    return ntohs(a.sin_port);
}

// The file name of the program `pid` runs (its /proc/PID/exe), "" when unreadable.
std::string exeName(pid_t pid) {
    std::error_code ec;
    return std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).filename().string();
}

}  // namespace

TEST_CASE("undeploy signals only the deployment's own lathectl serve, never a process that reused its pid",
          "[serving][deploy]") {
    test::ServingWorkspace ws;
    core::Registry registry(ws.db());
    auto record = [&](const std::string& instance, int64_t pid) {
        core::Deployment d;
        d.model = "digits";
        d.version = 1;
        d.url = "http://127.0.0.1:9";  // nothing answers there
        d.target = "local";
        d.instance = instance;
        d.pid = pid;
        registry.recordDeployment(d);
    };
    auto endReason = [&] { return registry.deployments("digits").front().endReason; };

    // A real server, started as deploy starts one but with its own nonce "other".
    const auto port = unusedPort();
    const pid_t server = spawnQuiet(test::binPath("lathectl"),
                                    {test::binPath("lathectl"), "serve", "--db", ws.db(), "--model",
                                     "digits:1", "--port", std::to_string(port), "--instance-id", "other"},
                                    ws.dir().path());
    REQUIRE(server > 0);
    const GroupKiller serverKiller{server};
    auto ready = [&] { return httpGet(port, "/v2/health/ready").status == 200; };
    for (int i = 0; i < 300 && running(server) && !ready(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(ready());
    REQUIRE(exeName(server) == "lathectl");
    // An impostor: `lathectl serve --instance-id other` to anyone reading its arguments (argv[0]
    // is whatever its starter chose, and `serve` is a script beside it), but run by /bin/sh.
    test::writeFile(ws.file("serve"), "sleep 30\nexit 0\n");
    const pid_t impostor =
        spawnQuiet("/bin/sh", {"lathectl", "serve", "--instance-id", "other"}, ws.dir().path());
    REQUIRE(impostor > 0);
    const GroupKiller impostorKiller{impostor};
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    REQUIRE(running(impostor));
    {
        std::ifstream in("/proc/" + std::to_string(impostor) + "/cmdline", std::ios::binary);
        std::vector<std::string> args;
        for (std::string a; std::getline(in, a, '\0');) args.push_back(a);
        REQUIRE(args == std::vector<std::string>{"lathectl", "serve", "--instance-id", "other"});
        REQUIRE(exeName(impostor) != "lathectl");
    }

    // lathectl serve, but another deployment's nonce: left alone.
    record("mine", server);
    core::undeploy(registry, "digits");
    CHECK(running(server));
    CHECK(ready());
    CHECK(endReason() == "undeployed");

    // The right arguments and nonce in a process that is not lathectl: left alone.
    record("other", impostor);
    core::undeploy(registry, "digits");
    CHECK(running(impostor));
    CHECK(endReason() == "undeployed");

    // A record without a nonce (from before the workspace stored one) is never trusted, even when
    // its pid runs a `lathectl serve` of the model: the record is ended, nothing is signalled, and
    // the error tells the user how to stop that process by hand.
    record("", server);
    CHECK_THROWS_WITH(core::undeploy(registry, "digits"),
                      Catch::Contains("recorded without an instance id") &&
                          Catch::Contains("kill " + std::to_string(server)));
    CHECK(running(server));
    CHECK(ready());
    CHECK(endReason() == "undeployed; recorded without an instance id: not trusted as running");
    CHECK_FALSE(registry.liveDeployment("digits").has_value());
    // ... and quietly when nothing under its pid looks like its server.
    record("", impostor);
    CHECK_NOTHROW(core::undeploy(registry, "digits"));
    CHECK(running(impostor));
    CHECK_FALSE(registry.liveDeployment("digits").has_value());

    // The record names the server's own nonce: it is stopped.
    record("other", server);
    const auto t0 = std::chrono::steady_clock::now();
    core::undeploy(registry, "digits");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(12));
    CHECK_FALSE(running(server));
    CHECK(endReason() == "undeployed");
}

// ---- the control API's token -----------------------------------------------------------------

namespace {

// v1's artifact registered again as digits v2: a second version to load that costs no training.
int64_t registerAgain(const test::ServingWorkspace& ws) {
    core::Registry registry(ws.db());
    return registry.addVersion(registry.resolve({"digits", 1, {}})).version;
}

const std::string kLoad = "/v2/repository/models/digits/load";
const std::string kLoadV2 = R"({"parameters":{"version":"2"}})";

test::HttpHeaders bearer(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

// /proc/PID/cmdline or environ ("" when unreadable).
std::string procFile(int64_t pid, const std::string& name) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/" + name, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string servedVersionOf(uint16_t port) {
    const auto a = httpGet(port, "/v2/models/digits");
    return a.status == 200 ? json::parse(a.body)["versions"][0].get<std::string>() : "";
}

// Inference, health, metadata and metrics: never gated.
void checkOpenEndpoints(uint16_t port) {
    CHECK(httpGet(port, "/v2/health/live").status == 200);
    CHECK(httpGet(port, "/v2/health/ready").status == 200);
    CHECK(httpGet(port, "/v2").status == 200);
    CHECK(httpGet(port, "/v2/models/digits").status == 200);
    CHECK(httpGet(port, "/v2/models/digits/ready").status == 200);
    CHECK(httpRequest(port, "POST", "/v2/models/digits/infer", inferBody(1)).status == 200);
    CHECK(httpGet(port, "/metrics").status == 200);
}

}  // namespace

TEST_CASE("with a control token the repository API answers 401 without it, 403 with another, 200 with it",
          "[serving][auth]") {
    test::ServingWorkspace ws;
    REQUIRE(registerAgain(ws) == 2);
    const std::string token = "0123456789abcdef-the-control-token";
    // On loopback and beyond it alike: with a token, the token decides.
    for (const std::string host : {"127.0.0.1", "0.0.0.0"}) {
        INFO("host " << host);
        core::ServeOptions o;
        o.host = host;
        o.controlToken = token;
        const auto server = ws.serve(o);
        const auto port = server->port();

        auto a = httpRequest(port, "POST", kLoad, kLoadV2, 60);
        CHECK(a.status == 401);
        CHECK(a.headers["www-authenticate"].rfind("Bearer", 0) == 0);
        REQUIRE_FALSE(json::parse(a.body, nullptr, false).is_discarded());
        CHECK(json::parse(a.body)["error"].get<std::string>().find("Authorization: Bearer") !=
              std::string::npos);
        // Everything under /v2/repository, the index and what may come (unload) included.
        CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}").status == 401);
        CHECK(httpRequest(port, "POST", "/v2/repository/models/digits/unload", "{}").status == 401);
        CHECK(httpRequest(port, "POST", kLoad, kLoadV2, 60, {{"Authorization", "Basic " + token}}).status ==
              401);
        CHECK(httpRequest(port, "POST", kLoad, kLoadV2, 60, {{"Authorization", "Bearer"}}).status == 401);
        for (const std::string wrong :
             {std::string("wrong-token-0123456789abcdef"), token.substr(0, token.size() - 1), token + "0"}) {
            a = httpRequest(port, "POST", kLoad, kLoadV2, 60, bearer(wrong));
            CHECK(a.status == 403);
            CHECK(a.body.find("not this server's control token") != std::string::npos);
            CHECK(a.body.find(token.substr(0, 16)) == std::string::npos);  // neither token is echoed
        }
        CHECK(server->servedVersion("digits") == 1);  // nothing refused was loaded

        a = httpRequest(port, "POST", kLoad, kLoadV2, 60, bearer(token));
        CHECK(a.status == 200);
        CHECK(server->servedVersion("digits") == 2);
        CHECK(servedVersionOf(port) == "2");
        // The scheme in any case, spaces around the token.
        a = httpRequest(port, "POST", "/v2/repository/index", "{}", 5,
                        {{"Authorization", "bearer  " + token}});
        CHECK(a.status == 200);
        CHECK(a.body.find("\"2\"") != std::string::npos);
        checkOpenEndpoints(port);
    }
    // A weak or malformed token is refused, and not quoted back.
    core::ServeOptions o;
    o.controlToken = "short-secret";
    CHECK_THROWS_WITH(core::InferenceServer(o),
                      Catch::Contains("16 to 4096") && !Catch::Contains("short-secret"));
    o.controlToken = "a token with spaces in it";
    CHECK_THROWS_AS(core::InferenceServer(o), core::ConfigError);
}

TEST_CASE("without a token the repository API is refused beyond loopback and open on loopback",
          "[serving][auth]") {
    test::ServingWorkspace ws;
    REQUIRE(registerAgain(ws) == 2);
    {
        core::ServeOptions o;
        o.host = "0.0.0.0";
        const auto server = ws.serve(o);
        const auto port = server->port();
        const auto a = httpRequest(port, "POST", kLoad, kLoadV2, 60);
        CHECK(a.status == 403);
        REQUIRE_FALSE(json::parse(a.body, nullptr, false).is_discarded());
        const auto error = json::parse(a.body)["error"].get<std::string>();
        CHECK(error.find("needs a token") != std::string::npos);
        CHECK(error.find("0.0.0.0") != std::string::npos);
        CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}").status == 403);
        // A token the server does not have opens nothing either.
        CHECK(httpRequest(port, "POST", kLoad, kLoadV2, 60, bearer("0123456789abcdef0123")).status == 403);
        CHECK(server->servedVersion("digits") == 1);
        checkOpenEndpoints(port);
    }
    {
        // 127.0.0.1, as every local deployment before tokens: control stays open to this machine.
        const auto server = ws.serve();
        const auto port = server->port();
        CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}").status == 200);
        CHECK(httpRequest(port, "POST", kLoad, kLoadV2, 60).status == 200);
        CHECK(server->servedVersion("digits") == 2);
    }
    for (const char* host : {"127.0.0.1", "127.8.9.10", "::1", "localhost", "::ffff:127.0.0.1"}) {
        INFO(host);
        CHECK(core::isLoopbackHost(host));
    }
    for (const char* host :
         {"0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "::ffff:10.0.0.1", "fe80::1", "", "lan-host"}) {
        INFO(host);
        CHECK_FALSE(core::isLoopbackHost(host));
    }
}

TEST_CASE(
    "lathectl deploy gives its server a token of its own that hot swap and rollback use and nothing shows",
    "[serving][cli][auth]") {
    test::ServingWorkspace ws;
    REQUIRE(registerAgain(ws) == 2);
    const std::string db = " --db " + ws.db();
    std::string shown;  // everything lathectl printed
    auto lathectl = [&](const std::string& args) {
        auto r = test::runShell(test::binPath("lathectl") + " " + args + db);
        shown += r.out + r.err;
        return r;
    };
    auto r = lathectl("deploy digits:1 --port 0 --json");
    REQUIRE(r.exitCode == 0);
    const auto dep = json::parse(r.out);
    const auto url = dep["url"].get<std::string>();
    const auto port = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
    const auto pid = dep["pid"].get<int64_t>();
    const auto log = dep["log"].get<std::string>();
    core::Registry registry(ws.db());
    const auto live = registry.liveDeployment("digits");
    REQUIRE(live);
    const auto token = registry.deploymentToken(live->instance);
    REQUIRE(token.size() == 64);  // 32 random bytes in hex
    CHECK(token.find_first_not_of("0123456789abcdef") == std::string::npos);

    // The server demands it, on loopback too; inference and metrics do not.
    CHECK(httpRequest(port, "POST", kLoad, kLoadV2, 60).status == 401);
    CHECK(httpRequest(port, "POST", kLoad, kLoadV2, 60, bearer(std::string(64, '0'))).status == 403);
    CHECK(servedVersionOf(port) == "1");
    CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}", 5, bearer(token)).status == 200);
    checkOpenEndpoints(port);

    // Hot swap and rollback through lathectl, which sends the stored token.
    r = lathectl("deploy digits:2 --json");
    INFO(test::said(r));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out)["started_server"] == false);
    CHECK(servedVersionOf(port) == "2");
    // The same server keeps its token across the swap.
    CHECK(registry.deploymentToken(registry.liveDeployment("digits")->instance) == token);
    r = lathectl("rollback digits --json");
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out)["version"] == 1);
    CHECK(servedVersionOf(port) == "1");
    r = lathectl("deployments digits --json");
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).size() == 3);
    CHECK(lathectl("deployments").exitCode == 0);
    CHECK(lathectl("models list --json").exitCode == 0);
    CHECK(lathectl("models show digits").exitCode == 0);

    // Never shown: not by lathectl, not in the server's log, command line or environment (taken
    // from LATHE_SERVER_TOKEN and wiped at start).
    CHECK(shown.find(token) == std::string::npos);
    const auto logText = test::readFile(log);
    CHECK(logText.find("control API (/v2/repository: load, hot swap): needs the bearer token") !=
          std::string::npos);
    CHECK(logText.find(token) == std::string::npos);
    CHECK(procFile(pid, "cmdline").find(token) == std::string::npos);
    CHECK(procFile(pid, "environ").find(token) == std::string::npos);

    // Undeployed: the server stops and the workspace forgets its token.
    const auto instance = live->instance;
    CHECK(lathectl("undeploy digits").exitCode == 0);
    CHECK_FALSE(running(pid));
    CHECK(registry.deploymentToken(instance).empty());
    CHECK(shown.find(token) == std::string::npos);
}

TEST_CASE("a server deployed before tokens, with none stored, is still hot-swapped",
          "[serving][deploy][auth]") {
    test::ServingWorkspace ws;
    REQUIRE(registerAgain(ws) == 2);
    const auto port = unusedPort();
    const pid_t server =
        spawnQuiet(test::binPath("lathectl"),
                   {test::binPath("lathectl"), "serve", "--db", ws.db(), "--model", "digits:1", "--port",
                    std::to_string(port), "--instance-id", "before-tokens"},
                   ws.dir().path());
    REQUIRE(server > 0);
    const GroupKiller killer{server};
    auto ready = [&] { return httpGet(port, "/v2/health/ready").status == 200; };
    for (int i = 0; i < 300 && running(server) && !ready(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(ready());
    core::Registry registry(ws.db());
    core::Deployment d;
    d.model = "digits";
    d.version = 1;
    d.url = test::localUrl(port);
    d.target = "local";
    d.instance = "before-tokens";
    d.pid = server;
    registry.recordDeployment(d);
    REQUIRE(registry.deploymentToken("before-tokens").empty());
    const auto result = core::deploy(registry, {"digits", 2, {}}, core::DeployOptions{});
    CHECK_FALSE(result.started);
    CHECK(result.deployment.version == 2);
    CHECK(servedVersionOf(port) == "2");
    core::undeploy(registry, "digits");
    CHECK_FALSE(running(server));
}

TEST_CASE(
    "lathectl serve takes its token from LATHE_SERVER_TOKEN or a private --token-file and never shows it",
    "[serving][cli][auth]") {
    test::ServingWorkspace ws;
    const std::string token = "serve-token-0123456789abcdef0123";
    const auto lathectl = test::binPath("lathectl");
    const auto file = ws.file("token");
    test::writeFile(file, token + "\n");
    REQUIRE(::chmod(file.c_str(), 0644) == 0);
    const std::string serve =
        lathectl + " serve --model digits:1 --port " + std::to_string(unusedPort()) + " --db " + ws.db();
    auto r = test::runShell(serve + " --token-file " + file);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("chmod 600") != std::string::npos);
    CHECK((r.out + r.err).find(token) == std::string::npos);
    REQUIRE(::chmod(file.c_str(), 0600) == 0);
    r = test::runShell("LATHE_SERVER_TOKEN=other-token-0123456789abcdef " + serve + " --token-file " + file);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("not both") != std::string::npos);
    r = test::runShell(serve + " --token-file " + ws.file("missing"));
    CHECK(r.exitCode == 2);
    test::writeFile(ws.file("empty"), "\n");
    REQUIRE(::chmod(ws.file("empty").c_str(), 0600) == 0);
    r = test::runShell(serve + " --token-file " + ws.file("empty"));
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("is empty") != std::string::npos);
    CHECK(test::runShell(lathectl + " serve --help").out.find("LATHE_SERVER_TOKEN") != std::string::npos);

    for (const bool fromFile : {true, false}) {
        INFO((fromFile ? "--token-file" : "LATHE_SERVER_TOKEN"));
        const auto port = unusedPort();
        const auto log = ws.file(std::string("serve-") + (fromFile ? "file" : "env") + ".log");
        // exec: the shell's pid becomes the server's.
        const std::string command =
            std::string("exec ") + (fromFile ? "" : "env LATHE_SERVER_TOKEN=" + token + " ") + lathectl +
            " serve --model digits:1 --port " + std::to_string(port) + " --db " + ws.db() +
            (fromFile ? " --token-file " + file : "") + " >" + log + " 2>&1";
        const pid_t server = spawnQuiet("/bin/sh", {"sh", "-c", command}, ws.dir().path());
        REQUIRE(server > 0);
        const GroupKiller killer{server};
        auto ready = [&] { return httpGet(port, "/v2/health/ready").status == 200; };
        for (int i = 0; i < 300 && running(server) && !ready(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!ready()) FAIL("the server did not become ready; its log:\n" << test::readFile(log));
        CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}").status == 401);
        CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}", 5, bearer(token + "x")).status == 403);
        CHECK(httpRequest(port, "POST", "/v2/repository/index", "{}", 5, bearer(token)).status == 200);
        checkOpenEndpoints(port);
        CHECK(procFile(server, "cmdline").find(token) == std::string::npos);
        CHECK(procFile(server, "environ").find(token) == std::string::npos);
        const auto logText = test::readFile(log);
        CHECK(logText.find("needs the bearer token") != std::string::npos);
        CHECK(logText.find(token) == std::string::npos);
    }
}

TEST_CASE("batch padding goes only to a clearly faster size, never a smaller one", "[serving]") {
    std::string note;
    // Times by batch size (index 0 unused): 3 rows cost more than 4; 5-7 rows about as much as 8.
    const std::vector<double> ms{0, 1.0, 1.2, 3.0, 1.5, 1.6, 1.7, 2.0, 1.8};
    const auto runRows = core::serving::choosePadding(ms, note);
    REQUIRE(runRows.size() == 9);
    CHECK(runRows[1] == 1);
    CHECK(runRows[2] == 2);
    CHECK(runRows[3] == 4);  // 1.5 ms < 0.85 x 3.0 ms
    CHECK(runRows[4] == 4);
    CHECK(runRows[5] == 5);  // 8 rows (1.8) are not 15% faster than 5 (1.6)
    CHECK(runRows[6] == 6);
    CHECK(runRows[7] == 7);  // 1.8 vs 2.0: 10%, not enough
    CHECK(runRows[8] == 8);
    CHECK_THAT(note, Catch::Contains("3 rows -> 4"));
    // Nothing to gain: no table, and nothing said.
    note.clear();
    CHECK(core::serving::choosePadding({0, 1, 2, 3, 4}, note).empty());
    CHECK(note.empty());
    CHECK(core::serving::choosePadding({0, 1}, note).empty());
}

TEST_CASE("a served model answers every row alike whatever the batch size, padded or not", "[serving]") {
    test::ServingWorkspace ws(1);
    constexpr int64_t kMax = 16;
    const auto model =
        core::serving::LoadedModel::load({"digits", 1, ws.version().path}, kMax, "cpu", {}, 1, "auto");
    // What load chose ("pads batches to sizes that run faster: ..." when padding pays here).
    INFO(model->optimization());
    const int64_t in = model->inputElems(), out = model->outputElems();
    auto fillRow = [&](float* row, int64_t r) {
        for (int64_t i = 0; i < in; ++i)
            row[i] = static_cast<float>(std::sin(0.37 * double(r * in + i)) * 0.5 + 0.5);
    };
    std::vector<float> single(static_cast<size_t>(kMax * out));
    for (int64_t r = 0; r < kMax; ++r) {
        fillRow(model->inputBuffer(0), r);
        model->run(0, 1, single.data() + r * out);
    }
    for (int64_t b = 1; b <= kMax; ++b) {
        for (int64_t r = 0; r < b; ++r) fillRow(model->inputBuffer(0) + r * in, r);
        std::vector<float> got(static_cast<size_t>(b * out), std::nanf(""));
        model->run(0, b, got.data());
        double worst = 0;
        for (int64_t i = 0; i < b * out; ++i)
            worst = std::max(worst, std::abs(double(got[size_t(i)]) - double(single[size_t(i)])) /
                                        (1.0 + std::abs(double(single[size_t(i)]))));
        INFO("batch of " << b << " rows");
        CHECK(worst <= 1e-5);
    }
}

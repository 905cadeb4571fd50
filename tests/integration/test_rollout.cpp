// Progressive rollouts end to end: `lathectl deploy`, `lathectl rollout`, the detached controller
// and `lathectl load` against a real server, with candidates that fail, are slow, are healthy or
// get no traffic. Intervals are seconds here; the same code runs with hours.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "lathe/core/loadgen.h"
#include "lathe/core/registry.h"
#include "lathe/core/store.h"
#include "run_process.h"
#include "scripted_candidates.h"
#include "serving_fixture.h"
#include "skip.h"

using namespace lathe;
using nlohmann::json;

namespace {

struct Deployed {
    std::string url;
    uint16_t port = 0;
};

std::string lathectl() { return test::binPath("lathectl"); }

// One row of digits v1's input (64 values, in its own shape).
std::string inferBody(const test::ServingWorkspace& ws) {
    json shape = json::array();
    const auto v1 = core::Registry(ws.db()).resolve({"digits", 1, {}});
    for (const auto d : v1.signature.inputs.at(0).shape) shape.push_back(d > 0 ? d : 1);
    json data = json::array();
    for (int i = 0; i < 64; ++i) data.push_back(0.25 * (i % 5));
    json input = json::object();
    input["name"] = "input";
    input["datatype"] = "FP32";
    input["shape"] = shape;
    input["data"] = data;
    json body = json::object();
    body["inputs"] = json::array({input});
    return body.dump();
}

Deployed deployV1(const test::ServingWorkspace& ws) {
    const auto r = test::runShell(lathectl() + " deploy digits:1 --port 0 --json --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    Deployed d;
    d.url = json::parse(r.out)["url"].get<std::string>();
    d.port = static_cast<uint16_t>(std::stoi(d.url.substr(d.url.rfind(':') + 1)));
    return d;
}

int64_t registerFaulty(const test::ServingWorkspace& ws) { return test::registerFaultyCandidate(ws); }
int64_t registerSlow(const test::ServingWorkspace& ws) { return test::registerSlowCandidate(ws); }

// The next version of digits: the same MLP with other weights (as healthy as v1).
int64_t registerHealthy(const test::ServingWorkspace& ws) { return ws.registerOtherWeights().version; }

json status(const test::ServingWorkspace& ws) {
    const auto r = test::runShell(lathectl() + " rollout status digits --json --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    return json::parse(r.out);
}

// Polls the rollout's status until `done` holds or `timeoutS` passes; returns the last status.
json waitFor(const test::ServingWorkspace& ws, double timeoutS,
             const std::function<bool(const json&)>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
    json s;
    for (;;) {
        s = status(ws);
        if (done(s) || std::chrono::steady_clock::now() > deadline) return s;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
}

bool hasDecision(const json& s, const std::string& kind) {
    for (const auto& d : s["decisions"])
        if (d["kind"] == kind) return true;
    return false;
}

// Requests a version answered with 5xx, from the server's /metrics.
double serverErrors(uint16_t port, int64_t version) {
    const auto m = test::httpGet(port, "/metrics").body;
    double sum = 0;
    for (const char* code : {"500", "503", "504"}) {
        const std::string key = "lathe_requests_total{code=\"" + std::string(code) +
                                "\",model=\"digits\",version=\"" + std::to_string(version) + "\"}";
        const auto pos = m.find(key);
        if (pos != std::string::npos) sum += std::stod(m.substr(pos + key.size() + 1));
    }
    return sum;
}

// The server's rollout state (behind the deployment's control token, which the workspace keeps).
std::string rolloutAtServer(const test::ServingWorkspace& ws, uint16_t port) {
    core::Registry registry(ws.db());
    const auto live = registry.liveDeployment("digits");
    REQUIRE(live);
    const auto token = registry.deploymentToken(live->instance);
    return test::httpRequest(port, "GET", "/v2/repository/models/digits/rollout", {}, 5,
                             {{"Authorization", "Bearer " + token}})
        .body;
}

int64_t servedVersion(uint16_t port) {
    const auto a = test::httpGet(port, "/v2/models/digits");
    return a.status == 200 ? std::stoll(json::parse(a.body)["versions"][0].get<std::string>()) : 0;
}

// `lathectl load` in the background for `seconds`.
struct BackgroundLoad {
    std::thread thread;
    test::ProcessResult result;
    BackgroundLoad(const Deployed& d, double rate, double seconds) {
        const std::string cmd = lathectl() + " load --url " + d.url + " --model digits --rate " +
                                std::to_string(rate) + " --duration " + std::to_string(seconds) + " --json";
        thread = std::thread([this, cmd] { result = test::runShell(cmd); });
    }
    ~BackgroundLoad() {
        if (thread.joinable()) thread.join();
    }
    json report() {
        thread.join();
        return json::parse(result.out);
    }
};

void undeploy(const test::ServingWorkspace& ws) {
    CHECK(test::runShell(lathectl() + " undeploy digits --db " + ws.db()).exitCode == 0);
}

bool python() { return test::pythonTorchAvailable(); }

const std::string kFast = " --steps 50,100 --interval 2s --min-requests 40 --threshold 2";

}  // namespace

TEST_CASE("a candidate that fails 10% of requests is rolled back automatically under lathectl load",
          "[rollout][serving][cli]") {
    if (!python()) LATHE_SKIP("python3-torch is not installed");
    test::ServingWorkspace ws;
    const int64_t faulty = registerFaulty(ws);
    const auto dep = deployV1(ws);
    BackgroundLoad load(dep, 120, 14);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto r = test::runShell(lathectl() + " rollout start digits --candidate " + std::to_string(faulty) +
                            kFast + " --db " + ws.db());
    INFO(test::said(r));
    REQUIRE(r.exitCode == 0);
    CHECK(r.out.find("running") != std::string::npos);
    // Two unhealthy windows of 2 s each (and a little for the first scrape).
    const auto s = waitFor(ws, 12, [](const json& j) { return j["state"] != "running"; });
    INFO(s.dump(2));
    REQUIRE(s["state"] == "rolled_back");
    CHECK(s["weight_bp"] == 0);
    CHECK(s["step"] == 1);  // never advanced
    // Rolled back after exactly `threshold` unhealthy windows, none of them passed.
    int unhealthy = 0;
    for (const auto& d : s["decisions"]) unhealthy += d["kind"] == "unhealthy";
    CHECK(unhealthy == 2);
    CHECK_FALSE(hasDecision(s, "healthy"));
    CHECK_FALSE(hasDecision(s, "advance"));
    CHECK(s["end_reason"].get<std::string>().find("error rate") != std::string::npos);
    // The baseline serves everything again, and never failed.
    const auto report = load.report();
    CHECK(serverErrors(dep.port, faulty) > 0);
    CHECK(serverErrors(dep.port, 1) == 0);
    CHECK(report["sent"].get<int64_t>() > 1000);
    CHECK(servedVersion(dep.port) == 1);
    CHECK(rolloutAtServer(ws, dep.port).find("\"candidate\":0") != std::string::npos);
    // The deployment history says who rolled back and why.
    r = test::runShell(lathectl() + " deployments digits --json --db " + ws.db());
    const auto hist = json::parse(r.out);
    REQUIRE(hist.size() >= 2);
    CHECK(hist[0]["action"] == "rollback");
    CHECK(hist[0]["actor"] == "auto");
    CHECK(hist[0]["version"] == 1);
    CHECK(hist[0]["reason"].get<std::string>().find("rolled back after 2 unhealthy windows") !=
          std::string::npos);
    undeploy(ws);
}

TEST_CASE("a candidate 5x slower is rolled back on latency", "[rollout][serving][cli]") {
    if (!python()) LATHE_SKIP("python3-torch is not installed");
    test::ServingWorkspace ws;
    const int64_t slow = registerSlow(ws);
    const auto dep = deployV1(ws);
    BackgroundLoad load(dep, 100, 14);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto r = test::runShell(lathectl() + " rollout start digits --candidate " + std::to_string(slow) +
                                  kFast + " --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    const auto s = waitFor(ws, 12, [](const json& j) { return j["state"] != "running"; });
    INFO(s.dump(2));
    REQUIRE(s["state"] == "rolled_back");
    CHECK(s["end_reason"].get<std::string>().find("P99") != std::string::npos);
    // The figures behind the verdict are kept with it.
    bool sawSlow = false;
    for (const auto& d : s["decisions"])
        if (d["kind"] == "unhealthy")
            sawSlow = sawSlow || d["numbers"]["candidate_p99_ms"].get<double>() >
                                     1.5 * d["numbers"]["baseline_p99_ms"].get<double>();
    CHECK(sawSlow);
    load.report();
    CHECK(serverErrors(dep.port, 1) == 0);
    CHECK(servedVersion(dep.port) == 1);
    undeploy(ws);
}

TEST_CASE("a healthy candidate is promoted after its last step", "[rollout][serving][cli]") {
    test::ServingWorkspace ws;
    const int64_t v2 = registerHealthy(ws);
    const auto dep = deployV1(ws);
    BackgroundLoad load(dep, 120, 12);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto r = test::runShell(lathectl() + " rollout start digits --candidate " + std::to_string(v2) +
                                  kFast + " --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    const auto s = waitFor(ws, 14, [](const json& j) { return j["state"] != "running"; });
    INFO(s.dump(2));
    REQUIRE(s["state"] == "promoted");
    CHECK(hasDecision(s, "advance"));
    CHECK(s["step"] == 2);
    CHECK(servedVersion(dep.port) == v2);
    core::Registry registry(ws.db());
    CHECK(registry.resolve({"digits", 0, "production"}).version == v2);
    const auto live = registry.liveDeployment("digits");
    REQUIRE(live);
    CHECK(live->version == v2);
    CHECK(live->action == "promote");
    CHECK(live->actor == "auto");
    const auto report = load.report();
    CHECK(report["errors"] == 0);
    // Each version's own figures were scraped into the workspace while both answered.
    bool both[2] = {false, false};
    for (const auto& p : registry.servingMetrics("digits", "variant/qps")) {
        if (p.version == 1) both[0] = true;
        if (p.version == v2) both[1] = true;
    }
    CHECK(both[0]);
    CHECK(both[1]);
    undeploy(ws);
}

TEST_CASE(
    "a candidate without traffic holds and says so, and an abort restores the baseline with no failed "
    "request",
    "[rollout][serving][cli]") {
    test::ServingWorkspace ws;
    const int64_t v2 = registerHealthy(ws);
    const auto dep = deployV1(ws);
    auto r = test::runShell(lathectl() + " rollout start digits --candidate " + std::to_string(v2) +
                            " --steps 50,100 --interval 1s --min-requests 40 --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    auto s = waitFor(ws, 8, [](const json& j) {
        return !j["decisions"].empty() && j["decisions"].back()["kind"] == "hold" &&
               j["decisions"].back()["repeats"].get<int>() >= 2;
    });
    INFO(s.dump(2));
    REQUIRE(s["state"] == "running");
    CHECK(s["step"] == 1);  // no data is never a pass
    CHECK(s["decisions"].back()["reason"].get<std::string>().find("no traffic") != std::string::npos);
    CHECK(s["decisions"].size() == 2);  // start, then one row for every hold
    r = test::runShell(lathectl() + " rollout status digits --db " + ws.db());
    CHECK(r.out.find("no traffic reached the candidate") != std::string::npos);

    // Now under load at 50%: abort mid-rollout, every request answered.
    core::LoadOptions lo;
    lo.url = dep.url;
    lo.model = "digits";
    lo.rate = 150;
    lo.durationS = 4;
    core::LoadReport report;
    std::thread load([&] { report = core::runLoad(lo); });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    r = test::runShell(lathectl() + " rollout abort digits --reason 'seen enough' --db " + ws.db());
    INFO(test::said(r));
    CHECK(r.exitCode == 0);
    CHECK(r.out.find("aborted") != std::string::npos);
    load.join();
    CHECK(report.errors == 0);
    CHECK(report.ok == report.sent);
    CHECK(serverErrors(dep.port, 1) == 0);
    CHECK(serverErrors(dep.port, v2) == 0);
    s = status(ws);
    CHECK(s["state"] == "aborted");
    CHECK(s["decisions"].back()["actor"] == "user");
    CHECK(s["end_reason"].get<std::string>().find("seen enough") != std::string::npos);
    // 100% baseline: the split is gone from the server.
    for (int i = 0; i < 20; ++i) {
        const auto a = test::httpRequest(dep.port, "POST", "/v2/models/digits/infer", inferBody(ws), 5,
                                         {{"X-User-Id", "user-" + std::to_string(i)}});
        INFO(a.body);
        REQUIRE(a.status == 200);
        CHECK(json::parse(a.body)["model_version"] == "1");
    }
    // The controller left with the rollout.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK_FALSE(status(ws)["controller_running"].get<bool>());
    undeploy(ws);
}

TEST_CASE("a controller that was killed is started again and goes on from the recorded step",
          "[rollout][serving][cli]") {
    test::ServingWorkspace ws;
    const int64_t v2 = registerHealthy(ws);
    const auto dep = deployV1(ws);
    BackgroundLoad load(dep, 120, 16);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto r = test::runShell(lathectl() + " rollout start digits --candidate " + std::to_string(v2) +
                            " --steps 10,50,100 --interval 2s --min-requests 20 --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    auto s = waitFor(ws, 10, [](const json& j) { return j["step"] == 2; });
    REQUIRE(s["step"] == 2);
    // The controller's pid is in its lock file.
    std::ifstream lockFile(core::Store::filesDirFor(ws.db()) + "/deployments/rollout-digits.lock");
    int64_t pid = 0;
    lockFile >> pid;
    REQUIRE(pid > 0);
    REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    s = status(ws);
    CHECK_FALSE(s["controller_running"].get<bool>());
    CHECK(s["step"] == 2);
    r = test::runShell(lathectl() + " rollout status digits --db " + ws.db());
    CHECK(r.out.find("lathectl rollout resume digits") != std::string::npos);
    r = test::runShell(lathectl() + " rollout resume digits --db " + ws.db());
    INFO(test::said(r));
    REQUIRE(r.exitCode == 0);
    s = waitFor(ws, 12, [](const json& j) { return j["state"] != "running"; });
    INFO(s.dump(2));
    CHECK(s["state"] == "promoted");
    // After the resume it went on from step 2: no decision at step 1 follows it.
    bool resumed = false;
    for (const auto& d : s["decisions"]) {
        if (d["kind"] == "resume") {
            resumed = true;
            CHECK(d["step"] == 2);
            CHECK(d["reason"].get<std::string>().find("started again at step 2") != std::string::npos);
        }
        if (resumed) CHECK(d["step"].get<int>() >= 2);
    }
    CHECK(resumed);
    CHECK(load.report()["errors"] == 0);
    undeploy(ws);
}

TEST_CASE("after a reboot, deploying the baseline again puts the split back and starts the controller",
          "[rollout][serving][cli]") {
    test::ServingWorkspace ws;
    const int64_t v2 = registerHealthy(ws);
    const auto dep = deployV1(ws);
    auto r = test::runShell(lathectl() + " rollout start digits --candidate " + std::to_string(v2) +
                            " --steps 30,100 --interval 1h --db " + ws.db());
    REQUIRE(r.exitCode == 0);
    // A reboot: the server and the controller are gone, the workspace remembers the rollout.
    std::ifstream lockFile(core::Store::filesDirFor(ws.db()) + "/deployments/rollout-digits.lock");
    int64_t controller = 0;
    lockFile >> controller;
    REQUIRE(controller > 0);
    const auto server = core::Registry(ws.db()).liveDeployment("digits")->pid;
    REQUIRE(::kill(static_cast<pid_t>(controller), SIGKILL) == 0);
    REQUIRE(::kill(static_cast<pid_t>(server), SIGKILL) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK_FALSE(status(ws)["controller_running"].get<bool>());
    // The baseline deployed again: a new server, and the controller runs again and sets its split.
    r = test::runShell(lathectl() + " deploy digits:1 --port 0 --db " + ws.db());
    INFO(test::said(r));
    REQUIRE(r.exitCode == 0);
    CHECK(r.err.find("starting a server") != std::string::npos);
    CHECK(r.err.find("had no controller: starting it again") != std::string::npos);
    const auto live = core::Registry(ws.db()).liveDeployment("digits");
    REQUIRE(live);
    CHECK(live->pid != server);
    const auto url = live->url;
    const auto port = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
    CHECK(status(ws)["controller_running"].get<bool>());
    std::string atServer;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    do {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        atServer = rolloutAtServer(ws, port);
    } while (atServer.find("\"weight_bp\":3000") == std::string::npos &&
             std::chrono::steady_clock::now() < deadline);
    INFO(atServer);
    CHECK(atServer.find("\"candidate\":" + std::to_string(v2)) != std::string::npos);
    CHECK(atServer.find("\"weight_bp\":3000") != std::string::npos);
    const auto s = status(ws);
    CHECK(s["state"] == "running");
    CHECK(s["step"] == 1);
    // A deploy while the controller runs starts no second one.
    r = test::runShell(lathectl() + " deploy digits:1 --port 0 --db " + ws.db());
    CHECK(r.exitCode == 2);  // already live
    CHECK(r.err.find("starting it again") == std::string::npos);
    CHECK(test::runShell(lathectl() + " rollout abort digits --db " + ws.db()).exitCode == 0);
    undeploy(ws);
}

TEST_CASE("bad rollout requests are refused with exit 2 and change nothing", "[rollout][serving][cli]") {
    test::ServingWorkspace ws;
    const std::string db = " --db " + ws.db();
    auto r = test::runShell(lathectl() + " rollout start digits --candidate 1 --interval 1s" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("not deployed") != std::string::npos);
    const int64_t v2 = registerHealthy(ws);
    const auto dep = deployV1(ws);
    const std::string cand = " --candidate " + std::to_string(v2);
    struct Bad {
        std::string args, says;
    };
    for (const Bad& b :
         {Bad{" --candidate 9", "no version 9"}, Bad{" --candidate 1", "is the live version"},
          Bad{cand + " --steps 50,25", "must rise"}, Bad{cand + " --steps 0,50", "out of 1..100"},
          Bad{cand + " --steps 5,150", "out of 1..100"}, Bad{cand + " --interval 0s", "--interval"},
          Bad{cand + " --max-error-rate 200%", "--max-error-rate"},
          Bad{cand + " --threshold 0", "--threshold"}}) {
        r = test::runShell(lathectl() + " rollout start digits" + b.args + db);
        INFO(b.args << ": " << r.err);
        CHECK(r.exitCode == 2);
        CHECK(r.err.find(b.says) != std::string::npos);
    }
    core::Registry registry(ws.db());
    CHECK(registry.rollouts("digits").empty());
    CHECK(rolloutAtServer(ws, dep.port).find("\"candidate\":0") != std::string::npos);
    for (const char* verb : {"pause", "resume", "abort"}) {
        r = test::runShell(lathectl() + " rollout " + verb + " digits" + db);
        CHECK(r.exitCode == 2);
        CHECK(r.err.find("no rollout of digits is under way") != std::string::npos);
    }
    // One rollout at a time; pause holds the step, a second pause is refused.
    r = test::runShell(lathectl() + " rollout start digits" + cand + " --interval 1h" + db);
    REQUIRE(r.exitCode == 0);
    r = test::runShell(lathectl() + " rollout start digits" + cand + " --interval 1h" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("under way") != std::string::npos);
    CHECK(registry.rollouts("digits").size() == 1);
    CHECK(test::runShell(lathectl() + " rollout pause digits" + db).exitCode == 0);
    r = test::runShell(lathectl() + " rollout pause digits" + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("paused already") != std::string::npos);
    CHECK(status(ws)["state"] == "paused");
    CHECK(test::runShell(lathectl() + " rollout resume digits" + db).exitCode == 0);
    CHECK(status(ws)["state"] == "running");
    CHECK(test::runShell(lathectl() + " rollout abort digits" + db).exitCode == 0);
    undeploy(ws);
}

TEST_CASE("an alert rule with action = rollback rolls a fresh deploy back once, by actor auto",
          "[rollout][serving][cli]") {
    if (!python()) LATHE_SKIP("python3-torch is not installed");
    test::ServingWorkspace ws;
    const std::string db = " --db " + ws.db();
    const int64_t faulty = registerFaulty(ws);
    const auto rules = ws.file("rules.toml");
    std::ofstream(rules) << "action = \"rollback\"\nrollback_within_s = 120\nerror_rate_rise_points = 3\n"
                            "error_rate_min_requests = 30\n";
    std::ofstream(ws.file("bad.toml")) << "action = \"reboot\"\n";
    auto r =
        test::runShell(lathectl() + " deploy digits:1 --port 0 --alert-rules " + ws.file("bad.toml") + db);
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("'action' must be \"rollback\"") != std::string::npos);
    r = test::runShell(lathectl() + " deploy digits:1 --port 0 --json --alert-rules " + rules + db);
    REQUIRE(r.exitCode == 0);
    const auto url = json::parse(r.out)["url"].get<std::string>();
    const Deployed dep{url, static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)))};
    BackgroundLoad load(dep, 120, 12);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    r = test::runShell(lathectl() + " deploy digits:" + std::to_string(faulty) + db);
    REQUIRE(r.exitCode == 0);
    // The error rate rises by ~10 points: the alert fires and the server's watcher rolls back.
    core::Registry registry(ws.db());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (registry.liveDeployment("digits")->version != 1 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto live = registry.liveDeployment("digits");
    REQUIRE(live);
    CHECK(live->version == 1);
    CHECK(live->action == "rollback");
    CHECK(live->actor == "auto");
    CHECK(live->reason.find("Error rate") != std::string::npos);
    load.report();
    // Once: nothing rolls the rollback back, however the alerts go on.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    CHECK(registry.deployments("digits").size() == 3);
    CHECK(servedVersion(dep.port) == 1);
    bool fired = false;
    for (const auto& a : registry.alerts("digits")) fired = fired || a.rule == "error_rate";
    CHECK(fired);
    undeploy(ws);
}

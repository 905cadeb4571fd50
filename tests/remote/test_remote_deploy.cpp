// Deployments on another host, end to end: a real sshd on 127.0.0.2 stands for a serving host,
// reached through an ssh config alias (gpu-a) from a private $HOME. lathectl deploy --host gpu-a
// copies the model there and starts its server; a hot swap and a rollback under load lose no
// request; the workspace records the server's metrics through the local watcher; a host that
// cannot be reached changes nothing; undeploy leaves no server and no watcher behind.
#include <pwd.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "lathe/core/deploy.h"
#include "lathe/core/http_client.h"
#include "lathe/core/loadgen.h"
#include "lathe/core/registry.h"
#include "lathe/core/server.h"
#include "lathe/core/sha256.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "run_process.h"
#include "scripted_candidates.h"
#include "serving_fixture.h"
#include "skip.h"
#include "sshd_fixture.h"

using lathe::remote::test::SshdServer;
using lathe::remote::test::writeFile;
using lathe::test::runShell;
using nlohmann::json;
namespace fs = std::filesystem;
namespace core = lathe::core;
using Clock = std::chrono::steady_clock;

namespace {

std::string inferBody(float value) {
    json data = json::array();
    for (int i = 0; i < 64; ++i) data.push_back(value + 0.001f * static_cast<float>(i));
    return json{
        {"inputs", {{{"name", "input"}, {"shape", {1, 1, 8, 8}}, {"datatype", "FP32"}, {"data", data}}}}}
        .dump();
}

constexpr int kInputs = 4;

// What version `v` answers for each input, from a server of its own in this process.
std::vector<std::vector<double>> answersOf(const core::ModelVersion& v) {
    core::ServeOptions o;
    o.port = 0;
    core::InferenceServer server(o);
    server.load({"digits", v.version, v.path});
    const auto port = server.start();
    std::vector<std::vector<double>> out;
    for (int r = 0; r < kInputs; ++r) {
        const auto a =
            core::httpRequest("POST", "http://127.0.0.1:" + std::to_string(port) + "/v2/models/digits/infer",
                              inferBody(0.2f * static_cast<float>(r)));
        REQUIRE(a.status == 200);
        out.push_back(json::parse(a.body)["outputs"][0]["data"].get<std::vector<double>>());
    }
    return out;
}

// Processes whose command line has `needle` (a pattern for pgrep -f; bracket a letter so that the
// shell running pgrep does not match itself).
std::vector<int> pidsMatching(const std::string& pattern) {
    const auto r = runShell("pgrep -f -- '" + pattern + "' || true");
    std::vector<int> pids;
    std::istringstream in(r.out);
    for (int pid; in >> pid;) pids.push_back(pid);
    return pids;
}

// Kills whatever still carries a deployment's instance id (its server, its watcher) when a
// check fails half-way: nothing of the test outlives it.
struct CleanUp {
    std::string instance;
    ~CleanUp() {
        runShell("pkill -KILL -f -- '[-]-instance-id " + instance + "'; pkill -KILL -f -- '[-]-instance " +
                 instance + "'; true");
    }
};

// A workspace with the digits model and a serving host "gpu-a" in its inventory: a real sshd on
// 127.0.0.2 reached through an ssh config alias from a private $HOME, which lathectl (and the
// watcher it starts) runs with.
struct GpuA {
    SshdServer host{"127.0.0.2"};
    lathe::test::ServingWorkspace ws;
    std::string home = ws.file("home");
    std::string lathectl = lathe::test::binPath("lathectl");

    GpuA() {
        fs::create_directories(home + "/.ssh");
        writeFile(home + "/.ssh/config", config(host.port()));
        writeFile(home + "/.ssh/known_hosts",
                  "[127.0.0.2]:" + std::to_string(host.port()) + " " + host.hostPublicKey() + "\n");
        const auto r = run("hosts add gpu-a --address gpu-a --lathectl " + lathectl);
        if (r.exitCode != 0) throw std::runtime_error("lathectl hosts add failed: " + r.err);
    }
    // The ssh config naming gpu-a, with `port` as its sshd's port.
    std::string config(int port) const {
        return "Host gpu-a\n  HostName 127.0.0.2\n  Port " + std::to_string(port) + "\n  User " +
               lathe::remote::test::currentUser() + "\n  IdentityFile " + host.clientKey() + "\n";
    }
    lathe::test::ProcessResult run(const std::string& args) const {
        return runShell("env -u SSH_AUTH_SOCK HOME=" + home + " " + lathectl + " " + args + " --db " +
                        ws.db());
    }
};

bool waitUntil(const std::function<bool()>& done, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (!done()) {
        if (Clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
}

}  // namespace

TEST_CASE(
    "a model deployed on another host is hot-swapped and rolled back under load, watched, and undeployed",
    "[remote][serving]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    GpuA gpuA;
    const auto& host = gpuA.host;
    auto& ws = gpuA.ws;
    const std::string& home = gpuA.home;
    const std::string& lathectl = gpuA.lathectl;
    const auto config = [&](int port) { return gpuA.config(port); };
    const auto run = [&](const std::string& args) { return gpuA.run(args); };
    // v2: other weights, so that every answer tells which version computed it.
    REQUIRE(ws.registerOtherWeights().version == 2);
    core::Registry registry(ws.db());
    const auto v1 = registry.resolve({"digits", 1, {}});
    const auto v2 = registry.resolve({"digits", 2, {}});
    std::map<std::string, std::vector<std::vector<double>>> refs{{"1", answersOf(v1)}, {"2", answersOf(v2)}};

    // A name that is neither a host of the workspace nor an address: refused, saying where hosts are.
    auto r = run("deploy digits:1 --host gpu-z");
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("lathectl hosts list"));

    r = run("deploy digits:1 --host gpu-a --json");
    INFO(r.out << r.err);
    REQUIRE(r.exitCode == 0);
    const auto dep = json::parse(r.out);
    CHECK(dep["target"] == "ssh:gpu-a");
    CHECK(dep["started_server"] == true);
    const std::string url = dep["url"].get<std::string>();
    CHECK(url.rfind("http://127.0.0.2:", 0) == 0);  // where this machine reaches the host
    const auto pid = dep["pid"].get<int64_t>();
    const auto instance = registry.liveDeployment("digits")->instance;
    CleanUp cleanUp{instance};
    const auto token = registry.deploymentToken(instance);
    REQUIRE(token.size() == 64);
    // The server there: lathectl serve of the copy in the host's model cache (not the workspace's
    // file), told its SHA-256, listening on all addresses; the token never on its command line, and
    // its token file gone once it was read. The host's home: sshd logs in with the passwd entry's.
    const std::string realHome = ::getpwuid(::getuid())->pw_dir;
    const std::string copy =
        realHome + "/.cache/lathe/models/" + v1.sha256 + fs::path(v1.path).extension().string();
    const std::string cmdline = lathe::remote::test::readFile("/proc/" + std::to_string(pid) + "/cmdline");
    const auto arg = [](const std::string& a, const std::string& b) { return a + '\0' + b + '\0'; };
    CHECK(cmdline.rfind(lathectl + '\0' + "serve" + '\0', 0) == 0);
    CHECK(cmdline.find(arg("--file", copy)) != std::string::npos);
    CHECK(cmdline.find(arg("--sha256", v1.sha256)) != std::string::npos);
    CHECK(cmdline.find(arg("--host", "0.0.0.0")) != std::string::npos);
    CHECK(cmdline.find(token) == std::string::npos);
    CHECK(core::sha256File(copy) == v1.sha256);
    CHECK_FALSE(fs::exists(realHome + "/.cache/lathe/deploy/" + instance + ".token"));
    // Server flags cannot reach the live server (a version change hot-swaps it): refused.
    r = run("deploy digits:2 --max-batch 8");
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("would not apply") && Catch::Contains("host gpu-a"));
    // Its control API wants the token: a load without it is refused.
    const auto denied = core::httpRequest("POST", url + "/v2/repository/models/digits/load", "{}");
    CHECK(denied.status == 401);

    // Load, and two clients checking each answer against the version it is labelled with, while the
    // live server is hot-swapped to v2 and rolled back to v1 over SSH.
    core::LoadOptions lo;
    lo.url = url;
    lo.model = "digits";
    lo.rate = 100;
    lo.durationS = 6;
    lo.users = 4;
    core::LoadReport report;
    std::thread load([&] { report = core::runLoad(lo); });
    std::atomic<bool> stop{false};
    std::atomic<int> failed{0}, mismatched{0};
    std::mutex mutex;
    std::map<std::string, int> versions;
    std::vector<std::thread> checkers;
    for (int t = 0; t < 2; ++t)
        checkers.emplace_back([&, t] {
            for (int i = 0; !stop; ++i) {
                const int input = (t + i) % kInputs;
                core::HttpResult a;
                try {
                    a = core::httpRequest("POST", url + "/v2/models/digits/infer",
                                          inferBody(0.2f * static_cast<float>(input)));
                } catch (const std::exception&) {
                    ++failed;
                    continue;
                }
                if (a.status != 200) {
                    ++failed;
                    continue;
                }
                const auto j = json::parse(a.body);
                const auto label = j["model_version"].get<std::string>();
                const auto got = j["outputs"][0]["data"].get<std::vector<double>>();
                bool right = refs.count(label) > 0;
                if (right) {
                    const auto& want = refs[label][static_cast<size_t>(input)];
                    right = got.size() == want.size();
                    for (size_t k = 0; right && k < got.size(); ++k)
                        right = std::fabs(got[k] - want[k]) <= 1e-3;
                }
                std::lock_guard<std::mutex> lk(mutex);
                ++versions[label];
                if (!right) ++mismatched;
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    r = run("deploy digits:2 --json");
    CHECK(r.exitCode == 0);
    if (r.exitCode == 0) {
        CHECK(json::parse(r.out)["started_server"] == false);
        CHECK(json::parse(r.out)["pid"] == pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    r = run("rollback digits --json");
    CHECK(r.exitCode == 0);
    if (r.exitCode == 0) CHECK(json::parse(r.out)["version"] == 1);
    load.join();
    stop = true;
    for (auto& c : checkers) c.join();
    CHECK(report.sent > 300);
    CHECK(report.errors == 0);
    CHECK(failed == 0);
    CHECK(mismatched == 0);
    CHECK(versions["1"] > 0);
    CHECK(versions["2"] > 0);

    // The local watcher scraped the remote server into the workspace: one per server, however
    // many deploys there were.
    // The hot swap and the rollback each started one more, which found the first holding the
    // watch and left (their log lines say so): wait for both to have left, then count.
    const std::string watcherPattern = "[l]athectl watch .*--instance " + instance;
    const std::string watchLog = (fs::path(core::Store::filesDirFor(ws.db())) / "deployments" /
                                  ("digits-watch-" + instance.substr(0, 8) + ".log"))
                                     .string();
    const auto occurrences = [](const std::string& text, const std::string& what) {
        size_t n = 0;
        for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
        return n;
    };
    CHECK(waitUntil(
        [&] {
            return fs::exists(watchLog) &&
                   occurrences(lathe::remote::test::readFile(watchLog), "digits is watched already") >= 2;
        },
        30));
    CHECK(waitUntil([&] { return pidsMatching(watcherPattern).size() == 1; }, 10));
    CHECK(pidsMatching(watcherPattern).size() == 1);
    CHECK(waitUntil([&] { return registry.servingMetrics("digits", "qps").size() >= 3; }, 10));
    double peak = 0;
    for (const auto& p : registry.servingMetrics("digits", "qps")) peak = std::max(peak, p.value);
    CHECK(peak > 50);

    // Unreachable over SSH: a hot swap and undeploy fail naming the host, and the deployment stays
    // live as it was (its server runs).
    const auto before = registry.liveDeployment("digits");
    REQUIRE(before);
    writeFile(home + "/.ssh/config", config(lathe::remote::test::freePort("127.0.0.2")));
    r = run("deploy digits:2");
    CHECK(r.exitCode != 0);
    CHECK_THAT(r.err, Catch::Contains("gpu-a"));
    CHECK(registry.liveDeployment("digits")->id == before->id);
    r = run("undeploy digits");
    CHECK(r.exitCode != 0);
    CHECK_THAT(r.err, Catch::Contains("gpu-a") && Catch::Contains("--forget"));
    REQUIRE(registry.liveDeployment("digits"));
    CHECK(registry.liveDeployment("digits")->id == before->id);
    CHECK(::kill(static_cast<pid_t>(pid), 0) == 0);
    r = run("deployments digits --json");
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out)[0]["live"] == true);
    CHECK(json::parse(r.out)[0]["up"] == true);  // its HTTP port still answers

    // A server that stops answering shows DOWN, never ended.
    REQUIRE(::kill(static_cast<pid_t>(pid), SIGSTOP) == 0);
    r = run("deployments digits --json");
    ::kill(static_cast<pid_t>(pid), SIGCONT);
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out)[0]["live"] == true);
    CHECK(json::parse(r.out)[0]["up"] == false);

    // Reachable again: undeploy stops the server there, and the watcher ends with the deployment.
    writeFile(home + "/.ssh/config", config(host.port()));
    r = run("undeploy digits");
    INFO(r.err);
    CHECK(r.exitCode == 0);
    CHECK_FALSE(registry.liveDeployment("digits"));
    CHECK(waitUntil([&] { return ::kill(static_cast<pid_t>(pid), 0) != 0; }, 5));
    CHECK(waitUntil([&] { return pidsMatching(watcherPattern).empty(); }, 10));
    CHECK(pidsMatching("[l]athectl serve .*--instance-id " + instance).empty());

    // A server that died there is replaced by a new one on the same host; one forgotten (its host
    // gone for good) is left running, and the message says how to stop it.
    r = run("deploy digits:2 --host gpu-a --json");
    REQUIRE(r.exitCode == 0);
    const auto pid2 = json::parse(r.out)["pid"].get<int64_t>();
    const auto instance2 = registry.liveDeployment("digits")->instance;
    CleanUp cleanUp2{instance2};
    REQUIRE(::kill(static_cast<pid_t>(pid2), SIGKILL) == 0);
    CHECK(waitUntil([&] { return ::kill(static_cast<pid_t>(pid2), 0) != 0; }, 5));
    r = run("deploy digits:1 --json");
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out)["started_server"] == true);
    CHECK(json::parse(r.out)["target"] == "ssh:gpu-a");
    const auto pid3 = json::parse(r.out)["pid"].get<int64_t>();
    const auto instance3 = registry.liveDeployment("digits")->instance;
    CleanUp cleanUp3{instance3};
    CHECK(registry.deployments("digits").at(1).endReason == "server not running");
    r = run("undeploy digits --forget");
    CHECK(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("was not stopped") && Catch::Contains("pkill -f " + instance3));
    CHECK_FALSE(registry.liveDeployment("digits"));
    CHECK(::kill(static_cast<pid_t>(pid3), 0) == 0);  // left running, as it said

    std::error_code ec;
    for (const auto& i : {instance, instance2, instance3})
        fs::remove(realHome + "/.cache/lathe/deploy/" + i + ".log", ec);
    fs::remove(copy, ec);
    fs::remove(realHome + "/.cache/lathe/models/" + v2.sha256 + fs::path(v2.path).extension().string(), ec);
}

TEST_CASE("an alert rule with action = rollback rolls back a deployment on another host, once",
          "[remote][serving]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    if (!lathe::test::pythonTorchAvailable()) LATHE_SKIP("python3-torch is not installed");
    GpuA gpuA;
    const auto& ws = gpuA.ws;
    const int64_t faulty = lathe::test::registerFaultyCandidate(ws);
    const auto rules = ws.file("rules.toml");
    writeFile(rules,
              "action = \"rollback\"\nrollback_within_s = 120\nerror_rate_rise_points = 3\n"
              "error_rate_min_requests = 30\n");
    auto r = gpuA.run("deploy digits:1 --host gpu-a --json --alert-rules " + rules);
    INFO(r.out << r.err);
    REQUIRE(r.exitCode == 0);
    const std::string url = json::parse(r.out)["url"].get<std::string>();
    core::Registry registry(ws.db());
    const auto instance = registry.liveDeployment("digits")->instance;
    CleanUp cleanUp{instance};
    core::LoadOptions lo;
    lo.url = url;
    lo.model = "digits";
    lo.rate = 120;
    lo.durationS = 14;
    lo.users = 4;
    core::LoadReport report;
    std::thread load([&] { report = core::runLoad(lo); });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    // The faulty version is hot-swapped in over SSH; its error rate fires the alert in the local
    // watcher, which rolls the server on gpu-a back over SSH as well.
    r = gpuA.run("deploy digits:" + std::to_string(faulty));
    CHECK(r.exitCode == 0);
    const bool rolledBack = waitUntil(
        [&] {
            const auto live = registry.liveDeployment("digits");
            return live && live->version == 1 && live->action == "rollback";
        },
        20);
    load.join();
    const std::string watchLog = (fs::path(core::Store::filesDirFor(ws.db())) / "deployments" /
                                  ("digits-watch-" + instance.substr(0, 8) + ".log"))
                                     .string();
    INFO("watcher log: " << (fs::exists(watchLog) ? lathe::remote::test::readFile(watchLog) : "none"));
    REQUIRE(rolledBack);
    const auto live = registry.liveDeployment("digits");
    CHECK(live->actor == "auto");
    CHECK(live->target == "ssh:gpu-a");
    CHECK(live->instance == instance);  // the same server, hot-swapped back
    CHECK_THAT(live->reason, Catch::Contains("Error rate"));
    CHECK(report.sent > 300);
    CHECK(report.errors > 0);  // the faulty version did fail some
    // The server there answers as v1 again, and nothing rolls the rollback back.
    const auto a = core::httpRequest("POST", url + "/v2/models/digits/infer", inferBody(0.3f));
    REQUIRE(a.status == 200);
    CHECK(json::parse(a.body)["model_version"] == "1");
    std::this_thread::sleep_for(std::chrono::seconds(2));
    CHECK(registry.deployments("digits").size() == 3);
    CHECK(registry.liveDeployment("digits")->id == live->id);
    r = gpuA.run("undeploy digits");
    CHECK(r.exitCode == 0);
    CHECK(waitUntil([&] { return pidsMatching("[l]athectl watch .*--instance " + instance).empty(); }, 10));
    const std::string realHome = ::getpwuid(::getuid())->pw_dir;
    std::error_code ec;
    fs::remove(realHome + "/.cache/lathe/deploy/" + instance + ".log", ec);
    for (const int64_t v : {int64_t{1}, faulty}) {
        const auto mv = registry.resolve({"digits", v, {}});
        fs::remove(realHome + "/.cache/lathe/models/" + mv.sha256 + fs::path(mv.path).extension().string(),
                   ec);
    }
}

TEST_CASE("a --file server without a control token loads no other file", "[remote][serving]") {
    lathe::test::ServingWorkspace ws;
    core::ServeOptions o;
    o.port = 0;
    core::InferenceServer server(o);
    server.load({"digits", 1, ws.version().path});
    const auto port = server.start();
    const json body{
        {"parameters", {{"version", "2"}, {"path", ws.version().path}, {"sha256", ws.version().sha256}}}};
    const auto r = core::httpRequest(
        "POST", "http://127.0.0.1:" + std::to_string(port) + "/v2/repository/models/digits/load",
        body.dump());
    CHECK(r.status == 403);
    CHECK_THAT(r.body, Catch::Contains("without a control token"));
    CHECK(server.servedVersion("digits") == 1);
}

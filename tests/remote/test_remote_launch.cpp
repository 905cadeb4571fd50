// Runs across hosts over SSH, end to end: two real sshd on 127.0.0.2 and 127.0.0.3 stand for two
// GPU hosts, reached through ssh config aliases (gpu-a, gpu-b) from a private $HOME; lathectl
// train --hosts starts 2 ranks on each. Every failure case checks its message and that no rank
// is left in the process table.
#include <pwd.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "data/raw.h"
#include "lathe/core/checkpoint.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/sha256.h"
#include "lathe/core/store.h"
#include "training/checkpoint_io.h"
#include "training/zoo.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "run_process.h"
#include "skip.h"
#include "sshd_fixture.h"

using lathe::remote::test::SshdServer;
using lathe::remote::test::TempDir;
using lathe::remote::test::writeFile;
using lathe::test::runShell;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kTrain = " --epochs 2 --seed 5 --threads 1 -q --json";

// Two hosts behind ssh config aliases, an inventory workspace, and a $HOME of their own.
struct Cluster {
    SshdServer a{"127.0.0.2"};
    SshdServer b{"127.0.0.3"};
    TempDir dir;
    std::string home = dir.file("home");
    std::string db = dir.file("lathe.db");

    enum class Fault { None, UnknownKey, ChangedKey, WrongClientKey, ClosedPort, NoLathectl, LathectlNotSet };

    explicit Cluster(Fault fault = Fault::None) {
        fs::create_directories(home + "/.ssh");
        const auto alias = [&](const char* name, const SshdServer& s, int port, const std::string& key) {
            return std::string("Host ") + name + "\n  HostName " + s.address() + "\n  Port " +
                   std::to_string(port) + "\n  User " + lathe::remote::test::currentUser() +
                   "\n  IdentityFile " + key + "\n";
        };
        const int portB = fault == Fault::ClosedPort ? lathe::remote::test::freePort("127.0.0.3") : b.port();
        const std::string keyB = fault == Fault::WrongClientKey ? b.wrongKey() : b.clientKey();
        writeFile(home + "/.ssh/config",
                  alias("gpu-a", a, a.port(), a.clientKey()) + alias("gpu-b", b, portB, keyB));
        std::string known = "[127.0.0.2]:" + std::to_string(a.port()) + " " + a.hostPublicKey() + "\n";
        if (fault == Fault::ChangedKey)  // another host's key under gpu-b's name
            known += "[127.0.0.3]:" + std::to_string(b.port()) + " " + a.hostPublicKey() + "\n";
        else if (fault != Fault::UnknownKey)
            known += "[127.0.0.3]:" + std::to_string(b.port()) + " " + b.hostPublicKey() + "\n";
        writeFile(home + "/.ssh/known_hosts", known);
        const std::string bin = lathe::test::binPath("lathectl");
        // LathectlNotSet: the hosts' PATH (sshd's default) has no lathectl, so only --stage helps.
        const std::string lathectlA = fault == Fault::LathectlNotSet ? "" : " --lathectl " + bin;
        const std::string lathectlB = fault == Fault::LathectlNotSet ? ""
                                      : fault == Fault::NoLathectl   ? " --lathectl /opt/nowhere/lathectl"
                                                                     : " --lathectl " + bin;
        REQUIRE(run("hosts add gpu-a --address gpu-a --slots 2" + lathectlA).exitCode == 0);
        REQUIRE(run("hosts add gpu-b --address gpu-b --slots 2" + lathectlB).exitCode == 0);
    }

    // lathectl with this cluster's $HOME (its ssh config and known_hosts) and workspace; no agent.
    std::string command(const std::string& args) const {
        return "env -u SSH_AUTH_SOCK HOME=" + home + " " + lathe::test::binPath("lathectl") + " " + args +
               " --db " + db;
    }
    lathe::test::ProcessResult run(const std::string& args) const { return runShell(command(args)); }

    std::string workspaceId() const { return lathe::core::Store(db).workspaceId(); }
};

// The run's worker processes on any of the hosts (all on this machine), by the owner flag only
// they carry. [w]orker: the pattern must not match the shell running pgrep.
std::vector<int> rankPids(const std::string& workspaceId) {
    return lathe::test::pidsMatching("[w]orker .*/config.toml --lifeline.*--owner " + workspaceId + ":");
}

// The pid among `pids` whose environment says RANK=`rank` (0 if none).
int rankOf(const std::vector<int>& pids, int rank) {
    for (int pid : pids) {
        const std::string env = lathe::remote::test::readFile("/proc/" + std::to_string(pid) + "/environ");
        const std::string want = "RANK=" + std::to_string(rank);
        size_t pos = 0;
        while (pos < env.size()) {
            const auto end = env.find('\0', pos);
            if (env.compare(pos, (end == std::string::npos ? env.size() : end) - pos, want) == 0) return pid;
            if (end == std::string::npos) break;
            pos = end + 1;
        }
    }
    return 0;
}

// Polls until no rank of the run is left, for at most `seconds`; true if none is.
bool noRankWithin(const std::string& workspaceId, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
        if (rankPids(workspaceId).empty()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return rankPids(workspaceId).empty();
}

// Waits (at most 120 s) until all 4 ranks run and have trained a few steps.
std::vector<int> waitForFourRanks(const Cluster& c, const std::string& ws) {
    for (int i = 0; i < 600; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const auto pids = rankPids(ws);
        if (pids.size() == 4) {
            lathe::core::Store store(c.db);
            const auto runs = store.listRuns();
            if (!runs.empty() && !store.metrics(runs.front().id, "train/loss").empty()) return pids;
        }
    }
    return {};
}

// The parameters of a run's last checkpoint, in model order.
std::vector<torch::Tensor> savedParameters(const lathe::core::Store& store, int64_t runId) {
    const auto run = store.run(runId);
    REQUIRE(run);
    const auto spec = lathe::core::parseRunSpec(run->config, "run config", false);
    const auto split = lathe::core::data::loadSplit(spec);
    auto model =
        lathe::core::makeModel(spec, split.train.shape, static_cast<int64_t>(split.train.classNames.size()));
    const auto arts = store.artifacts(runId);
    REQUIRE_FALSE(arts.empty());
    REQUIRE(fs::exists(arts.back().path));
    lathe::core::loadModelWeights(arts.back().path, *model);
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
}

// The home directory sshd logs the (shared) remote user into: the passwd entry's, not $HOME.
fs::path loginHome() {
    const passwd* pw = ::getpwuid(::geteuid());
    return pw && pw->pw_dir ? fs::path(pw->pw_dir) : fs::path("/root");
}

// The run directories the launcher left under ~/.cache/lathe/runs of the remote user.
std::vector<std::string> leftRunDirs(const std::string& workspaceId) {
    std::vector<std::string> left;
    const fs::path root = loginHome() / ".cache/lathe/runs";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec))
        if (e.path().filename().string().rfind(workspaceId.substr(0, 8) + "-", 0) == 0)
            left.push_back(e.path());
    return left;
}

// A run long enough to be interrupted, started in the background; its pid and output files.
struct Background {
    int pid = 0;
    std::string out, err;
};
Background startLongRun(const Cluster& c) {
    Background bg{0, c.dir.file("train.out"), c.dir.file("train.err")};
    const auto r =
        runShell("( " + c.command("train --epochs 100000 --threads 1 -q --json --hosts gpu-a:2,gpu-b:2") +
                 " >" + bg.out + " 2>" + bg.err + " & echo $! )");
    bg.pid = std::atoi(r.out.c_str());
    return bg;
}

int waitExit(int pid, double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
        if (::kill(pid, 0) != 0) return 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
}

}  // namespace

TEST_CASE(
    "a 2-host x 2-slot run completes with its metrics and fetched checkpoint and equals a local 4-process "
    "run",
    "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    const auto remote = c.run("train" + kTrain + " --hosts gpu-a:2,gpu-b:2");
    INFO(remote.err << remote.out);
    REQUIRE(remote.exitCode == 0);
    const auto rj = json::parse(remote.out);
    CHECK(rj.at("status") == "completed");
    CHECK(rj.at("epochs") == 2);

    const auto local = c.run("train" + kTrain + " --nproc 4");
    INFO(local.err);
    REQUIRE(local.exitCode == 0);
    const auto lj = json::parse(local.out);

    lathe::core::Store store(c.db);
    const auto rid = rj.at("run_id").get<int64_t>(), lid = lj.at("run_id").get<int64_t>();
    // Metrics of every step arrived, rank 1..3's communication figures beside rank 0's.
    CHECK(store.metrics(rid, "train/loss").size() == store.metrics(lid, "train/loss").size());
    CHECK_FALSE(store.metrics(rid, "rank3/comm/ms").empty());
    // The checkpoint is a local file of the workspace, and the same parameters as the local run's.
    const auto arts = store.artifacts(rid);
    REQUIRE_FALSE(arts.empty());
    CHECK(arts.back().path.rfind(store.artifactDir(rid), 0) == 0);
    // The same training step by step: every step's global gradient norm, and the final
    // parameters. Bit for bit on the AVX2 machines of this project; on an AVX-512 one (Zen 5) the
    // 2-host and the 1-host layout differ in the last bits of some steps' averaged gradients
    // (measured: gradient norms within 3e-8 relative, parameters within 7e-8 after 12 steps; each
    // layout is bit-reproducible run to run; the cause is not yet pinned down), so the check
    // allows rounding and nothing more: a wrong or missing rank's gradient moves these by far more.
    const auto gr = store.metrics(rid, "train/grad_norm"), gl = store.metrics(lid, "train/grad_norm");
    REQUIRE(gr.size() == gl.size());
    for (size_t i = 0; i < gr.size(); ++i) {
        INFO("step " << gr[i].step);
        CHECK(gr[i].step == gl[i].step);
        CHECK(std::abs(gr[i].value - gl[i].value) <= 1e-6 * std::abs(gl[i].value));
    }
    const auto pr = savedParameters(store, rid), pl = savedParameters(store, lid);
    REQUIRE(pr.size() == pl.size());
    for (size_t i = 0; i < pr.size(); ++i) {
        INFO("parameter " << i << ": max difference " << (pr[i] - pl[i]).abs().max().item<double>());
        CHECK(torch::allclose(pr[i], pl[i], /*rtol=*/1e-5, /*atol=*/1e-6));
    }
    CHECK(rj.at("val/loss").get<double>() == Approx(lj.at("val/loss").get<double>()).epsilon(1e-6));
    // The log says where the ranks ran; the run registers as a model like a local one.
    bool placed = false;
    for (const auto& l : store.logs(rid))
        placed |= l.text.find("host gpu-b (127.0.0.3)") != std::string::npos;
    CHECK(placed);
    const auto reg = c.run("models register digits-remote --run " + std::to_string(rid));
    INFO(reg.err);
    CHECK(reg.exitCode == 0);
    // Nothing of the run is left on the hosts.
    CHECK(rankPids(ws).empty());
    CHECK(leftRunDirs(ws).empty());
}

TEST_CASE(
    "pipeline stages on two hosts and tensor-parallel shards on one follow local runs, and their "
    "checkpoints come home whole and resume across the hosts",
    "[remote][launch][sshd][pipeline]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    const std::string net = kTrain + " --hidden 64,64,64";
    lathe::core::Store store(c.db);
    const auto files = [&](int64_t run) {
        std::set<std::string> names;
        for (const auto& e : fs::directory_iterator(store.artifactDir(run)))
            if (e.path().extension() == ".ckpt") names.insert(e.path().filename().string());
        return names;
    };
    const auto same = [&](int64_t a, int64_t b) {
        const auto pa = savedParameters(store, a), pb = savedParameters(store, b);  // stages merged
        REQUIRE(pa.size() == pb.size());
        for (size_t i = 0; i < pa.size(); ++i) {
            INFO("parameter " << i << ": max difference " << (pa[i] - pb[i]).abs().max().item<double>());
            CHECK(torch::allclose(pa[i], pb[i], /*rtol=*/1e-5, /*atol=*/1e-6));
        }
    };
    const auto train = [&](const std::string& flags) {
        const auto r = c.run("train" + net + flags);
        INFO(r.err << r.out);
        REQUIRE(r.exitCode == 0);
        return json::parse(r.out).at("run_id").get<int64_t>();
    };

    // One stage per host: stage 1's file is written by rank 0 and fetched with its own.
    const auto remote = train(" --pipeline-stages 2 --hosts gpu-a:1,gpu-b:1");
    const auto local = train(" --pipeline-stages 2");
    CHECK(files(remote) == std::set<std::string>{"last.ckpt", "last.stage1.ckpt"});
    same(remote, local);
    CHECK_FALSE(store.metrics(remote, "pipe/stage1/bubble").empty());
    // The run resumes across the hosts from both stages' files, one epoch further.
    const auto resumed =
        c.run("train --resume " + std::to_string(remote) + " --epochs 3 -q --json --hosts gpu-a:1,gpu-b:1");
    INFO(resumed.err);
    REQUIRE(resumed.exitCode == 0);
    CHECK(json::parse(resumed.out).at("epochs") == 3);

    // Tensor-parallel shards stay on one host: two slots of gpu-a, not one slot of each host.
    const auto tp = train(" --tensor-parallel 2 --hosts gpu-a:2");
    const auto tpLocal = train(" --tensor-parallel 2");
    CHECK(files(tp) == std::set<std::string>{"last.ckpt", "last.tp1.ckpt"});
    same(tp, tpLocal);
    const auto split = c.run("train" + net + " --tensor-parallel 2 --hosts gpu-a:1,gpu-b:1");
    CHECK(split.exitCode == 1);
    CHECK_THAT(split.out, Catch::Contains("keeps each group on one host"));
    CHECK(noRankWithin(ws, 30));
    CHECK(leftRunDirs(ws).empty());
}

TEST_CASE(
    "a host that fails its check stops the launch before any rank starts and the message names host and "
    "cause",
    "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    using Fault = Cluster::Fault;
    const std::vector<std::pair<Fault, std::string>> cases{
        {Fault::UnknownKey, "is not in"},
        {Fault::ChangedKey, "host key differs"},
        {Fault::WrongClientKey, "authentication failed"},
        {Fault::ClosedPort, "cannot connect"},
        {Fault::NoLathectl, "no lathectl at /opt/nowhere/lathectl"},
    };
    for (const auto& [fault, message] : cases) {
        INFO("expected: " << message);
        Cluster c(fault);
        const auto r = c.run("train" + kTrain + " --hosts gpu-a:2,gpu-b:2");
        CHECK(r.exitCode == 1);
        CHECK_THAT(r.err, Catch::Contains("not launched (nothing was started)"));
        CHECK_THAT(r.err, Catch::Contains("host gpu-b") && Catch::Contains(message));
        CHECK_THAT(r.err, !Catch::Contains("host gpu-a"));  // the healthy host is not blamed
        lathe::core::Store store(c.db);
        CHECK(store.listRuns().empty());
        CHECK(rankPids(c.workspaceId()).empty());
    }
}

TEST_CASE("a remote rank killed mid-run fails the run naming it and every rank on both hosts ends",
          "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    std::thread killer([&] {
        const auto pids = waitForFourRanks(c, ws);
        if (pids.size() == 4)
            ::kill(rankOf(pids, 3), SIGKILL);  // rank 3, on gpu-b
        else
            runShell("pkill -f -- '[l]athectl train .*" + c.db + "'");  // end the run: the test fails
    });
    const auto start = Clock::now();
    const auto r = c.run("train --epochs 100000 --threads 1 -q --json --hosts gpu-a:2,gpu-b:2");
    killer.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    INFO(r.err);
    CHECK(r.exitCode == 1);
    const auto j = json::parse(r.out);
    CHECK(j.at("status") == "failed");
    CHECK_THAT(j.at("error").get<std::string>(),
               Catch::Contains("rank 3 (on gpu-b) was killed by signal KILL"));
    CHECK(seconds < 150);
    CHECK(noRankWithin(ws, 30));
    CHECK(leftRunDirs(ws).empty());
}

TEST_CASE("the launcher killed with SIGKILL mid-run leaves no remote rank after 30 s (the lifeline)",
          "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    const auto bg = startLongRun(c);
    REQUIRE(bg.pid > 0);
    const auto pids = waitForFourRanks(c, ws);
    if (pids.size() != 4) ::kill(bg.pid, SIGKILL);
    REQUIRE(pids.size() == 4);
    ::kill(bg.pid, SIGKILL);
    CHECK(waitExit(bg.pid, 10) == 0);
    CHECK(noRankWithin(ws, 30));
}

TEST_CASE("Ctrl+C on a run across hosts stops every rank and the stopped run resumes across the hosts",
          "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    const auto bg = startLongRun(c);
    REQUIRE(bg.pid > 0);
    const auto pids = waitForFourRanks(c, ws);
    if (pids.size() != 4) ::kill(bg.pid, SIGKILL);
    REQUIRE(pids.size() == 4);
    ::kill(bg.pid, SIGINT);
    REQUIRE(waitExit(bg.pid, 60) == 0);
    const auto j = json::parse(lathe::remote::test::readFile(bg.out));
    CHECK(j.at("status") == "stopped");
    CHECK(noRankWithin(ws, 30));
    CHECK(leftRunDirs(ws).empty());

    // The stopped run resumes across the hosts from its fetched checkpoint, one epoch further.
    const auto id = j.at("run_id").get<int64_t>();
    lathe::core::Store store(c.db);
    const auto arts = store.artifacts(id);
    REQUIRE_FALSE(arts.empty());
    const auto epoch = lathe::core::readCheckpointInfo(arts.back().path).epoch;
    const auto resumed = c.run("train --resume " + std::to_string(id) + " --epochs " +
                               std::to_string(epoch + 1) + " -q --json --hosts gpu-a:2,gpu-b:2");
    INFO(resumed.err);
    REQUIRE(resumed.exitCode == 0);
    const auto rj = json::parse(resumed.out);
    CHECK(rj.at("run_id") == id);
    CHECK(rj.at("status") == "completed");
    CHECK(rj.at("epochs") == epoch + 1);
    CHECK(noRankWithin(ws, 30));
}

TEST_CASE("a connection dropped mid-run fails the run naming the host and no rank is left",
          "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    std::thread dropper([&] {
        if (waitForFourRanks(c, ws).size() != 4) {
            runShell("pkill -f -- '[l]athectl train .*" + c.db + "'");
            return;
        }
        for (int pid : c.b.connectionPids()) ::kill(pid, SIGKILL);  // gpu-b's side of every connection
    });
    const auto r = c.run("train --epochs 100000 --threads 1 -q --json --hosts gpu-a:2,gpu-b:2");
    dropper.join();
    INFO(r.err);
    CHECK(r.exitCode == 1);
    const auto j = json::parse(r.out);
    CHECK(j.at("status") == "failed");
    CHECK_THAT(j.at("error").get<std::string>(), Catch::Contains("(on gpu-b) lost its connection"));
    CHECK(noRankWithin(ws, 30));
}

TEST_CASE("staging uploads this lathectl to hosts that lack it and the next run uses the staged copy",
          "[remote][launch][sshd]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c(Cluster::Fault::LathectlNotSet);
    const auto ws = c.workspaceId();
    const auto refused = c.run("train" + kTrain + " --hosts gpu-a:1,gpu-b:1");
    CHECK(refused.exitCode == 1);
    CHECK_THAT(refused.err, Catch::Contains("no lathectl on the PATH") && Catch::Contains("--stage"));

    // The staging directory is the remote user's; this build's copy (named by its version and
    // digest) must not be there from an earlier run, or nothing would be uploaded.
    const fs::path stageRoot = loginHome() / ".cache/lathe/stage";
    const std::string version = runShell(lathe::test::binPath("lathectl") + " --version").out;
    std::string tag = version.substr(0, version.find('\n'));
    for (char& ch : tag)
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.') ch = '-';
    tag += "-" + lathe::core::sha256File(lathe::test::binPath("lathectl")).substr(0, 12);
    std::error_code ec;
    fs::remove_all(stageRoot / tag, ec);
    REQUIRE_FALSE(fs::exists(stageRoot / tag));

    const auto staged = c.run("train" + kTrain + " --hosts gpu-a:1,gpu-b:1 --stage");
    INFO(staged.err << staged.out);
    REQUIRE(staged.exitCode == 0);
    lathe::core::Store store(c.db);
    const auto first = json::parse(staged.out).at("run_id").get<int64_t>();
    // Staged during the check before the launch (the launch's own check then finds the copy).
    CHECK_THAT(staged.err, Catch::Contains("staged lathectl") && Catch::Contains(" on gpu-a at ") &&
                               Catch::Contains(" on gpu-b at ") && Catch::Contains(".cache/lathe/stage/"));
    int onStaged = 0;
    for (const auto& l : store.logs(first))
        onStaged += l.text.find(".cache/lathe/stage/") != std::string::npos;
    CHECK(onStaged == 2);
    // A second run finds the staged copy (same version and build) and uploads nothing.
    const auto again = c.run("train" + kTrain + " --hosts gpu-a:1,gpu-b:1");
    INFO(again.err);
    REQUIRE(again.exitCode == 0);
    const auto second = json::parse(again.out).at("run_id").get<int64_t>();
    int usedStaged = 0;
    CHECK_THAT(again.err, !Catch::Contains("staged lathectl"));
    for (const auto& l : store.logs(second))
        usedStaged += l.text.find(".cache/lathe/stage/") != std::string::npos;
    CHECK(usedStaged == 2);
    CHECK(noRankWithin(ws, 30));
    CHECK(fs::exists(stageRoot / tag / "bin/lathectl"));
    fs::remove_all(stageRoot / tag, ec);
}

TEST_CASE("a study runs its trials on the inventory's hosts, one trial per host at a time",
          "[remote][launch][sshd][tune]") {
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    Cluster c;
    const auto ws = c.workspaceId();
    // Each trial is a 2-rank run on one host; the two hosts take trials side by side.
    const auto r = c.run(
        "tune --epochs 2 --seed 5 --threads 1 --trials 3 --algo random --study r1 --space "
        "'lr=loguniform(1e-3,0.1)' --hosts gpu-a:2,gpu-b:2 --json");
    INFO(r.err << r.out);
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    REQUIRE(j.at("trials").size() == 3);
    std::set<std::string> hosts;
    lathe::core::Store store(c.db);
    for (const auto& t : j.at("trials")) {
        CHECK(t.at("state") == "complete");
        hosts.insert(t.at("host").get<std::string>());
        const auto run = store.run(t.at("run_id").get<int64_t>());
        REQUIRE(run);
        // The run went across the trial's host: 2 ranks there.
        bool placed = false;
        for (const auto& l : store.logs(run->id))
            placed |=
                l.text.find("host " + t.at("host").get<std::string>() + " (127.0.0.") != std::string::npos;
        CHECK(placed);
    }
    CHECK(hosts == std::set<std::string>{"gpu-a", "gpu-b"});

    // One slot each: every trial is a single-process run on its host. Under PPO the agent's
    // policy travels with the trial (uploaded, the uploaded config pointed at the copy), and its
    // decisions come back as the run's metrics, which the study learns from.
    const auto p = c.run(
        "tune --epochs 3 --seed 5 --threads 1 --trials 3 --algo ppo --study p1 --space "
        "'hidden=choice([16],[64])' --hosts gpu-a:1,gpu-b:1 --json");
    INFO(p.err << p.out);
    REQUIRE(p.exitCode == 0);
    const auto pj = json::parse(p.out);
    REQUIRE(pj.at("trials").size() == 3);
    CHECK(pj.at("state").at("updates").get<int>() == 3);
    hosts.clear();
    for (const auto& t : pj.at("trials")) {
        CHECK(t.at("state") == "complete");
        hosts.insert(t.at("host").get<std::string>());
        const auto run = t.at("run_id").get<int64_t>();
        CHECK(store.metrics(run, "ppo/action").size() == 2);  // after each epoch but the last
        CHECK(store.metrics(run, "ppo/reward").size() == 2);
        // Recorded with this machine's copy of the policy, so the run can be repeated here.
        CHECK(store.params(run).at("ppo_policy").find(c.db) == 0);
        bool placed = false;
        for (const auto& l : store.logs(run))
            placed |=
                l.text.find("host " + t.at("host").get<std::string>() + " (127.0.0.") != std::string::npos;
        CHECK(placed);
    }
    CHECK(hosts == std::set<std::string>{"gpu-a", "gpu-b"});
    // The agent steers one process: a 2-slot placement is refused before anything starts.
    const auto bad = c.run(
        "tune --epochs 2 --trials 1 --algo ppo --space 'hidden=choice([16],[64])' "
        "--hosts gpu-a:2 --study p2");
    CHECK(bad.exitCode == 2);
    CHECK_THAT(bad.err, Catch::Contains("gpu-a:1"));
    CHECK(rankPids(ws).empty());
}

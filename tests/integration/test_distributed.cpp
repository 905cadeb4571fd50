// Data-parallel training with real worker processes on loopback (Gloo).
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/core/launcher.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "run_process.h"

using lathe::test::binPath;
using lathe::test::runShell;
using lathe::test::said;
using lathe::test::TempDir;
using lathe::test::workerPids;
using nlohmann::json;

namespace {

std::string lathectl(const std::string& args) { return binPath("lathectl") + " " + args; }

std::vector<double> values(const lathe::core::Store& s, int64_t run, const std::string& key) {
    std::vector<double> out;
    for (const auto& p : s.metrics(run, key)) out.push_back(p.value);
    return out;
}

// 2 ranks x 32 against 1 rank x 64: the averaged gradient of every step is the single process's
// gradient, so gradient norms and final losses agree (1e-5).
void checkFollows(const lathe::core::Store& store, const json& one, const json& two) {
    const auto ra = one.at("run_id").get<int64_t>(), rb = two.at("run_id").get<int64_t>();
    const auto ga = values(store, ra, "train/grad_norm"), gb = values(store, rb, "train/grad_norm");
    REQUIRE(ga.size() == 23);
    REQUIRE(gb.size() == 23);
    for (size_t i = 0; i < ga.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(gb[i] == Approx(ga[i]).epsilon(1e-5));
    }
    CHECK(two.at("val/loss").get<double>() == Approx(one.at("val/loss").get<double>()).epsilon(1e-5));
}

// One rank with batch 64 and two with batch 32 each, both with `flags` (the two-rank run adds
// `twoFlags`); their --json objects.
std::pair<json, json> oneAndTwoRanks(const std::string& db, const std::string& flags,
                                     const std::string& twoFlags) {
    const auto one =
        runShell(lathectl("train --epochs 1 --batch 64 --threads 1 -q --json" + flags + " --db " + db));
    {
        INFO(said(one));
        REQUIRE(one.exitCode == 0);
    }
    const auto two = runShell(
        lathectl("train --epochs 1 --batch 32 --nproc 2 -q --json" + flags + twoFlags + " --db " + db));
    INFO(said(two));
    REQUIRE(two.exitCode == 0);
    return {json::parse(one.out), json::parse(two.out)};
}

}  // namespace

TEST_CASE("2 ranks with batch 32 each follow 1 rank with batch 64 step by step, with every strategy",
          "[distributed]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    const std::string strategy = GENERATE(as<std::string>{}, "ring", "hierarchical --ranks-per-host 1", "ps");
    INFO("strategy " << strategy);
    const auto [a, b] = oneAndTwoRanks(db, "", " --strategy " + strategy);
    lathe::core::Store store(db);
    const auto rb = b.at("run_id").get<int64_t>();
    checkFollows(store, a, b);
    CHECK(b.at("train/loss").get<double>() == Approx(a.at("train/loss").get<double>()).epsilon(1e-5));
    // Communication is measured per step, and rank 1's own figures are kept beside rank 0's.
    CHECK(values(store, rb, "comm/bytes_sent").size() == 23);
    CHECK(values(store, rb, "comm/bytes_sent").front() >= 26122 * 4);  // the gradient's size, at least
    CHECK(values(store, rb, "rank1/comm/ms").size() == 23);
    const auto overlap = values(store, rb, "comm/overlap");
    CHECK(*std::min_element(overlap.begin(), overlap.end()) >= 0.0);
    CHECK(*std::max_element(overlap.begin(), overlap.end()) <= 1.0);
}

TEST_CASE("killing a rank fails the run with that rank's status and leaves no process behind",
          "[distributed]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    const auto config = dir.file("l.db-files/artifacts/run-1/config.toml");
    std::thread killer([&] {
        // Wait for both ranks to be training, then kill rank 1 (the second started).
        for (int i = 0; i < 200; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            const auto pids = workerPids(config);
            if (pids.size() == 2 && i > 20) {
                ::kill(pids[1], SIGKILL);
                return;
            }
        }
        // Never found both ranks: end the run so the test fails instead of hanging.
        runShell("pkill -f -- '[l]athectl train .*" + db + "'");
    });
    const auto start = std::chrono::steady_clock::now();
    const auto r = runShell(lathectl("train --nproc 2 --epochs 100000 -q --json --db " + db));
    killer.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(r.exitCode == 1);
    const auto j = json::parse(r.out);
    CHECK(j.at("status") == "failed");
    CHECK_THAT(j.at("error").get<std::string>(), Catch::Contains("rank 1 was killed by signal"));
    CHECK(seconds < 60);
    CHECK(workerPids(config).empty());
    lathe::core::Store store(db);
    CHECK(store.run(1)->status == lathe::core::RunStatus::Failed);
}

TEST_CASE("Ctrl+C on a multi-process run stops every rank and records it as stopped", "[distributed]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    // Once the run is recorded as running and the workers have had a moment to start training.
    const auto r = runShell(
        "(" + lathectl("train --nproc 2 --epochs 100000 -q --json --db " + db) +
        " & pid=$!; for i in $(seq 600); do " + lathectl("runs list --db " + db) +
        " 2>/dev/null | grep -q running && break; sleep 0.1; done; sleep 2; kill -INT $pid; wait $pid)");
    INFO(said(r));  // train's own stderr: why it ended, if not by the SIGINT
    CHECK(r.exitCode == 130);
    CHECK(json::parse(r.out).at("status") == "stopped");
    CHECK(workerPids(dir.file("l.db-files/artifacts/run-1/config.toml")).empty());
    lathe::core::Store store(db);
    REQUIRE(store.run(1));
    CHECK(store.run(1)->status == lathe::core::RunStatus::Stopped);
}

TEST_CASE("the torchrun environment is read and checked", "[distributed]") {
    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "2", 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "29555", 1);
    auto d = lathe::core::distEnvFromEnvironment();
    CHECK(d.distributed());
    CHECK(d.rank == 2);
    CHECK(d.worldSize == 4);
    CHECK(d.masterAddr == "10.1.2.3");
    CHECK(d.masterPort == 29555);
    setenv("RANK", "4", 1);
    CHECK_THROWS_WITH(lathe::core::distEnvFromEnvironment(),
                      Catch::Contains("RANK=4 is not below WORLD_SIZE=4"));
    setenv("RANK", "x", 1);
    CHECK_THROWS_AS(lathe::core::distEnvFromEnvironment(), lathe::core::ConfigError);
    for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
    CHECK_FALSE(lathe::core::distEnvFromEnvironment().distributed());
    // A worker asked for several ranks without that environment says how to start it.
    const auto r = runShell(lathectl("worker --nproc 2"));
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("lathectl train") && Catch::Contains("RANK"));
}

TEST_CASE("int8 and int4 gradients with error feedback train digits to within a point of uncompressed",
          "[distributed]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    const std::string common = "train --nproc 2 --batch 32 --epochs 20 -q --json";
    auto run = [&](const std::string& extra) {
        const auto r = runShell(lathectl(common + " " + extra + db));
        INFO(said(r));
        REQUIRE(r.exitCode == 0);
        return json::parse(r.out);
    };
    const auto plain = run("--compress none");
    const double base = plain.at("val/accuracy").get<double>();
    CHECK(base > 0.95);
    for (const char* format : {"int8", "int4"}) {
        INFO(format);
        const auto j = run(std::string("--compress ") + format + " --error-feedback on");
        CHECK(j.at("val/accuracy").get<double>() >= base - 0.01);
        // Bytes on the wire against an fp32 ring all-reduce of the same gradients.
        CHECK(j.at("comm/compression_ratio").get<double>() >= (std::string(format) == "int8" ? 3.9 : 7.5));
    }
    const auto bf16 = run("--compress bf16");
    CHECK(bf16.at("comm/compression_ratio").get<double>() == Approx(2.0).epsilon(0.01));
    CHECK(bf16.at("val/accuracy").get<double>() >= base - 0.01);
}

TEST_CASE("hierarchical and parameter-server exchanges compress too and keep the accuracy", "[distributed]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    auto run = [&](const std::string& extra) {
        const auto r = runShell(lathectl("train --epochs 20 -q --json " + extra + db));
        INFO(said(r));
        REQUIRE(r.exitCode == 0);
        return json::parse(r.out);
    };
    const double base = run("--nproc 2 --batch 32 --compress none").at("val/accuracy").get<double>();
    // Two "hosts" of one rank: the leaders' exchange between hosts is the compressed one.
    const auto hier =
        run("--nproc 2 --batch 32 --strategy hierarchical --ranks-per-host 1 --compress int8 "
            "--error-feedback on");
    CHECK(hier.at("val/accuracy").get<double>() >= base - 0.01);
    CHECK(hier.at("comm/compression_ratio").get<double>() >= 3.9);
    // Compressed push to the server and compressed pull back.
    const auto ps = run("--nproc 2 --batch 32 --strategy ps --compress int4 --error-feedback on");
    CHECK(ps.at("val/accuracy").get<double>() >= base - 0.01);
    CHECK(ps.at("comm/compression_ratio").get<double>() >=
          3.9);  // rank 0 serves the buckets: its replies dominate
    // Within a host gradients stay FP32: with two ranks per host only half the traffic shrinks.
    const auto mixed = run("--nproc 4 --batch 16 --strategy hierarchical --ranks-per-host 2 --compress int8");
    CHECK(mixed.at("comm/compression_ratio").get<double>() > 1.1);
    CHECK(mixed.at("comm/compression_ratio").get<double>() < 3.9);
}

TEST_CASE("compressed, hierarchical and ps exchanges overlap with backward", "[distributed]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    for (const std::string mode :
         {"--compress int8", "--strategy ps", "--strategy hierarchical --ranks-per-host 1"}) {
        INFO(mode);
        // Four 1 MB buckets: the last layer's bucket is ready long before backward ends.
        const auto r =
            runShell(lathectl("train --nproc 2 --batch 64 --epochs 1 --hidden 1024,1024,1024 --bucket-mb 1 "
                              "-q --json " +
                              mode + db));
        REQUIRE(r.exitCode == 0);
        const auto id = json::parse(r.out).at("run_id").get<int64_t>();
        const auto m = runShell(lathectl("metrics " + std::to_string(id) + " --key comm/overlap --csv" + db));
        REQUIRE(m.exitCode == 0);
        // Timing on a shared machine varies step to step; some step must show communication
        // running while backward still did (before, these exchanges only ran after it: 0).
        double best = 0;
        std::istringstream lines(m.out);
        std::string line;
        std::getline(lines, line);  // header
        while (std::getline(lines, line)) best = std::max(best, std::stod(line.substr(line.rfind(',') + 1)));
        CHECK(best > 0.05);
    }
}

TEST_CASE("ps sends only the touched rows of an embedding table and still follows the single process",
          "[distributed]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    const std::string model = " --model embed --embedding-rows 16384 --hidden 64,64";
    const auto [a, b] = oneAndTwoRanks(db, model, " --strategy ps");
    lathe::core::Store store(db);
    const auto rb = b.at("run_id").get<int64_t>();
    checkFollows(store, a, b);
    // The table is 16384 x 64 floats (4 MiB); a batch of 32 digits touches at most 32 x 64 rows
    // of it. Rank 1 pushes its rows and the dense layers' buckets, never the whole table.
    const auto bytes = values(store, rb, "rank1/comm/bytes_sent");
    REQUIRE(bytes.size() == 23);
    for (double v : bytes) CHECK(v < 16384.0 * 64 * 4 / 4);
    CHECK(b.at("comm/compression_ratio").get<double>() > 4);  // vs an fp32 ring all-reduce of everything
}

TEST_CASE("backend = nccl is refused before any worker starts where it cannot run", "[distributed]") {
    // Where NCCL may run (a GPU per rank: gpu_tests covers it), ask for what it still cannot do,
    // so that every machine checks a refusal: NCCL exchanges CUDA tensors, so a CPU run is refused
    // everywhere; and one rank more than there are GPUs on the default device (the CPU on a machine
    // without GPUs) is refused too.
    TempDir dir;
    const auto db = " -q --db " + dir.file("l.db");
    const int gpus = lathe::core::cudaDeviceCount();
    const std::string ranks = std::to_string(std::max(2, gpus + 1));
    for (const std::string& args : std::vector<std::string>{"--nproc 2 --device cpu", "--nproc " + ranks}) {
        INFO(args << " on a machine with " << gpus << " GPU(s)");
        const auto r = runShell(lathectl("train --epochs 1 --backend nccl " + args + db));
        CHECK(r.exitCode == 2);
        CHECK_THAT(r.err, Catch::Contains("nccl") && Catch::Contains("backend = \"gloo\""));
    }
    // Refused before anything ran: no run was recorded.
    CHECK(lathe::core::Store(dir.file("l.db")).listRuns().empty());
}

TEST_CASE("a resumed compressed run carries its error-feedback residuals and follows the uninterrupted one",
          "[distributed]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    const std::string common =
        "train --nproc 2 --batch 32 --threads 1 -q --json --compress int8 --error-feedback on "
        "--checkpoint-every 1";
    auto train = [&](const std::string& extra) {
        const auto r = runShell(lathectl(common + " " + extra + db));
        INFO(said(r));
        REQUIRE(r.exitCode == 0);
        return json::parse(r.out).at("run_id").get<int64_t>();
    };
    const auto straight = train("--epochs 4");
    const auto partial = train("--epochs 2");
    const auto resumed =
        runShell(lathectl("train --resume " + std::to_string(partial) + " --epochs 4 -q --json" + db));
    INFO(said(resumed));
    REQUIRE(resumed.exitCode == 0);
    lathe::core::Store store(dir.file("l.db"));
    // Step by step: the resumed steps (epochs 3 and 4) start from the residuals the first two
    // epochs left, so they are the uninterrupted run's steps (zeros instead would differ).
    for (const char* key : {"train/grad_norm", "val/loss"}) {
        INFO(key);
        const auto a = values(store, straight, key), b = values(store, partial, key);
        REQUIRE(a.size() == b.size());
        REQUIRE(a.size() >= 4);
        for (size_t i = 0; i < a.size(); ++i) {
            INFO("point " << i);
            CHECK(b[i] == Approx(a[i]).epsilon(1e-6));
        }
    }
}

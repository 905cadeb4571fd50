// lathectl tune and lathectl studies as a user runs them: studies of real `lathectl train`
// processes on digits (random, TPE, ASHA, PPO), bad input, resume after a kill, reproducing the
// best trial. Each study is a few short runs (bounded in trials and epochs).
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "run_process.h"

using lathe::test::binPath;
using lathe::test::runShell;
using lathe::test::said;
using lathe::test::TempDir;
using nlohmann::json;

namespace {

std::string lathectl(const std::string& args) { return binPath("lathectl") + " " + args; }

// A small, quick, deterministic base: digits, an MLP, one thread per trial.
const std::string kBase = " --model mlp --data digits --batch 64 --threads 1 --seed 3";
const std::string kSpace = " --space 'lr=loguniform(1e-3,0.5)' --space 'hidden=choice([16],[64])'";

// Trains again from run `runId`'s recorded config (a new run) and returns its val/accuracy.
double rerun(const std::string& db, int64_t runId, const TempDir& dir) {
    const auto show = runShell(lathectl("runs show " + std::to_string(runId) + " --json --db " + db));
    REQUIRE(show.exitCode == 0);
    const std::string file = dir.file("again-" + std::to_string(runId) + ".toml");
    lathe::test::writeFile(file, json::parse(show.out).at("config").get<std::string>());
    const auto r = runShell(lathectl("train " + file + " --json -q --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    return json::parse(r.out).at("val/accuracy").get<double>();
}

json studyJson(const std::string& db, const std::string& name) {
    const auto r = runShell(lathectl("studies show " + name + " --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    return json::parse(r.out);
}

}  // namespace

TEST_CASE("lathectl tune refuses bad input with exit 2 before any trial starts", "[cli][tune]") {
    TempDir dir;
    const std::string db = " --db " + dir.file("lathe.db");
    struct Case {
        std::string args, says;
    };
    const std::vector<Case> cases = {
        {"", "search space is empty"},
        {" --space 'lr=loguniform(1e-3'", "lr"},
        {" --space 'learning_rate=uniform(0,1)'", "learning_rate"},
        {" --space 'lr=uniform(-1,0.1)'", "lr"},
        {" --space 'batch=choice(0,32)'", "batch"},
        {" --space 'lr=loguniform(1e-3,0.1)' --objective val/acc", "val/acc"},
        {" --space 'lr=loguniform(1e-3,0.1)' --algo bayes", "bayes"},
        {" --space 'lr=loguniform(1e-3,0.1)' --space 'lr=uniform(0.1,0.2)'", "lr"},
        {" --space 'epochs=int(1,3)' --algo asha", "budget"},
        {" --space 'lr=loguniform(1e-3,0.1)' --study 'bad name'", "bad name"},
        {" --space 'lr=loguniform(1e-3,0.1)' --timeout -5", "--timeout"},
        {" --space 'lr=loguniform(1e-3,0.1)' --stop-at inf", "--stop-at"},
    };
    for (const auto& c : cases) {
        const auto r = runShell(lathectl("tune --epochs 2 --trials 2" + kBase + c.args + db));
        INFO(c.args << "\n" << r.out << r.err);
        CHECK(r.exitCode == 2);
        CHECK_THAT(r.err, Catch::Contains(c.says));
    }
    // Nothing was started or recorded.
    lathe::core::Store store(dir.file("lathe.db"));
    CHECK(store.listRuns().empty());
    CHECK(lathe::core::Studies(dir.file("lathe.db")).list().empty());
    // An unknown study to resume or show.
    CHECK(runShell(lathectl("tune --resume nope" + db)).exitCode == 2);
    CHECK(runShell(lathectl("studies show nope" + db)).exitCode == 2);
}

TEST_CASE(
    "a TPE study runs its trials as parallel processes and its best trial reproduces from its parameters",
    "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    const auto r = runShell(lathectl("tune --epochs 2 --trials 6 --parallel 2 --startup-trials 3 --study s1" +
                                     kBase + kSpace + " --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    CHECK(j.at("sampler") == "tpe");
    CHECK(j.at("status") == "completed");
    REQUIRE(j.at("trials").size() == 6);
    std::set<int64_t> pids, runs, numbers;
    for (const auto& t : j.at("trials")) {
        CHECK(t.at("state") == "complete");
        pids.insert(t.at("pid").get<int64_t>());
        runs.insert(t.at("run_id").get<int64_t>());
        numbers.insert(t.at("number").get<int64_t>());
    }
    CHECK(pids.size() == 6);  // parallel trials never share a process
    CHECK(runs.size() == 6);
    CHECK(numbers == std::set<int64_t>{0, 1, 2, 3, 4, 5});
    // Two at a time: some trials' lifetimes overlap.
    bool overlap = false;
    const auto& ts = j.at("trials");
    for (size_t a = 0; a < ts.size(); ++a)
        for (size_t b = a + 1; b < ts.size(); ++b)
            overlap |= ts[a].at("started_at").get<double>() < ts[b].at("ended_at").get<double>() &&
                       ts[b].at("started_at").get<double>() < ts[a].at("ended_at").get<double>();
    CHECK(overlap);
    // The best is the best, and its run is an ordinary run of the workspace in the study's experiment.
    double best = 0;
    for (const auto& t : ts) best = std::max(best, t.at("value").get<double>());
    CHECK(j.at("best_value").get<double>() == best);
    const auto bestRun = j.at("best_run_id").get<int64_t>();
    const auto show =
        json::parse(runShell(lathectl("runs show " + std::to_string(bestRun) + " --json --db " + db)).out);
    CHECK(show.at("experiment") == "s1");
    CHECK(show.at("study").at("name") == "s1");
    // Reproduce: the base config plus the best parameters, as a fresh run.
    std::string params;
    for (const auto& [k, v] : j.at("best_params").items()) params += " --" + k + " " + v.get<std::string>();
    const auto again = runShell(lathectl("train --epochs 2" + kBase + params + " --json --db " + db));
    INFO(said(again));
    REQUIRE(again.exitCode == 0);
    CHECK(json::parse(again.out).at("val/accuracy").get<double>() == Approx(best).margin(1e-9));
    // studies list / show
    const auto list = json::parse(runShell(lathectl("studies list --json --db " + db)).out);
    REQUIRE(list.size() == 1);
    CHECK(list[0].at("name") == "s1");
    const auto text = runShell(lathectl("studies show s1 --db " + db));
    CHECK_THAT(text.out, Catch::Contains("best: trial"));
    CHECK_THAT(text.out, Catch::Contains("reproduce: lathectl train"));
    // Completion offers the workspace's studies and the algorithms.
    CHECK(runShell("LATHE_DB=" + db + " " + lathectl("__complete studies show ''")).out == "s1\n");
    CHECK(runShell("LATHE_DB=" + db + " " + lathectl("__complete tune --resume ''")).out == "s1\n");
    CHECK_THAT(runShell(lathectl("__complete tune --algo ''")).out, Catch::Contains("asha"));
}

TEST_CASE("trials forked from the study's fork server train exactly as fresh processes", "[cli][tune]") {
    TempDir dir;
    const std::string args =
        "tune --epochs 2 --trials 3 --parallel 2 --algo random --study f1" + kBase + kSpace + " --json --db ";
    const auto forked = runShell(lathectl(args + dir.file("forked.db")));
    INFO(said(forked));
    REQUIRE(forked.exitCode == 0);
    const auto fresh = runShell("LATHE_FORK_SERVER=0 " + lathectl(args + dir.file("fresh.db")));
    INFO(said(fresh));
    REQUIRE(fresh.exitCode == 0);
    // Which way each study started its trials, as it says on its progress lines.
    const std::string says = "trials start as forks of process ";
    REQUIRE_THAT(forked.err, Catch::Contains(says));
    CHECK_THAT(fresh.err, !Catch::Contains(says));
    // The forked trials trained on the data set the server parsed before it forked them.
    CHECK_THAT(forked.err, Catch::Contains("the fork server read digits ahead"));
    // The same trials, to the last bit of their objective, each in a process of its own.
    const auto a = json::parse(forked.out).at("trials");
    const auto b = json::parse(fresh.out).at("trials");
    REQUIRE(a.size() == 3);
    REQUIRE(b.size() == 3);
    std::set<int64_t> pids;
    for (size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i].at("state") == "complete");
        CHECK(a[i].at("params") == b[i].at("params"));
        CHECK(a[i].at("value").get<double>() == b[i].at("value").get<double>());
        pids.insert(a[i].at("pid").get<int64_t>());
    }
    CHECK(pids.size() == 3);
    // The server is gone with its study.
    const auto at = forked.err.find(says) + says.size();
    const auto server = std::stol(forked.err.substr(at, forked.err.find_first_not_of("0123456789", at) - at));
    CHECK(::kill(static_cast<pid_t>(server), 0) != 0);
}

TEST_CASE("a study ends early at its target or timeout and resuming it runs the trials it has left",
          "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    // Every val/accuracy is >= 0: the first complete trial meets the target.
    auto r = runShell(lathectl("tune --epochs 1 --trials 4 --study early --stop-at 0" + kBase + kSpace +
                               " --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    auto j = json::parse(r.out);
    CHECK(j.at("ended") == "target");
    CHECK(j.at("status") == "stopped");
    REQUIRE(j.at("trials").size() == 1);
    CHECK(j.at("trials")[0].at("state") == "complete");
    CHECK_THAT(r.err, Catch::Contains("reached its target"));
    CHECK_THAT(r.err, Catch::Contains("ran 1 of its 4 trials"));
    // Resumed without a target, it runs the other three.
    r = runShell(lathectl("tune --resume early --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    j = json::parse(r.out);
    CHECK(j.at("ended") == "trials");
    CHECK(j.at("status") == "completed");
    CHECK(j.at("trials").size() == 4);
    // A target no trial reaches changes nothing.
    r = runShell(lathectl("tune --epochs 1 --trials 2 --study never --stop-at 1.5" + kBase + kSpace +
                          " --json -q --db " + db));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("ended") == "trials");
    CHECK(json::parse(r.out).at("trials").size() == 2);
    // --timeout: the first two start at once (two slots), none after the time has passed; the
    // running ones finish.
    r = runShell(lathectl("tune --epochs 1 --trials 6 --parallel 2 --study timed --timeout 0.001" + kBase +
                          kSpace + " --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    j = json::parse(r.out);
    CHECK(j.at("ended") == "timeout");
    CHECK(j.at("status") == "stopped");
    REQUIRE(j.at("trials").size() == 2);
    for (const auto& t : j.at("trials")) CHECK(t.at("state") == "complete");
}

TEST_CASE("an ASHA study prunes trials at its rungs and the pruned runs say so", "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    // lr up to 5 diverges or crawls: such trials fall behind at epoch 1 or 3 of 9.
    const auto r = runShell(lathectl(
        "tune --epochs 9 --trials 8 --parallel 2 --algo asha --min-budget 1 --eta 3 --study a1 --space "
        "'lr=loguniform(1e-4,5)' --space 'hidden=choice([16],[64])'" +
        kBase + " --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    CHECK(j.at("sampler") == "random");
    CHECK(j.at("pruner") == "asha");
    int pruned = 0, complete = 0;
    for (const auto& t : j.at("trials")) {
        const auto state = t.at("state").get<std::string>();
        CHECK((state == "complete" || state == "pruned"));
        if (state == "complete") ++complete;
        if (state != "pruned") continue;
        ++pruned;
        const double at = t.at("pruned_at").get<double>();
        CHECK((at == 1.0 || at == 3.0));
        CHECK_THAT(t.at("error").get<std::string>(), Catch::Contains("is not in the best"));
        // The run stopped early, and says why.
        const auto run =
            json::parse(runShell(lathectl("runs show " + std::to_string(t.at("run_id").get<int64_t>()) +
                                          " --json --db " + db))
                            .out);
        CHECK(run.at("status") == "stopped");
        CHECK(run.at("study").at("state") == "pruned");
        CHECK(run.at("metrics").at("train/epoch").get<double>() < 9);
        bool says = false;
        for (const auto& l : run.at("logs"))
            says |= l.at("msg").get<std::string>().find("pruned by study a1") != std::string::npos;
        CHECK(says);
    }
    CHECK(pruned >= 1);
    CHECK(complete >= 1);
    // The best trial, trained again from its run's recorded config, gets the same accuracy.
    CHECK(rerun(db, j.at("best_run_id").get<int64_t>(), dir) ==
          Approx(j.at("best_value").get<double>()).margin(1e-9));
}

TEST_CASE("a study is woken by its trials' ends and rungs, not by its poll", "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    const std::string args =
        "tune --epochs 9 --trials 6 --parallel 1 --algo asha --min-budget 1 --eta 3 --study w1 "
        "--space 'lr=loguniform(1e-4,5)' --space 'hidden=choice([16],[64])'" +
        kBase + " --json --db " + db;
    // The study's own look at its trials once a minute: only the wakes can make it quicker. A
    // trial's end shows on its pidfd; a trial at a rung writes to the study's FIFO, and the study
    // judges it at once. One trial at a time, so that no other trial's event covers for a
    // missed one: every rung and every end would wait up to a minute.
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = runShell("LATHE_STUDY_POLL_SECONDS=60 " + lathectl(args));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    REQUIRE(j.at("trials").size() == 6);
    size_t judged = 0;
    for (const auto& t : j.at("trials")) {
        CHECK((t.at("state") == "complete" || t.at("state") == "pruned"));
        judged += t.at("rungs").size();
    }
    CHECK(judged >= 6);  // every trial reached the rung at epoch 1: at least six verdicts
    CHECK(secs < 60);    // none of them, and no trial's end, waited for the poll
    // The FIFO lives as long as its study.
    CHECK(!std::filesystem::exists(db + "-files/studies/w1/rung.fifo"));
    const auto bad = runShell("LATHE_STUDY_POLL_SECONDS=soon " + lathectl(args));
    CHECK(bad.exitCode == 2);
    CHECK_THAT(bad.err, Catch::Contains("LATHE_STUDY_POLL_SECONDS"));
}

TEST_CASE("a study killed mid-trial resumes without repeating finished trials", "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    // Trials of about 3 s (30 epochs of 90 steps), so that the kill lands inside the third.
    const std::string cmd = lathectl(
        "tune --epochs 30 --batch 16 --trials 4 --parallel 1 --algo random --study k1 --model mlp --data "
        "digits --threads 1 --seed 3" +
        kSpace + " --checkpoint-every 1 --db " + db);
    const auto bg = runShell(cmd + " > " + dir.file("tune.out") + " 2>&1 & echo $!");
    const int pid = std::stoi(bg.out);
    // Wait until two trials are complete and the third has a run with at least one epoch.
    lathe::core::Studies studies(db);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::vector<lathe::core::TrialRecord> before;
    for (;;) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const auto s = studies.study("k1");
        if (!s) continue;
        before = studies.trials(s->id);
        REQUIRE(before.size() <= 3);  // the kill must land in the third trial
        if (before.size() == 3 && before[2].runId > 0) {
            lathe::core::Store store(db);
            if (!store.metrics(before[2].runId, "train/epoch").empty()) break;
        }
    }
    ::kill(pid, SIGKILL);
    const auto r = runShell(lathectl("tune --resume k1 --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    REQUIRE(j.at("trials").size() == 4);
    for (const auto& t : j.at("trials")) CHECK(t.at("state") == "complete");
    // The two finished trials kept their runs; the interrupted one continued its own run from its
    // checkpoint, with the same parameters.
    for (int i = 0; i < 3; ++i) {
        CHECK(j.at("trials")[i].at("run_id").get<int64_t>() == before[i].runId);
        for (const auto& [k, v] : before[i].params) CHECK(j.at("trials")[i].at("params").at(k) == v);
    }
    lathe::core::Store store(db);
    CHECK(store.listRuns().size() == 4);  // nothing ran twice
    bool resumed = false;
    for (const auto& l : store.logs(before[2].runId))
        resumed |= l.text.find("resumed from") != std::string::npos;
    CHECK(resumed);
    CHECK(store.lastMetrics(before[2].runId).at("train/epoch") == 30);
}

TEST_CASE("a trial stopped before its first checkpoint starts again as a new run on resume", "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    // One epoch of 1,437 steps of batch 1 (about 2 s): Ctrl+C lands inside it.
    const auto bg =
        runShell(lathectl("tune --epochs 1 --batch 1 --trials 1 --algo random --study c1 --model mlp "
                          "--data digits --threads 1 --seed 3 --space 'lr=loguniform(1e-3,1e-2)' "
                          "--db " +
                          db) +
                 " > " + dir.file("tune.out") + " 2>&1 & echo $!");
    const int pid = std::stoi(bg.out);
    lathe::core::Studies studies(db);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int64_t firstRun = 0;
    while (firstRun == 0) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (const auto s = studies.study("c1"))
            if (const auto t = studies.trials(s->id); !t.empty()) firstRun = t[0].runId;
    }
    ::kill(pid, SIGINT);
    for (int i = 0; i < 300 && ::kill(pid, 0) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    {
        lathe::core::Store store(db);
        REQUIRE(store.run(firstRun));
        REQUIRE(store.run(firstRun)->status == lathe::core::RunStatus::Stopped);
        REQUIRE(store.artifacts(firstRun).empty());  // stopped inside its first epoch
    }
    const auto r = runShell(lathectl("tune --resume c1 --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    REQUIRE(j.at("trials").size() == 1);
    CHECK(j.at("trials")[0].at("state") == "complete");
    const auto again = j.at("trials")[0].at("run_id").get<int64_t>();
    CHECK(again != firstRun);  // a new run: there was nothing to continue
    lathe::core::Store store(db);
    bool said = false;
    for (const auto& l : store.logs(firstRun))
        said |= l.text.find("stopped before its first checkpoint") != std::string::npos;
    CHECK(said);
}

TEST_CASE("a trial whose process crashes is recorded as failed and the study goes on", "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    const std::string cmd = lathectl(
        "tune --epochs 30 --batch 16 --trials 3 --parallel 1 --algo random --study c1 "
        "--model mlp --data digits --threads 1 --seed 3" +
        kSpace + " --json --db " + db);
    const auto bg =
        runShell(cmd + " > " + dir.file("tune.json") + " 2> " + dir.file("tune.err") + " & echo $!");
    REQUIRE(bg.exitCode == 0);
    // Trial 1, once it trains: SIGSEGV, as a crash in native code would end it.
    lathe::core::Studies studies(db);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (bool killed = false; !killed;) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const auto s = studies.study("c1");
        if (!s) continue;
        const auto trials = studies.trials(s->id);
        REQUIRE(trials.size() <= 2);
        if (trials.size() == 2 && trials[1].runId > 0 && trials[1].pid > 0) {
            lathe::core::Store store(db);
            if (store.metrics(trials[1].runId, "train/epoch").empty()) continue;
            REQUIRE(::kill(static_cast<pid_t>(trials[1].pid), SIGSEGV) == 0);
            killed = true;
        }
    }
    // The study finishes by itself: its summary is the last thing it prints.
    std::string out;
    for (;;) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        out = lathe::test::readFile(dir.file("tune.json"));
        if (!out.empty() && out.back() == '\n' && json::accept(out)) break;
    }
    INFO(lathe::test::readFile(dir.file("tune.err")));
    const auto j = json::parse(out);
    REQUIRE(j.at("trials").size() == 3);
    CHECK(j.at("trials")[0].at("state") == "complete");
    CHECK(j.at("trials")[1].at("state") == "failed");
    CHECK_THAT(j.at("trials")[1].at("error").get<std::string>(),
               Catch::Contains("crashed") && Catch::Contains("SIGSEGV"));
    CHECK(j.at("trials")[2].at("state") == "complete");
    CHECK(j.at("status") == "completed");
}

TEST_CASE("a PPO study's agent changes lr and batch during its runs and learns from each trial",
          "[cli][tune]") {
    TempDir dir;
    const std::string db = dir.file("lathe.db");
    const auto r = runShell(lathectl("tune --epochs 4 --trials 3 --parallel 1 --algo ppo --study p1" + kBase +
                                     " --space 'hidden=choice([16],[64])' --json --db " + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    CHECK(j.at("sampler") == "ppo");
    CHECK(j.at("state").at("updates").get<int>() == 3);  // one update per finished trial
    CHECK(std::filesystem::exists(j.at("state").at("policy").get<std::string>()));
    lathe::core::Store store(db);
    for (const auto& t : j.at("trials")) {
        CHECK(t.at("state") == "complete");
        const auto run = t.at("run_id").get<int64_t>();
        CHECK(store.metrics(run, "ppo/lr").size() == 4);  // the schedule of every epoch
        CHECK(store.metrics(run, "ppo/batch").size() == 4);
        CHECK(store.metrics(run, "ppo/action").size() == 3);  // a decision after each epoch but the last
        CHECK(store.metrics(run, "ppo/reward").size() == 3);
        // The run's config names its own copy of the policy, so it can be run again as it was.
        CHECK(store.params(run).at("ppo_policy").find("trial-") != std::string::npos);
    }
}

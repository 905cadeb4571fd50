// lathectl as a user runs it: exit codes, JSON output, the workspace it writes.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "run_process.h"

using lathe::test::binPath;
using lathe::test::runShell;
using lathe::test::said;
using lathe::test::TempDir;
using nlohmann::json;

namespace {

std::string lathectl(const std::string& args) { return binPath("lathectl") + " " + args; }

}  // namespace

TEST_CASE("lathectl train --json prints one object with the run id, status and final metrics", "[cli]") {
    TempDir dir;
    const auto db = dir.file("ws/lathe.db");
    const auto r = runShell(lathectl("train --db " + db + " --epochs 3 --json"));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);  // stdout holds nothing but the JSON object
    CHECK(j.at("status") == "completed");
    CHECK(j.at("run_id") == 1);
    CHECK(j.at("val/accuracy").get<double>() > 0.8);
    CHECK(j.contains("perf/samples_per_s"));
    CHECK(j.at("workspace") == db);

    const auto list = runShell(lathectl("runs list --json --db " + db));
    REQUIRE(list.exitCode == 0);
    const auto runs = json::parse(list.out);
    REQUIRE(runs.size() == 1);
    CHECK(runs[0].at("status") == "completed");
    CHECK(runs[0].at("val/accuracy") == j.at("val/accuracy"));

    const auto show = runShell(lathectl("runs show 1 --json --db " + db));
    REQUIRE(show.exitCode == 0);
    const auto s = json::parse(show.out);
    CHECK(s.at("params").at("epochs") == "3");
    CHECK(s.at("artifacts").size() >= 1);

    const auto csv = runShell(lathectl("metrics 1 --key val/accuracy --csv --db " + db));
    REQUIRE(csv.exitCode == 0);
    CHECK(csv.out.rfind("key,step,wall_time,value\n", 0) == 0);
    CHECK(std::count(csv.out.begin(), csv.out.end(), '\n') == 4);  // header + 3 epochs

    const auto m = runShell(lathectl("metrics 1 --json --db " + db));
    REQUIRE(m.exitCode == 0);
    CHECK(json::parse(m.out).at("metrics").at("val/loss").size() == 3);
}

TEST_CASE("lathectl prints plain progress lines when not on a terminal", "[cli]") {
    TempDir dir;
    const auto r =
        runShell(lathectl("train --db " + dir.file("l.db") + " --epochs 2 --data synthetic:spirals"));
    REQUIRE(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("epoch 1/2") && Catch::Contains("epoch 2/2") &&
                          Catch::Contains("run 1 completed"));
    CHECK(r.out.find('\r') == std::string::npos);
}

TEST_CASE("a TOML config is read and flags override it", "[cli]") {
    TempDir dir;
    lathe::test::writeFile(dir.file("run.toml"),
                           "epochs = 5\nbatch = 32\ndata = \"synthetic:spirals\"\nname = \"from-file\"\n");
    const auto r =
        runShell(lathectl("train " + dir.file("run.toml") + " --epochs 2 --json --db " + dir.file("l.db")));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("epochs") == 2);
    lathe::core::Store store(dir.file("l.db"));
    const auto params = store.params(1);
    CHECK(params.at("batch") == "32");
    CHECK(params.at("data") == "synthetic:spirals");
    CHECK(store.run(1)->name == "from-file");
}

TEST_CASE("bad flags and configs exit with 2 and one clear line", "[cli]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    auto expectUsage = [&](const std::string& args, const std::string& fragment) {
        const auto r = runShell(lathectl(args + db));
        CHECK(r.exitCode == 2);
        CHECK_THAT(r.err, Catch::Contains(fragment));
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    };
    expectUsage("train --lr -1", "`lr` must be a number > 0");
    expectUsage("train --epochs many", "`epochs`");
    expectUsage("train --optimizer lbfgs", "sgd, adam, adamw");
    expectUsage("train --no-such-flag", "no-such-flag");
    expectUsage("train /nonexistent.toml", "cannot read config");
    lathe::test::writeFile(dir.file("bad.toml"), "epochs = 3\nlr = \"fast\"\n");
    expectUsage("train " + dir.file("bad.toml"), "line 2");
    expectUsage("runs show 99", "no run 99");
    expectUsage("metrics 99", "no run 99");
    expectUsage("train --resume 42", "no run 42");
    // No run was recorded for any of these.
    lathe::core::Store store(dir.file("l.db"));
    CHECK(store.listRuns().empty());
}

TEST_CASE("a run that fails exits with 1 and is recorded as failed", "[cli]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    const auto r = runShell(lathectl("train --data csv:" + dir.file("none.csv") + " --json --db " + db));
    CHECK(r.exitCode == 1);
    const auto j = json::parse(r.out);
    CHECK(j.at("status") == "failed");
    CHECK_THAT(j.at("error").get<std::string>(), Catch::Contains("does not exist"));
    lathe::core::Store store(db);
    CHECK(store.run(j.at("run_id").get<int64_t>())->status == lathe::core::RunStatus::Failed);
}

TEST_CASE("a foreign --db file is refused with exit code 2 and left untouched", "[cli]") {
    TempDir dir;
    const auto path = dir.file("notes.txt");
    lathe::test::writeFile(
        path, "shopping list: eggs, flour, milk, and a very long line to look like a file......");
    const auto r = runShell(lathectl("runs list --db " + path));
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("not a Lathe workspace"));
    CHECK(lathe::test::readFile(path).rfind("shopping list", 0) == 0);
}

TEST_CASE("LATHE_DB selects the workspace when --db is absent", "[cli]") {
    TempDir dir;
    const auto r = runShell("LATHE_DB=" + dir.file("env.db") + " " + lathectl("train --epochs 1 -q --json"));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("workspace") == dir.file("env.db"));
    CHECK(std::filesystem::exists(dir.file("env.db")));
}

TEST_CASE("train --resume continues a stopped run", "[cli]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    REQUIRE(runShell(lathectl("train --epochs 2 -q --db " + db)).exitCode == 0);
    const auto r = runShell(lathectl("train --resume 1 --epochs 4 --json --db " + db));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    CHECK(j.at("run_id") == 1);
    CHECK(j.at("epochs") == 4);
    lathe::core::Store store(db);
    CHECK(store.metrics(1, "val/accuracy").size() == 4);
}

TEST_CASE("Ctrl+C stops the run cleanly and records it as stopped", "[cli]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    // SIGINT arrives while training (a long run); lathectl finishes the step and exits 130. It is
    // sent once the run is recorded as running: sooner, a loaded machine could deliver it before
    // the handler is installed, to a background job whose SIGINT the shell ignores.
    const auto r =
        runShell("(" + lathectl("train --epochs 100000 -q --json --db " + db) +
                 " & pid=$!; for i in $(seq 600); do " + lathectl("runs list --db " + db) +
                 " 2>/dev/null | grep -q running && break; sleep 0.1; done; kill -INT $pid; wait $pid)");
    INFO(said(r));  // train's own stderr: why it ended, if not by the SIGINT
    CHECK(r.exitCode == 130);
    CHECK(json::parse(r.out).at("status") == "stopped");
    lathe::core::Store store(db);
    CHECK(store.run(1)->status == lathe::core::RunStatus::Stopped);
}

TEST_CASE("lathectl worker writes the event stream and ingest records it", "[cli][events]") {
    TempDir dir;
    const auto db = dir.file("l.db");
    const auto r = runShell(lathectl("worker --epochs 2 --data synthetic:spirals --name piped") + " | " +
                            lathectl("ingest - --json --db " + db));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    CHECK(j.at("status") == "completed");
    lathe::core::Store store(db);
    const auto run = store.run(j.at("run_id").get<int64_t>());
    CHECK(run->name == "piped");
    CHECK(run->data == "synthetic:spirals");
    CHECK(store.metrics(run->id, "val/accuracy").size() == 2);

    // A stream cut short (a killed worker) keeps what arrived and fails the run with the reason.
    const auto cut =
        runShell(lathectl("worker --epochs 2") + " | head -n 14 | " + lathectl("ingest --db " + db));
    CHECK(cut.exitCode == 1);
    CHECK_THAT(cut.out, Catch::Contains("ended before the run finished"));
    const auto runs = store.listRuns();
    REQUIRE(runs.size() == 2);
    CHECK(runs.front().status == lathe::core::RunStatus::Failed);
    // run, status, three logs (network, data, the MLP's step), then per step data/wait_ms,
    // data/samples_per_s and train/grad_norm: the three steps that arrived are kept.
    CHECK(store.metrics(runs.front().id, "train/grad_norm").size() == 3);
    CHECK(store.metrics(runs.front().id, "data/wait_ms").size() == 3);

    // A failed run keeps its error message (the final status event carries none).
    const auto head = runShell(lathectl("worker --epochs 1 --data synthetic:spirals") + " | head -n 1");
    REQUIRE(head.exitCode == 0);
    lathe::test::writeFile(dir.file("failed.ndjson"), head.out +
                                                          R"({"v":2,"type":"error","msg":"loss became nan"})"
                                                          "\n"
                                                          R"({"v":2,"type":"status","status":"failed"})"
                                                          "\n");
    const auto failed = runShell(lathectl("ingest " + dir.file("failed.ndjson") + " --json --db " + db));
    CHECK(failed.exitCode == 1);
    const auto failedRun = store.run(json::parse(failed.out).at("run_id").get<int64_t>());
    CHECK(failedRun->status == lathe::core::RunStatus::Failed);
    CHECK(failedRun->error == "loss became nan");
    // Two streams glued together are not merged into one run: the second is refused by line.
    const auto glued = runShell("(" + lathectl("worker --epochs 1 --data synthetic:spirals") + "; " +
                                lathectl("worker --epochs 1 --data synthetic:spirals") + ") | " +
                                lathectl("ingest - --db " + db));
    CHECK(glued.exitCode == 1);
    CHECK_THAT(glued.out + glued.err, Catch::Contains("a second run record"));
    CHECK(store.listRuns().size() == 4);

    // A stream from a newer Lathe, or not a stream at all, is refused with exit code 2.
    lathe::test::writeFile(dir.file("future.ndjson"), R"({"v":3,"type":"run","config":""})"
                                                      "\n");
    const auto future = runShell(lathectl("ingest " + dir.file("future.ndjson") + " --db " + db));
    CHECK(future.exitCode == 2);
    CHECK_THAT(future.err, Catch::Contains("version 3") && Catch::Contains("upgrade"));
    CHECK(store.listRuns().size() == 4);
}

TEST_CASE("lathectl profile prints top ops and phases, writes a Chrome trace, and refuses unprofiled runs",
          "[cli][profile]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    REQUIRE(runShell(lathectl("train --epochs 1 -q --profile --profile-wait 1 --profile-active 3" + db))
                .exitCode == 0);
    const auto top = runShell(lathectl("profile 1 --top 5" + db));
    REQUIRE(top.exitCode == 0);
    CHECK_THAT(top.out, Catch::Contains("3 profiled steps") && Catch::Contains("aten::addmm") &&
                            Catch::Contains("SELF_MS") && Catch::Contains("backward"));
    const auto j = json::parse(runShell(lathectl("profile 1 --json --top 0" + db)).out);
    double share = 0;
    for (const auto& op : j.at("ops")) share += op.at("share").get<double>();
    CHECK(share == Approx(1.0));
    CHECK(j.at("phase_ms_per_step").contains("optimizer"));

    const auto trace = dir.file("trace.json");
    const auto r = runShell(lathectl("profile 1 --chrome-trace " + trace + db));
    REQUIRE(r.exitCode == 0);
    const auto t = json::parse(lathe::test::readFile(trace));
    CHECK(t.at("traceEvents").size() > 100);

    REQUIRE(runShell(lathectl("train --epochs 1 -q" + db)).exitCode == 0);
    const auto none = runShell(lathectl("profile 2" + db));
    CHECK(none.exitCode == 2);
    CHECK_THAT(none.err, Catch::Contains("has no profile") && Catch::Contains("--profile"));
}

TEST_CASE("mixed-precision flags: bf16 runs, fp16 without a GPU exits 2 suggesting bf16", "[cli][amp]") {
    TempDir dir;
    const auto db = " --db " + dir.file("l.db");
    const auto ok =
        runShell(lathectl("train --epochs 1 --precision bf16 --loss-scale dynamic --inject-nonfinite 3 "
                          "--activation-checkpointing --json" +
                          db));
    REQUIRE(ok.exitCode == 0);
    const auto j = json::parse(ok.out);
    CHECK(j.contains("amp/loss_scale"));
    CHECK(j.contains("train/grad_norm"));
    if (lathe::core::cudaDeviceCount() == 0) {  // with a GPU fp16 runs (test_gpu.cpp)
        const auto fp16 = runShell(lathectl("train --precision fp16" + db));
        CHECK(fp16.exitCode == 2);
        CHECK_THAT(fp16.err, Catch::Contains("bf16"));
    }
    const auto bad = runShell(lathectl("train --loss-scale static:-4" + db));
    CHECK(bad.exitCode == 2);
    CHECK_THAT(bad.err, Catch::Contains("`loss_scale`"));
    // A scale whose reciprocal is not a finite float would skip every step.
    const auto tiny = runShell(lathectl("train --loss-scale static:1e-40" + db));
    CHECK(tiny.exitCode == 2);
    CHECK_THAT(tiny.err, Catch::Contains("1e-30"));
    // Without a loss scaler nothing would skip the spoiled step: refused before training.
    const auto unscaled = runShell(lathectl("train --inject-nonfinite 3" + db));
    CHECK(unscaled.exitCode == 2);
    CHECK_THAT(unscaled.err, Catch::Contains("`inject_nonfinite` needs loss scaling"));
}

// ---- command-line manners: help, "did you mean", completion ---------------------------------

namespace {

std::string completions(const std::string& words) {
    const auto r = runShell(lathectl("__complete " + words));
    CHECK(r.exitCode == 0);
    CHECK(r.err.empty());
    return r.out;
}

}  // namespace

TEST_CASE("lathectl alone prints its help and exits 0", "[cli][manners]") {
    const auto r = runShell(binPath("lathectl"));
    CHECK(r.exitCode == 0);
    CHECK(r.err.empty());
    CHECK_THAT(r.out, Catch::Contains("Usage:") && Catch::Contains("train") && Catch::Contains("models"));
    CHECK_THAT(r.out, !Catch::Contains("__complete"));  // the completion helper is hidden
}

TEST_CASE("an unknown command or flag names the nearest ones and exits 2", "[cli][manners]") {
    auto usage = [](const std::string& args) {
        const auto r = runShell(lathectl(args));
        CHECK(r.exitCode == 2);
        CHECK(r.out.empty());
        return r.err;
    };
    const auto command = usage("trian");
    CHECK_THAT(command, Catch::StartsWith("lathectl: error: unknown command 'trian'") &&
                            Catch::Contains("\nThe most similar command is\n    train\n"));
    CHECK_THAT(usage("train --epohcs 3"), Catch::Contains("unknown option '--epohcs' for 'lathectl train'") &&
                                              Catch::Contains("The most similar option is\n    --epochs\n"));
    CHECK_THAT(usage("train --epohcs=3"), Catch::Contains("    --epochs\n"));
    // Nested commands and their flags.
    CHECK_THAT(usage("runs lst"), Catch::Contains("unknown command 'lst' for 'lathectl runs'") &&
                                      Catch::Contains("The most similar command is\n    list\n"));
    CHECK_THAT(usage("models register x --rn 3"), Catch::Contains("The most similar option is\n    --run\n"));
    // Equally near ones are all named.
    CHECK_THAT(usage("deplo"),
               Catch::Contains("The most similar commands are\n    deploy\n    deployments\n"));
    // Nothing near: the one line.
    const auto far = usage("xyzzy");
    CHECK_THAT(far, Catch::Contains("unknown command 'xyzzy'"));
    CHECK(std::count(far.begin(), far.end(), '\n') == 1);
}

TEST_CASE("lathectl __complete prints commands, flags, run ids and model names", "[cli][completion]") {
    TempDir dir;
    const auto db = dir.file("l.db");

    const auto commands = completions("''");
    CHECK_THAT(commands, Catch::StartsWith("train\n") && Catch::Contains("\nruns\n") &&
                             Catch::Contains("\nmodels\n") && Catch::Contains("\ndeploy\n"));
    CHECK_THAT(commands, !Catch::Contains("__complete") && !Catch::Contains("--"));
    CHECK(completions("tr") == "train\n");
    CHECK(completions("runs ''") == "list\nshow\n");
    const auto flags = completions("train --ep");
    CHECK_THAT(flags, Catch::Contains("--epochs\n"));
    CHECK_THAT(flags, !Catch::Contains("--db") && !Catch::Contains("train"));
    CHECK_THAT(completions("runs show -"),
               Catch::Contains("--db\n") && Catch::Contains("--json\n") && Catch::Contains("-h\n"));
    CHECK(completions("train --optimizer ''") == "sgd\nadam\nadamw\n");

    // Run ids and model names come from the workspace given with --db.
    REQUIRE(runShell(lathectl("train --epochs 1 -q --db " + db)).exitCode == 0);
    CHECK(completions("runs show --db " + db + " ''") == "1\n");
    CHECK(completions("metrics --db " + db + " 1") == "1\n");
    CHECK(completions("profile --db=" + db + " ''") == "1\n");
    CHECK(completions("train --db " + db + " --resume ''") == "1\n");
    CHECK(completions("models register digits --db " + db + " --run ''") == "1\n");
    CHECK(runShell("LATHE_DB=" + db + " " + lathectl("__complete runs show ''")).out == "1\n");
    REQUIRE(runShell(lathectl("models register digits --run 1 --db " + db)).exitCode == 0);
    CHECK(completions("deploy --db " + db + " ''") == "digits\n");
    CHECK(completions("models show --db " + db + " d") == "digits\n");
    CHECK(completions("serve --db " + db + " --model ''") == "digits\n");
    CHECK(completions("deploy --db " + db + " x").empty());

    // A workspace that does not exist is not created by completing, and a foreign file is left
    // alone: nothing is printed, not even an error.
    const auto missing = dir.file("none/l.db");
    CHECK(completions("runs show --db " + missing + " ''").empty());
    CHECK(completions("deploy --db " + missing + " ''").empty());
    CHECK_FALSE(std::filesystem::exists(dir.file("none")));
    lathe::test::writeFile(
        dir.file("notes.txt"),
        "shopping list: eggs, flour, milk, and a very long line to look like a file......");
    CHECK(completions("runs show --db " + dir.file("notes.txt") + " ''").empty());
    CHECK(lathe::test::readFile(dir.file("notes.txt")).rfind("shopping list", 0) == 0);
}

TEST_CASE("the bash completion script completes through lathectl", "[cli][completion]") {
    const std::string bin = LATHE_BIN_DIR;
    const std::string script = bin + "/../share/bash-completion/completions/lathectl";
    REQUIRE(std::filesystem::exists(script));
    auto complete = [&](const std::string& words, int cword) {
        return runShell("PATH=" + bin + ":$PATH bash --norc --noprofile -c 'source " + script +
                        "; COMP_WORDS=(" + words + "); COMP_CWORD=" + std::to_string(cword) +
                        "; _lathectl; echo \"${COMPREPLY[@]}\"'");
    };
    const auto r = complete("lathectl tr", 1);
    CHECK(r.exitCode == 0);
    CHECK(r.out == "train\n");
    CHECK(complete("lathectl runs \"\"", 2).out == "list show\n");
    CHECK(complete("lathectl train --epo", 2).out == "--epochs\n");
    CHECK(runShell("bash --norc --noprofile -c 'source " + script + "; complete -p lathectl'").out ==
          "complete -o bashdefault -o default -F _lathectl lathectl\n");
}

TEST_CASE("lathectl data versions a folder, trains on it and shows the lineage to a deployment-ready model",
          "[cli][data-versions]") {
    TempDir dir;
    const auto db = " --db " + dir.file("ws/lathe.db");
    // A learnable CSV: the label says whether a + b > 0.
    const auto write = [&](int rows, int seed) {
        std::string text = "a,b,label\n";
        for (int i = 0; i < rows; ++i) {
            const double a = ((i * 37 + seed) % 100) / 50.0 - 1.0,
                         b = ((i * 61 + 3 * seed) % 100) / 50.0 - 1.0;
            text += std::to_string(a) + "," + std::to_string(b) + "," + (a + b > 0 ? "yes" : "no") + "\n";
        }
        lathe::test::writeFile(dir.file("src/points.csv"), text);
    };
    std::filesystem::create_directories(dir.file("src"));
    write(150, 1);
    auto r = runShell(lathectl("data add points " + dir.file("src/points.csv") + " --json" + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto v1 = json::parse(r.out);
    CHECK(v1.at("version") == 1);
    CHECK(v1.at("kind") == "csv");
    CHECK(v1.at("root_hash").get<std::string>().size() == 64);
    CHECK(v1.at("created") == true);

    r = runShell(lathectl("train --data dataset:points --epochs 2 --hidden 8 --json" + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("status") == "completed");
    r = runShell(lathectl("runs show 1 --json" + db));
    CHECK(json::parse(r.out).at("params").at("data") == "dataset:points:1");
    REQUIRE(runShell(lathectl("models register pts --run 1" + db)).exitCode == 0);
    r = runShell(lathectl("lineage pts --json" + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    auto lineage = json::parse(r.out);
    CHECK(lineage.at("run") == 1);
    CHECK(lineage.at("data_version").at("root_hash") == v1.at("root_hash"));
    r = runShell(lathectl("lineage --data points:1 --json" + db));
    REQUIRE(r.exitCode == 0);
    lineage = json::parse(r.out);
    REQUIRE(lineage.at("models").size() == 1);
    CHECK(lineage.at("models")[0].at("model") == "pts");

    // The file changes: training on "the data set" is refused with the file named, exit 2; the
    // pinned version still trains (from the store); a new version is taken; diff and rollback.
    write(160, 2);
    r = runShell(lathectl("train --data dataset:points --epochs 1 --hidden 8" + db));
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("changed points.csv") && Catch::Contains("lathectl data add points"));
    CHECK(runShell(lathectl("train --data dataset:points:1 --epochs 1 --hidden 8 -q" + db)).exitCode == 0);
    r = runShell(lathectl("data add points " + dir.file("src/points.csv") + " -m more --json" + db));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("version") == 2);
    r = runShell(lathectl("data diff points:1 points:2 --json" + db));
    CHECK(json::parse(r.out).at("changed") == json::array({"points.csv"}));
    r = runShell(lathectl("data rollback points" + db));
    CHECK(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("v1 is current again"));
    r = runShell(lathectl("data list --json" + db));
    CHECK(json::parse(r.out)[0].at("version") == 1);
    r = runShell(lathectl("data checkout points:1 " + dir.file("co") + db));
    REQUIRE(r.exitCode == 0);
    r = runShell(lathectl("data add again " + dir.file("co/points.csv") + " --json" + db));
    CHECK(json::parse(r.out).at("root_hash") == v1.at("root_hash"));  // round trip: the same id
    r = runShell(lathectl("data verify points:2" + db));
    CHECK(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("all 1 stored files check out"));

    // Bad input: exit 2, one clear line.
    r = runShell(lathectl("data show nosuch" + db));
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("no data set 'nosuch'") && Catch::Contains("points"));
    r = runShell(lathectl("data add x " + dir.file("nowhere") + db));
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("no such file"));
    r = runShell(lathectl("train --data dataset:points:0" + db));
    CHECK(r.exitCode == 2);
    CHECK_THAT(r.err, Catch::Contains("number >= 1"));
}

TEST_CASE("an image data set: versioned, trained on through the loader and its caches, on 1 and 2 ranks",
          "[cli][data-pipeline]") {
    TempDir dir;
    const auto db = " --db " + dir.file("ws/lathe.db");
    auto r = runShell(lathectl("data example " + dir.file("img") + " --per-class 12 --side 40"));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    CHECK_THAT(r.out, Catch::Contains("120 images of 40x40"));
    r = runShell(lathectl("data add digits-img " + dir.file("img") + " --json" + db));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("kind") == "images");

    const std::string steps =
        " --model cnn --resize 40 --crop 32 --random-crop true --hflip true --batch 16 --json";
    r = runShell(lathectl("train --data dataset:digits-img --epochs 2 --cache-disk-gb 0.1" + steps + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    auto j = json::parse(r.out);
    CHECK(j.at("status") == "completed");
    CHECK(j.at("data/hit_memory").get<double>() == 1.0);  // the second epoch: every sample cached
    CHECK(j.contains("data/wait_ms"));
    CHECK(j.at("data/samples_per_s").get<double>() > 0);
    std::size_t entries = 0;
    for (const auto& e :
         std::filesystem::recursive_directory_iterator(dir.file("ws/lathe.db-files/cache/data/samples")))
        entries += e.is_regular_file() ? 1 : 0;
    CHECK(entries == 120);  // every image (training and validation), decoded and resized
    // Another run (another process) starts warm from the workspace's disk cache.
    r = runShell(lathectl("train --data dataset:digits-img --epochs 1 --cache-disk-gb 0.1" + steps + db));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("data/hit_disk").get<double>() == 1.0);
    // Two ranks, each its shard, through their own loaders.
    r = runShell(lathectl("train --data dataset:digits-img --epochs 1 --nproc 2" + steps + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("status") == "completed");
    r = runShell(lathectl("runs show 3 --json" + db));
    CHECK(json::parse(r.out).at("params").at("data") == "dataset:digits-img:1");

    // An unreadable image: the run fails naming it, or (bad_samples = skip) skips and counts it.
    std::filesystem::copy(dir.file("img"), dir.file("bad"), std::filesystem::copy_options::recursive);
    lathe::test::writeFile(dir.file("bad/4/zz-broken.jpg"), std::string("\xff\xd8\xff\xe0 truncated", 14));
    r = runShell(
        lathectl("train --data images:" + dir.file("bad") + " --epochs 1 --val-split 0.01" + steps + db));
    CHECK(r.exitCode != 0);
    CHECK_THAT(r.out + r.err, Catch::Contains("zz-broken.jpg"));
    r = runShell(lathectl("train --data images:" + dir.file("bad") +
                          " --epochs 1 --val-split 0.01 --bad-samples skip" + steps + db));
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    CHECK(json::parse(r.out).at("data/skipped").get<double>() == 1.0);
}

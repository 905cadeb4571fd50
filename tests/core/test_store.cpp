#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <vector>

#include "lathe/core/error.h"
#include "lathe/core/store.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::readFile;
using lathe::test::TempDir;
using lathe::test::writeFile;

namespace {

int64_t newRun(Store& s, const std::string& name = "r") {
    return s.createRun("exp", name, "mlp", "digits", "epochs = 1\n", {{"lr", "0.001"}}, "localhost");
}

void sqlExec(const std::string& path, const char* sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
}

}  // namespace

TEST_CASE("a new workspace gets the current schema and keeps what is written", "[store]") {
    TempDir dir;
    const auto path = dir.file("sub/dir/lathe.db");  // parent folders are created
    int64_t id = 0;
    {
        Store s(path);
        CHECK(s.schemaVersion() == Store::kSchemaVersion);
        id = newRun(s, "it's \"quoted\"; DROP TABLE runs; --");
        s.setRunStatus(id, lathe::core::RunStatus::Running);
        for (int i = 0; i < 1000; ++i) s.appendMetric(id, "train/loss", i, 1.0 * i, 1.0 / (i + 1));
        s.appendMetric(id, "val/accuracy", 999, 1.0, 0.97);
        s.appendLog(id, 1.0, "info", "hello");
        s.addArtifact(id, "checkpoint", "/x/last.ckpt", std::string(64, 'f'));
        s.setRunStatus(id, lathe::core::RunStatus::Completed);
        s.flush();
    }
    Store s(path);  // reopen: everything is still there
    const auto run = s.run(id);
    REQUIRE(run);
    CHECK(run->name == "it's \"quoted\"; DROP TABLE runs; --");  // bound parameters, stored literally
    CHECK(run->experiment == "exp");
    CHECK(run->status == lathe::core::RunStatus::Completed);
    CHECK(run->startedAt > 0);
    CHECK(run->endedAt >= run->startedAt);
    CHECK(s.params(id).at("lr") == "0.001");
    const auto pts = s.metrics(id, "train/loss");
    REQUIRE(pts.size() == 1000);
    CHECK(pts[10].step == 10);
    CHECK(pts[10].value == Approx(1.0 / 11));
    CHECK(s.metrics(id, "train/loss", 989).size() == 10);
    CHECK(s.metricKeys(id) == std::vector<std::string>{"train/loss", "val/accuracy"});
    CHECK(s.lastMetrics(id).at("val/accuracy") == Approx(0.97));
    CHECK(s.logs(id).at(0).text == "hello");
    CHECK(s.artifacts(id).at(0).path == "/x/last.ckpt");
    CHECK(s.listRuns().size() == 1);
    CHECK_FALSE(s.run(id + 1));
}

TEST_CASE("an empty run name is generated and failures keep their error", "[store]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    const auto id = newRun(s, "");
    s.setRunStatus(id, lathe::core::RunStatus::Running);
    s.setRunStatus(id, lathe::core::RunStatus::Failed, "data file missing");
    s.flush();
    CHECK(s.run(id)->name == "run-" + std::to_string(id));
    CHECK(s.run(id)->error == "data file missing");
}

TEST_CASE("dropMetricsAfter removes only later points of that run", "[store]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    const auto a = newRun(s), b = newRun(s);
    for (int i = 1; i <= 10; ++i) {
        s.appendMetric(a, "k", i, 0, i);
        s.appendMetric(b, "k", i, 0, i);
    }
    s.dropMetricsAfter(a, 4);
    s.flush();
    CHECK(s.metrics(a, "k").size() == 4);
    CHECK(s.metrics(b, "k").size() == 10);
}

TEST_CASE("a write for a missing run is reported by flush and loses nothing else", "[store]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    const auto id = newRun(s);
    s.appendMetric(id, "k", 1, 0, 1);
    s.setRunStatus(id + 100, lathe::core::RunStatus::Completed);
    s.appendMetric(id, "k", 2, 0, 2);
    CHECK_THROWS_AS(s.flush(), StoreError);
    CHECK(s.metrics(id, "k").size() == 2);
    s.flush();  // the error was reported once
}

TEST_CASE("files that are not Lathe workspaces are refused and left untouched", "[store]") {
    TempDir dir;
    SECTION("a text file") {
        const auto path = dir.file("notes.db");
        writeFile(path,
                  "just some notes, not a database at all.................................................");
        const auto before = readFile(path);
        CHECK_THROWS_WITH(Store(path), Catch::Contains("not a Lathe workspace"));
        CHECK(readFile(path) == before);
    }
    SECTION("another program's SQLite database") {
        const auto path = dir.file("other.db");
        sqlExec(path, "CREATE TABLE customers(id INTEGER, name TEXT); INSERT INTO customers VALUES(1, 'a');");
        const auto before = readFile(path);
        CHECK_THROWS_WITH(Store(path), Catch::Contains("another program"));
        CHECK(readFile(path) == before);
        CHECK_FALSE(std::filesystem::exists(path + "-wal"));
    }
    SECTION("a workspace from a newer Lathe") {
        const auto path = dir.file("future.db");
        { Store s(path); }
        sqlExec(path, "PRAGMA user_version = 99");
        const auto before = readFile(path);
        CHECK_THROWS_WITH(Store(path),
                          Catch::Contains("schema version 99") && Catch::Contains("upgrade Lathe"));
        CHECK(readFile(path) == before);
    }
    SECTION("a directory") { CHECK_THROWS_WITH(Store(dir.path()), Catch::Contains("is a directory")); }
}

TEST_CASE("an empty SQLite file is migrated to the current schema", "[store]") {
    TempDir dir;
    const auto path = dir.file("empty.db");
    sqlExec(path, "PRAGMA user_version = 0");
    Store s(path);
    CHECK(s.schemaVersion() == Store::kSchemaVersion);
    CHECK(newRun(s) == 1);
}

TEST_CASE("readers see committed data while the writer keeps writing", "[store]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    const auto id = newRun(s);
    std::atomic<bool> done{false};
    std::vector<size_t> seen;
    std::thread reader([&] {
        while (!done.load()) {
            seen.push_back(s.metrics(id, "k").size());
            s.listRuns();
        }
    });
    for (int i = 0; i < 200000; ++i) s.appendMetric(id, "k", i, 0, i);
    s.flush();
    done = true;
    reader.join();
    REQUIRE(seen.size() >= 2);  // the reader was never blocked out for the whole write
    CHECK(std::is_sorted(seen.begin(), seen.end()));
    // Another connection (another process, e.g. the GUI) reads the same data.
    Store other(s.path());
    CHECK(other.metrics(id, "k").size() == 200000);
}

TEST_CASE("the workspace path follows --db, LATHE_DB, then XDG", "[store]") {
    CHECK(Store::resolvePath("/x/y.db") == "/x/y.db");
    setenv("LATHE_DB", "/env/l.db", 1);
    CHECK(Store::resolvePath() == "/env/l.db");
    unsetenv("LATHE_DB");
    setenv("XDG_DATA_HOME", "/xdg", 1);
    CHECK(Store::resolvePath() == "/xdg/lathe/lathe.db");
    unsetenv("XDG_DATA_HOME");
    const std::string home = getenv("HOME") ? getenv("HOME") : "";
    setenv("HOME", "/home/u", 1);
    CHECK(Store::resolvePath() == "/home/u/.local/share/lathe/lathe.db");
    setenv("HOME", home.c_str(), 1);
}

TEST_CASE("points for a missing run are reported without losing other runs' points", "[store]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    const auto id = newRun(s);
    for (int i = 0; i < 10; ++i) {
        s.appendMetric(id, "k", i, 0, i);
        s.appendMetric(id + 7, "k", i, 0, i);  // no such run
    }
    CHECK_THROWS_WITH(s.flush(), Catch::Contains("FOREIGN KEY"));
    CHECK(s.metrics(id, "k").size() == 10);
}

TEST_CASE("a schema-1 workspace is migrated forward and keeps its runs", "[store]") {
    TempDir dir;
    const auto path = dir.file("old.db");
    int64_t id = 0;
    {
        Store s(path);
        id = newRun(s, "from-v1");
        s.appendMetric(id, "k", 1, 0, 1);
        s.flush();
    }
    // Turn it back into what Lathe 0.1 with schema 1 wrote.
    sqlExec(
        path,
        "DROP TABLE profile_spans; DROP TABLE models; DROP TABLE model_versions; DROP TABLE model_aliases; "
        "DROP TABLE deployments; DROP TABLE serving_metrics; DROP TABLE alerts; DROP TABLE workspace; "
        "DROP TABLE hosts; DROP TABLE deployment_tokens; DROP TABLE rollout_decisions; DROP TABLE rollouts; "
        "DROP TABLE dataset_history; DROP TABLE dataset_files; DROP TABLE dataset_versions; DROP TABLE "
        "datasets; DROP TABLE metric_packs; DROP TABLE trial_rungs; DROP TABLE trials; DROP TABLE studies; "
        "ALTER TABLE runs DROP "
        "COLUMN data_version_id; PRAGMA user_version = 1;");
    Store s(path);
    CHECK(s.schemaVersion() == Store::kSchemaVersion);
    CHECK(s.run(id)->name == "from-v1");
    CHECK(s.metrics(id, "k").size() == 1);
    ProfileSpan span;
    span.name = "aten::mm";
    span.step = 1;
    s.appendSpan(id, span);
    s.flush();
    CHECK(s.profileSpanCount(id) == 1);
}

TEST_CASE("a running run whose recorder is gone reads as interrupted", "[store]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    const auto id = newRun(s);
    s.setRunStatus(id, lathe::core::RunStatus::Running);
    s.flush();
    // Nobody holds the run's lock (its process was killed): interrupted, in run() and listRuns().
    CHECK(s.run(id)->status == lathe::core::RunStatus::Interrupted);
    CHECK(s.listRuns().front().status == lathe::core::RunStatus::Interrupted);
    // A live recorder holds an exclusive flock on runLockPath (training/record.cpp).
    std::filesystem::create_directories(std::filesystem::path(s.runLockPath(id)).parent_path());
    const int fd = ::open(s.runLockPath(id).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    CHECK(s.run(id)->status == lathe::core::RunStatus::Running);
    CHECK(s.listRuns().front().status == lathe::core::RunStatus::Running);
    ::close(fd);
    CHECK(s.run(id)->status == lathe::core::RunStatus::Interrupted);
    // Only "running" is ever reinterpreted.
    s.setRunStatus(id, lathe::core::RunStatus::Completed);
    s.flush();
    CHECK(s.run(id)->status == lathe::core::RunStatus::Completed);
}

TEST_CASE("a full disk fails the writes loudly after retries and loses nothing committed", "[store]") {
    TempDir dir;
    const auto path = dir.file("lathe.db");
    Store s(path);
    const auto id = newRun(s);
    s.appendMetric(id, "k", 0, 0, 0);
    s.flush();
    int64_t pages = 0;
    {
        sqlite3* db = nullptr;
        REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
        sqlite3_stmt* st = nullptr;
        REQUIRE(sqlite3_prepare_v2(db, "PRAGMA page_count", -1, &st, nullptr) == SQLITE_OK);
        REQUIRE(sqlite3_step(st) == SQLITE_ROW);
        pages = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        sqlite3_close(db);
    }
    REQUIRE(pages > 0);
    s.setMaxPages(pages);  // the disk is "full": nothing may grow the file
    // A record that needs many new pages, and points after it.
    s.appendLog(id, 0, "info", std::string(1 << 20, 'x'));
    for (int i = 1; i <= 1000; ++i) s.appendMetric(id, "k", i, 0, i);
    // The writer retries the batch, then gives it up and says so before anyone flushes.
    for (int i = 0; i < 200 && !s.writeFailed(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(s.writeFailed());
    CHECK_THROWS_WITH(s.flush(), Catch::Contains("could not be written after 5 attempts") &&
                                     Catch::Contains("full") && Catch::Contains(path));
    // Records queued behind the failed batch may make batches of their own (how many depends on
    // when the writer wakes: under load, one each), which fail too while the disk is full; a flush
    // reports each failure once and clears it.
    for (int i = 0; i < 20; ++i) {
        try {
            s.flush();
            break;
        } catch (const std::exception& ex) {
            CHECK_THAT(ex.what(), Catch::Contains("full"));
        }
    }
    CHECK_FALSE(s.writeFailed());
    // What was committed stays, and the batch that failed left nothing of itself behind (it was
    // not continued record by record once SQLite had rolled it back).
    CHECK(s.logs(id).empty());
    const auto kept = s.metrics(id, "k").size();
    CHECK(kept >= 1);
    // Space again: the same store writes on.
    s.setMaxPages(1 << 30);
    s.appendMetric(id, "k", 5000, 0, 1);
    s.flush();
    CHECK(s.metrics(id, "k").size() == kept + 1);
}

// ---- hosts ---------------------------------------------------------------------------------

TEST_CASE("hosts are added, read, listed by name, updated and removed", "[store][hosts]") {
    TempDir dir;
    const auto path = dir.file("lathe.db");
    {
        Store s(path);
        CHECK(s.hosts().empty());
        CHECK_FALSE(s.host("gpu-1"));
        s.addHost({"gpu-2", "10.0.0.2", 2222, "alice", "~/.ssh/id_ed25519", "/opt/lathe/bin/lathectl", 4});
        s.addHost({"gpu-1", "gpu1.example.org"});
        // Bound parameters: stored literally.
        s.addHost({"a.b_c", "h", 0, "", "/keys/it's; DROP TABLE hosts; --"});
    }
    Store s(path);  // reopen: committed when addHost returned
    const auto all = s.hosts();
    REQUIRE(all.size() == 3);
    CHECK(all[0].name == "a.b_c");
    CHECK(all[1].name == "gpu-1");
    CHECK(all[2].name == "gpu-2");
    CHECK(all[0].identity == "/keys/it's; DROP TABLE hosts; --");

    const auto g2 = s.host("gpu-2");
    REQUIRE(g2);
    CHECK(g2->address == "10.0.0.2");
    CHECK(g2->port == 2222);
    CHECK(g2->user == "alice");
    CHECK(g2->identity == "~/.ssh/id_ed25519");
    CHECK(g2->lathectl == "/opt/lathe/bin/lathectl");
    CHECK(g2->slots == 4);
    CHECK(g2->addedAt > 0);
    const auto g1 = s.host("gpu-1");
    REQUIRE(g1);
    CHECK(g1->port == 0);  // not set
    CHECK(g1->user.empty());
    CHECK(g1->slots == 1);

    HostRecord changed = *g2;
    changed.port = 0;
    changed.user.clear();
    changed.slots = 8;
    changed.addedAt = 1;  // not updated
    s.updateHost(changed);
    const auto after = s.host("gpu-2");
    REQUIRE(after);
    CHECK(after->port == 0);
    CHECK(after->user.empty());
    CHECK(after->slots == 8);
    CHECK(after->addedAt == g2->addedAt);

    CHECK(s.removeHost("gpu-2"));
    CHECK_FALSE(s.removeHost("gpu-2"));
    CHECK_FALSE(s.host("gpu-2"));
    CHECK(s.hosts().size() == 2);
    CHECK_THROWS_AS(s.updateHost(changed), StoreError);  // gone
    // Hosts writes share the writer with runs: both keep going.
    const auto id = newRun(s);
    s.appendMetric(id, "k", 1, 0, 1);
    s.addHost({"gpu-3", "10.0.0.3"});
    s.flush();
    CHECK(s.metrics(id, "k").size() == 1);
    CHECK(s.host("gpu-3"));
}

TEST_CASE("a second host of one name is refused and the first one kept", "[store][hosts]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    s.addHost({"gpu-1", "10.0.0.1", 22});
    CHECK_THROWS_AS(s.addHost({"gpu-1", "10.0.0.9"}), StoreError);
    CHECK_THROWS_WITH(s.addHost({"gpu-1", "10.0.0.9"}),
                      "host 'gpu-1' already exists; remove it first or choose another name");
    CHECK(s.host("gpu-1")->address == "10.0.0.1");
    CHECK(s.hosts().size() == 1);
    s.flush();  // the refusal went to its caller, not to the next flush
}

TEST_CASE("bad host names and fields are refused before anything is written", "[store][hosts]") {
    TempDir dir;
    Store s(dir.file("lathe.db"));
    for (const std::string& name : std::vector<std::string>{"", "-gpu", "gpu 1", "gpu/1", "alice@gpu",
                                                            "gpu:22", "gpü", std::string(65, 'a'), "a\nb"}) {
        CAPTURE(name);
        CHECK_THROWS_AS(s.addHost({name, "10.0.0.1"}), ConfigError);
        CHECK_THROWS_AS(Store::validateHostName(name), ConfigError);
    }
    CHECK_THROWS_WITH(s.addHost({"-x", "h"}),
                      Catch::Contains("host name '-x'") && Catch::Contains("not starting with '-'"));
    CHECK_NOTHROW(Store::validateHostName(std::string(64, 'a')));
    CHECK_NOTHROW(Store::validateHostName("GPU_2.lab-1"));

    CHECK_THROWS_WITH(s.addHost({"h", ""}), Catch::Contains("address is empty"));
    CHECK_THROWS_AS(s.addHost({"h", "-oProxyCommand=x"}), ConfigError);
    CHECK_THROWS_AS(s.addHost({"h", "two words"}), ConfigError);
    CHECK_THROWS_AS(s.addHost({"h", "10.0.0.1", 65536}), ConfigError);
    CHECK_THROWS_AS(s.addHost({"h", "10.0.0.1", -1}), ConfigError);
    CHECK_THROWS_AS(s.addHost({"h", "10.0.0.1", 0, "-l"}), ConfigError);
    CHECK_THROWS_AS(s.addHost({"h", "10.0.0.1", 0, "", "", "/bin/lathectl\necho"}), ConfigError);
    CHECK_THROWS_WITH(s.addHost({"h", "10.0.0.1", 0, "", "", "", 0}), Catch::Contains("slots"));
    CHECK_THROWS_AS(s.addHost({"h", "10.0.0.1", 0, "", "", "", 4097}), ConfigError);
    CHECK(s.hosts().empty());
    CHECK_NOTHROW(s.addHost({"h", "10.0.0.1", 65535, "", "", "", 4096}));
}

TEST_CASE("a schema-5 workspace is migrated forward and gets an empty hosts table", "[store][hosts]") {
    TempDir dir;
    const auto path = dir.file("v5.db");
    int64_t id = 0;
    std::string workspaceId;
    {
        Store s(path);
        id = newRun(s, "from-v5");
        workspaceId = s.workspaceId();
        s.addHost({"gone", "10.0.0.1"});
    }
    // What Lathe wrote with schema 5: everything but the hosts table (and later ones).
    sqlExec(path,
            "DROP TABLE hosts; DROP TABLE deployment_tokens; "
            "ALTER TABLE model_versions DROP COLUMN parent_model; ALTER TABLE model_versions DROP COLUMN "
            "derivation; ALTER TABLE model_versions DROP COLUMN report; DROP TABLE rollout_decisions; "
            "DROP TABLE rollouts; DROP TABLE dataset_history; DROP TABLE dataset_files; DROP TABLE "
            "dataset_versions; DROP TABLE datasets; DROP TABLE metric_packs; DROP TABLE trial_rungs; DROP "
            "TABLE trials; DROP TABLE "
            "studies; ALTER TABLE runs DROP COLUMN data_version_id; PRAGMA "
            "user_version = 5;");
    Store s(path);
    CHECK(s.schemaVersion() == Store::kSchemaVersion);
    CHECK(s.run(id)->name == "from-v5");
    CHECK(s.workspaceId() == workspaceId);  // a migration keeps the id
    CHECK(s.hosts().empty());
    s.addHost({"gpu-1", "10.0.0.1"});
    CHECK(s.hosts().size() == 1);
}

TEST_CASE("a schema-6 workspace is migrated to 7, keeps its deployments and gets an empty token table",
          "[store][deploy]") {
    TempDir dir;
    const auto path = dir.file("v6.db");
    int64_t id = 0;
    {
        Store s(path);
        id = newRun(s, "from-v6");
        s.addHost({"gpu-1", "10.0.0.1"});
    }
    // What Lathe wrote with schema 6: a deployment recorded before tokens existed.
    sqlExec(path,
            "DROP TABLE deployment_tokens; ALTER TABLE model_versions DROP COLUMN parent_model; ALTER TABLE "
            "model_versions DROP COLUMN derivation; ALTER TABLE model_versions DROP COLUMN report; "
            "INSERT INTO deployments(model, version, target, url, pid, actor, "
            "action, started_at, instance) VALUES('digits', 1, 'local', 'http://127.0.0.1:8500', 42, 'user', "
            "'deploy', 1.0, 'nonce'); DROP TABLE rollout_decisions; DROP TABLE rollouts; "
            "DROP TABLE dataset_history; DROP TABLE dataset_files; DROP TABLE dataset_versions; DROP TABLE "
            "datasets; DROP TABLE metric_packs; DROP TABLE trial_rungs; DROP TABLE trials; DROP TABLE "
            "studies; ALTER TABLE runs DROP "
            "COLUMN data_version_id; PRAGMA user_version = 6;");
    {
        Store s(path);
        CHECK(s.schemaVersion() == Store::kSchemaVersion);
        CHECK(s.run(id)->name == "from-v6");
        CHECK(s.hosts().size() == 1);
    }
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    auto count = [&](const char* sql) {
        sqlite3_stmt* st = nullptr;
        REQUIRE(sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK);
        REQUIRE(sqlite3_step(st) == SQLITE_ROW);
        const auto n = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return n;
    };
    CHECK(count("SELECT COUNT(*) FROM deployments WHERE instance = 'nonce' AND ended_at IS NULL") == 1);
    CHECK(count("SELECT COUNT(*) FROM deployment_tokens") == 0);  // the old server takes control without one
    sqlite3_close(db);
}

namespace {

// Store::metrics is the reference: readSeries must hand out exactly its points, as floats.
void checkAgainstMetrics(const Store& store, const std::vector<Store::Series>& got,
                         const std::vector<int64_t>& runs, const std::string& onlyKey = {}) {
    size_t i = 0;
    for (int64_t run : runs)
        for (const auto& key : store.metricKeys(run)) {
            if (!onlyKey.empty() && key != onlyKey) continue;
            INFO("run " << run << " key " << key);
            REQUIRE(i < got.size());
            const auto& s = got[i++];
            CHECK(s.runId == run);
            CHECK(s.key == key);
            const auto ref = store.metrics(run, key);
            REQUIRE(s.steps.size() == ref.size());
            REQUIRE(s.values.size() == ref.size());
            size_t wrong = 0;  // counted, not CHECKed point by point: millions of points
            for (size_t k = 0; k < ref.size(); ++k) {
                const bool valueOk =
                    std::isnan(ref[k].value) ? std::isnan(s.values[k]) : s.values[k] == float(ref[k].value);
                if (s.steps[k] != float(ref[k].step) || !valueOk) ++wrong;
            }
            CHECK(wrong == 0);
        }
    CHECK(i == got.size());
}

}  // namespace

TEST_CASE("readSeries hands out every point of many runs, through the index or a parallel scan",
          "[store][overlay]") {
    TempDir dir;
    const std::string path = dir.file("l.db");
    Store store(path);
    std::vector<int64_t> runs;
    // 120 runs, 3 keys each; run 7 recorded its steps out of order (an ingested stream may) and
    // has missing values; 1.26 million rows, so that on two cores or more the scan reads two slices.
    for (int r = 0; r < 120; ++r) {
        const int64_t id = newRun(store, "run" + std::to_string(r));
        runs.push_back(id);
        for (int64_t s = 0; s < 5000; ++s) {
            const int64_t step = r == 7 ? (s * 7919) % 5000 : s;
            store.appendMetric(id, "train/loss", step, 0,
                               r == 7 && s % 100 == 0 ? std::nan("") : 1.0 / (1 + step + r));
            store.appendMetric(id, "train/accuracy", step, 0, 0.001 * double(step % 1000));
            if (s % 10 == 0) store.appendMetric(id, "val/loss", step, 0, 0.5 + r);
        }
        if (r == 7)
            store.appendMetric(id, "train/loss", 5, 0, 42.0);  // a repeated step: kept, in order written
    }
    store.flush();

    // All runs: a scan of the table.
    std::vector<Store::Series> all;
    Store::readSeries(path, runs, {}, [&](Store::Series&& s) {
        all.push_back(std::move(s));
        return true;
    });
    checkAgainstMetrics(store, all, runs);

    // A few runs, one key: through the index.
    const std::vector<int64_t> few{runs[3], runs[7], runs[50]};
    std::vector<Store::Series> some;
    Store::readSeries(
        path, few, [](const std::string& key) { return key == "train/loss"; },
        [&](Store::Series&& s) {
            some.push_back(std::move(s));
            return true;
        });
    checkAgainstMetrics(store, some, few, "train/loss");

    // Stopping: from `each`, and from keepGoing during the scan.
    int handed = 0;
    Store::readSeries(path, runs, {}, [&](Store::Series&&) { return ++handed < 5; });
    CHECK(handed == 5);
    int asked = 0;
    handed = 0;
    Store::readSeries(
        path, runs, {},
        [&](Store::Series&&) {
            ++handed;
            return true;
        },
        [&](double done) {
            CHECK(done >= 0);
            CHECK(done <= 1);
            return ++asked < 2;
        });
    CHECK(asked == 2);
    CHECK(handed == 0);

    // Params of many runs at once; a file that is not there is a StoreError, not a new file.
    const auto params = Store::readParams(path, few);
    REQUIRE(params.size() == 3);
    CHECK(params.at(runs[7]).at("lr") == "0.001");
    CHECK_THROWS_AS(Store::readSeries(dir.file("missing.db"), runs, {}, [](Store::Series&&) { return true; }),
                    StoreError);
    CHECK_FALSE(std::filesystem::exists(dir.file("missing.db")));

    // Keys whose points were all dropped (a resume from scratch): empty series, through the scan.
    Store bare(dir.file("bare.db"));
    std::vector<int64_t> emptied;
    for (int r = 0; r < 70; ++r) {
        const int64_t id = newRun(bare, "e" + std::to_string(r));
        bare.appendMetric(id, "train/loss", 1, 0, 1.0);
        emptied.push_back(id);
    }
    bare.flush();
    for (int64_t id : emptied) bare.dropMetricsAfter(id, -1);
    bare.flush();
    size_t series = 0, points = 0;
    Store::readSeries(dir.file("bare.db"), emptied, {}, [&](Store::Series&& s) {
        ++series;
        points += s.steps.size();
        return true;
    });
    CHECK(series == 70);
    CHECK(points == 0);
}

namespace {

int64_t countRows(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
    REQUIRE(sqlite3_step(st) == SQLITE_ROW);
    const auto n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

std::vector<Store::Series> readAll(const std::string& path, const std::vector<int64_t>& runs,
                                   std::vector<int64_t>* unpacked = nullptr) {
    std::vector<Store::Series> got;
    Store::readSeries(
        path, runs, {},
        [&](Store::Series&& s) {
            got.push_back(std::move(s));
            return true;
        },
        {}, unpacked);
    return got;
}

}  // namespace

TEST_CASE("an ended run's series are read from their packs, and a pack goes when its points change",
          "[store][overlay]") {
    TempDir dir;
    const std::string path = dir.file("p.db");
    Store store(path);
    std::vector<int64_t> runs;
    // 70 runs of 2 keys: the first 10 end (completed, stopped or failed) and are packed; the
    // other 60 are still running, enough unpacked series for the parallel scan.
    for (int r = 0; r < 70; ++r) {
        const int64_t id = newRun(store, "run" + std::to_string(r));
        runs.push_back(id);
        store.setRunStatus(id, RunStatus::Running);
        for (int64_t s = 0; s < 600; ++s) {
            const int64_t step = r == 0 ? (s * 7) % 600 : s;  // run 0 wrote its steps out of order
            store.appendMetric(id, "train/loss", step, 0,
                               r == 0 && s % 50 == 0 ? std::nan("") : 1.0 / (1 + s + r));
            store.appendMetric(id, "train/accuracy", step, 0, 0.001 * double(s));
        }
        if (r < 10)
            store.setRunStatus(id, r % 3 == 0 ? RunStatus::Completed
                                              : (r % 3 == 1 ? RunStatus::Stopped : RunStatus::Failed));
    }
    store.flush();
    CHECK(countRows(path, "SELECT count(*) FROM metric_packs") == 20);

    // Packed and unpacked series mixed, through the scan and through the index: the same points.
    std::vector<int64_t> unpacked;
    checkAgainstMetrics(store, readAll(path, runs, &unpacked), runs);
    CHECK(unpacked == std::vector<int64_t>(runs.begin() + 10, runs.end()));
    const std::vector<int64_t> few{runs[0], runs[4], runs[20]};
    unpacked.clear();
    checkAgainstMetrics(store, readAll(path, few, &unpacked), few);
    CHECK(unpacked == std::vector<int64_t>{runs[20]});

    // A pack that disagrees with itself is not believed: the rows are read.
    sqlExec(path, ("UPDATE metric_packs SET points = points + 1 WHERE key_id IN (SELECT id FROM metric_keys "
                   "WHERE run_id = " +
                   std::to_string(runs[4]) + ")")
                      .c_str());
    unpacked.clear();
    checkAgainstMetrics(store, readAll(path, few, &unpacked), few);
    CHECK(unpacked == std::vector<int64_t>{runs[4], runs[20]});

    // Points added to an ended run (an evaluation afterwards) or dropped (a resume): its packs go,
    // and the reads see the change.
    store.appendMetric(runs[0], "train/loss", 600, 0, 0.25);
    store.dropMetricsAfter(runs[1], 300);
    store.flush();
    CHECK(countRows(path, "SELECT count(*) FROM metric_packs") == 20 - 1 - 2);
    CHECK(countRows(path,
                    "SELECT count(*) FROM metric_packs WHERE key_id IN (SELECT id FROM metric_keys WHERE "
                    "run_id = " +
                        std::to_string(runs[0]) + ")") == 1);
    checkAgainstMetrics(store, readAll(path, runs), runs);
    REQUIRE(store.metrics(runs[0], "train/loss").size() == 601);

    // Packing on request: ended runs only, in small transactions; a running run is left alone.
    store.packSeries(runs);
    store.flush();
    CHECK(countRows(path, "SELECT count(*) FROM metric_packs") == 20);
    unpacked.clear();
    checkAgainstMetrics(store, readAll(path, runs, &unpacked), runs);
    CHECK(unpacked.size() == 60);

    // A run deleted with its keys takes its packs along.
    sqlExec(path,
            ("PRAGMA foreign_keys=ON; DELETE FROM metric_keys WHERE run_id = " + std::to_string(runs[2]))
                .c_str());
    CHECK(countRows(path, "SELECT count(*) FROM metric_packs") == 18);
}

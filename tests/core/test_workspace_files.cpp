// Each workspace owns its files: two workspace files in one folder never share a checkpoint,
// checkpoints name their owner, and files of the old shared layout are adopted safely.
#include <sqlite3.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>

#include "lathe/core/checkpoint.h"
#include "lathe/core/error.h"
#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;
namespace fs = std::filesystem;

namespace {

void sqlExec(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    INFO((err ? err : ""));
    sqlite3_free(err);
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_OK);
}

// Trains run 1 of `store` for `epochs`, stopping after the checkpoint of epoch `stopAfter` (0: no stop).
RecordedRun trainRun(Store& store, int64_t epochs, uint64_t seed, int64_t stopAfter = 0) {
    RunSpec spec;
    spec.epochs = epochs;
    spec.seed = static_cast<int64_t>(seed);
    spec.threads = 1;
    std::atomic<bool> stop{false};
    RecordOptions o;
    o.stop = &stop;
    return trainAndRecord(store, spec, o, [&](const Event& e) {
        if (stopAfter > 0 && e.type == Event::Type::Checkpoint && e.value == static_cast<double>(stopAfter))
            stop = true;
    });
}

std::string lastCheckpoint(const Store& s, int64_t run) {
    std::string path;
    for (const auto& a : s.artifacts(run))
        if (a.kind == "checkpoint") path = a.path;
    return path;
}

}  // namespace

TEST_CASE("two workspaces in one folder keep their own files and resume only their own checkpoints",
          "[workspace]") {
    TempDir dir;
    Store a(dir.file("a.db"));
    Store b(dir.file("b.db"));
    CHECK(a.workspaceId().size() == 32);
    CHECK(a.workspaceId() != b.workspaceId());
    CHECK(a.filesDir() == dir.file("a.db-files"));
    CHECK(a.artifactDir(1) != b.artifactDir(1));

    // a's run 1 stops after its first epoch; then b's run 1 (another seed) runs to the end.
    const auto ra = trainRun(a, 100, 1, 1);
    REQUIRE(ra.result.status == lathe::core::RunStatus::Stopped);
    const auto rb = trainRun(b, 2, 2);
    REQUIRE(rb.result.status == lathe::core::RunStatus::Completed);
    REQUIRE(ra.runId == 1);
    REQUIRE(rb.runId == 1);

    const auto ckptA = lastCheckpoint(a, 1), ckptB = lastCheckpoint(b, 1);
    CHECK(ckptA != ckptB);
    const auto infoA = readCheckpointInfo(ckptA);
    CHECK(infoA.epoch == 1);  // b's run did not touch it
    CHECK(infoA.workspaceId == a.workspaceId());
    CHECK(infoA.runId == 1);
    CHECK(readCheckpointInfo(ckptB).workspaceId == b.workspaceId());

    SECTION("a's run resumes from its own checkpoint") {
        RunSpec spec;
        spec.epochs = 3;
        spec.seed = 1;
        spec.threads = 1;
        RecordOptions o;
        o.resumeRunId = 1;
        const auto resumed = trainAndRecord(a, spec, o);
        CHECK(resumed.result.status == lathe::core::RunStatus::Completed);
        CHECK(resumed.result.epochsDone == 3);
        CHECK(readCheckpointInfo(lastCheckpoint(a, 1)).epoch == 3);
        CHECK(readCheckpointInfo(ckptB).epoch == 2);
    }
    SECTION("another workspace's checkpoint put in its place is refused by name") {
        // What the old shared layout allowed: b's run 1 writing over a's run 1's file.
        fs::copy_file(ckptB, ckptA, fs::copy_options::overwrite_existing);
        RunSpec spec;
        spec.epochs = 3;
        spec.seed = 1;
        RecordOptions o;
        o.resumeRunId = 1;
        CHECK_THROWS_WITH(trainAndRecord(a, spec, o), Catch::Contains("another workspace") &&
                                                          Catch::Contains(b.workspaceId()) &&
                                                          Catch::Contains("refusing to resume"));
        CHECK(a.run(1)->status == lathe::core::RunStatus::Stopped);  // nothing changed
    }
}

TEST_CASE("files of the old shared layout are adopted into the workspace's own directory", "[workspace]") {
    TempDir dir;
    const auto path = dir.file("old.db");
    int64_t run = 0;
    std::string ownCkpt;
    {
        Store s(path);
        const auto r = trainRun(s, 1, 3);
        REQUIRE(r.result.status == lathe::core::RunStatus::Completed);
        run = r.runId;
        ownCkpt = lastCheckpoint(s, run);
    }
    // Turn it into what a schema-4 workspace looked like: files in the folder's shared artifacts/.
    const auto legacy = dir.file("artifacts/run-1/last.ckpt");
    fs::create_directories(fs::path(legacy).parent_path());
    fs::rename(ownCkpt, legacy);
    fs::remove_all(dir.file("old.db-files"));
    sqlExec(path, "UPDATE artifacts SET path = '" + legacy +
                      "'; DROP TABLE workspace; DROP TABLE hosts; DROP TABLE deployment_tokens; "
                      "ALTER TABLE model_versions DROP COLUMN parent_model; "
                      "ALTER TABLE model_versions DROP COLUMN derivation; "
                      "ALTER TABLE model_versions DROP COLUMN report; DROP TABLE rollout_decisions; "
                      "DROP TABLE rollouts; DROP TABLE dataset_history; DROP TABLE dataset_files; DROP TABLE "
                      "dataset_versions; DROP TABLE datasets; DROP TABLE metric_packs; DROP TABLE "
                      "trial_rungs; DROP TABLE trials; "
                      "DROP TABLE studies; ALTER TABLE runs DROP COLUMN data_version_id; "
                      "PRAGMA user_version = 4;");

    SECTION("a file that is still the recorded one is linked in and the record repointed") {
        Store s(path);
        CHECK(s.schemaVersion() == Store::kSchemaVersion);
        CHECK(lastCheckpoint(s, run) == ownCkpt);
        CHECK(readCheckpointInfo(ownCkpt).epoch == 1);
        CHECK(fs::exists(legacy));  // never removed: a neighbouring workspace may record it too
        CHECK(fs::equivalent(legacy, ownCkpt));
    }
    SECTION("a file another workspace wrote over stays where it is, and is not resumed from") {
        // Another run's checkpoint at the shared path (what a neighbouring workspace's run 1 did).
        TempDir other;
        Store o(other.file("o.db"));
        REQUIRE(trainRun(o, 2, 4).result.status == lathe::core::RunStatus::Completed);
        fs::copy_file(lastCheckpoint(o, 1), legacy, fs::copy_options::overwrite_existing);
        Store s(path);
        CHECK(lastCheckpoint(s, run) == legacy);
        CHECK_FALSE(fs::exists(ownCkpt));
        RunSpec spec;
        spec.epochs = 3;
        spec.seed = 3;
        RecordOptions ro;
        ro.resumeRunId = run;
        CHECK_THROWS_AS(trainAndRecord(s, spec, ro), CheckpointError);
        CHECK(s.run(run)->status == lathe::core::RunStatus::Completed);
    }
}

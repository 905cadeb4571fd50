#include "lathe/core/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "lathe/core/checkpoint.h"
#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/sha256.h"
#include "workspace/sqlite_util.h"

namespace fs = std::filesystem;

namespace lathe::core {
namespace {

constexpr int kCommitAttempts = 5;          // 50 + 100 + 200 + 400 ms between them
constexpr int kApplicationId = 0x4C415448;  // "LATH": marks a file as a Lathe workspace

// Schema migrations: entry i takes a database from version i to i + 1.
const char* const kMigrations[] = {
    R"sql(
CREATE TABLE experiments(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  created_at REAL NOT NULL);
CREATE TABLE runs(
  id INTEGER PRIMARY KEY,
  experiment_id INTEGER NOT NULL REFERENCES experiments(id),
  name TEXT NOT NULL,
  status TEXT NOT NULL,
  model TEXT NOT NULL DEFAULT '',
  data TEXT NOT NULL DEFAULT '',
  config TEXT NOT NULL,
  host TEXT NOT NULL DEFAULT '',
  error TEXT,
  created_at REAL NOT NULL,
  started_at REAL,
  ended_at REAL);
CREATE TABLE params(
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY(run_id, key));
CREATE TABLE metric_keys(
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  key TEXT NOT NULL,
  UNIQUE(run_id, key));
CREATE TABLE metrics(
  key_id INTEGER NOT NULL REFERENCES metric_keys(id) ON DELETE CASCADE,
  step INTEGER NOT NULL,
  wall_time REAL NOT NULL,
  value REAL);
CREATE INDEX metrics_by_key_step ON metrics(key_id, step);
CREATE VIEW metric_points AS
  SELECT k.run_id AS run_id, k.key AS key, m.step AS step, m.wall_time AS wall_time, m.value AS value
  FROM metrics m JOIN metric_keys k ON k.id = m.key_id;
CREATE TABLE events(
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  wall_time REAL NOT NULL,
  level TEXT NOT NULL,
  text TEXT NOT NULL);
CREATE INDEX events_by_run ON events(run_id, id);
CREATE TABLE artifacts(
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  kind TEXT NOT NULL,
  path TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  created_at REAL NOT NULL);
)sql",
    // 1 -> 2: profiles (op spans and step phases)
    R"sql(
CREATE TABLE profile_spans(
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step INTEGER NOT NULL,
  kind TEXT NOT NULL CHECK(kind IN ('op', 'phase')),
  name TEXT NOT NULL,
  shapes TEXT NOT NULL DEFAULT '',
  thread INTEGER NOT NULL,
  start_ns INTEGER NOT NULL,
  dur_ns INTEGER NOT NULL,
  cuda_ns INTEGER);
CREATE INDEX profile_spans_by_run ON profile_spans(run_id, step, start_ns);
)sql",
    // 2 -> 3: model registry, deployments, serving metrics, alerts
    R"sql(
CREATE TABLE models(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  created_at REAL NOT NULL);
CREATE TABLE model_versions(
  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
  version INTEGER NOT NULL,
  path TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  size_bytes INTEGER NOT NULL,
  signature TEXT NOT NULL,
  metrics TEXT NOT NULL DEFAULT '{}',
  run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
  data TEXT NOT NULL DEFAULT '',
  parent_version INTEGER,
  source TEXT NOT NULL,
  created_at REAL NOT NULL,
  PRIMARY KEY(model_id, version));
CREATE TABLE model_aliases(
  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
  alias TEXT NOT NULL,
  version INTEGER NOT NULL,
  updated_at REAL NOT NULL,
  PRIMARY KEY(model_id, alias));
CREATE TABLE deployments(
  id INTEGER PRIMARY KEY,
  model TEXT NOT NULL,
  version INTEGER NOT NULL,
  target TEXT NOT NULL,
  url TEXT NOT NULL,
  pid INTEGER,
  log_path TEXT NOT NULL DEFAULT '',
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  started_at REAL NOT NULL,
  ended_at REAL,
  end_reason TEXT);
CREATE INDEX deployments_by_model ON deployments(model, started_at);
CREATE TABLE serving_metrics(
  model TEXT NOT NULL,
  key TEXT NOT NULL,
  t REAL NOT NULL,
  value REAL,
  version INTEGER NOT NULL DEFAULT 0);
CREATE INDEX serving_metrics_by_model ON serving_metrics(model, key, t);
CREATE TABLE alerts(
  id INTEGER PRIMARY KEY,
  model TEXT NOT NULL,
  rule TEXT NOT NULL,
  message TEXT NOT NULL,
  value REAL,
  fired_at REAL NOT NULL,
  resolved_at REAL);
CREATE INDEX alerts_by_model ON alerts(model, fired_at);
)sql",
    // 3 -> 4: the nonce a local deployment's server was started with (`--instance-id`), so a
    // recorded pid or URL is only trusted when the process behind it carries the same one.
    R"sql(
ALTER TABLE deployments ADD COLUMN instance TEXT NOT NULL DEFAULT '';
)sql",
    // 4 -> 5: the workspace's own id, written into every checkpoint of its runs, so that a file
    // of another workspace (they once shared their folder's artifacts/) is recognised and refused.
    R"sql(
CREATE TABLE workspace(id TEXT NOT NULL);
INSERT INTO workspace(id) VALUES (lower(hex(randomblob(16))));
)sql",
    // 5 -> 6: the hosts inventory (`lathectl hosts`). Port 0 and empty texts mean "not set":
    // ssh config or the defaults decide. No secrets: identity is a key file's path.
    R"sql(
CREATE TABLE hosts(
  name TEXT PRIMARY KEY,
  address TEXT NOT NULL,
  port INTEGER NOT NULL DEFAULT 0,
  user TEXT NOT NULL DEFAULT '',
  identity TEXT NOT NULL DEFAULT '',
  lathectl TEXT NOT NULL DEFAULT '',
  slots INTEGER NOT NULL DEFAULT 1,
  added_at REAL NOT NULL);
)sql",
    // 6 -> 7: each deployed server's control token (the Bearer secret of its /v2/repository API),
    // keyed by the server's --instance-id nonce, which every record of that server shares across
    // hot swaps and rollbacks. Apart from `deployments` so that no listing of them can carry it.
    R"sql(
CREATE TABLE deployment_tokens(
  instance TEXT PRIMARY KEY,
  token TEXT NOT NULL,
  created_at REAL NOT NULL);
)sql",
    // 7 -> 8: how a version was derived from another (compression): the parent may belong to
    // another model (a distilled student under its own name), the method and settings as JSON,
    // and the compression report (accuracy, size, latency against the parent) as JSON.
    R"sql(
ALTER TABLE model_versions ADD COLUMN parent_model TEXT NOT NULL DEFAULT '';
ALTER TABLE model_versions ADD COLUMN derivation TEXT NOT NULL DEFAULT '';
ALTER TABLE model_versions ADD COLUMN report TEXT NOT NULL DEFAULT '';
)sql",
    // 8 -> 9: progressive rollouts (`lathectl rollout`): the plan and where it stands, one
    // running or paused rollout per model at most, and every decision with the numbers behind it.
    R"sql(
CREATE TABLE rollouts(
  id INTEGER PRIMARY KEY,
  model TEXT NOT NULL,
  baseline INTEGER NOT NULL,
  candidate INTEGER NOT NULL,
  plan TEXT NOT NULL,
  state TEXT NOT NULL,
  step INTEGER NOT NULL DEFAULT 0,
  weight_bp INTEGER NOT NULL DEFAULT 0,
  bad_in_row INTEGER NOT NULL DEFAULT 0,
  actor TEXT NOT NULL,
  started_at REAL NOT NULL,
  updated_at REAL NOT NULL,
  ended_at REAL,
  end_reason TEXT NOT NULL DEFAULT '');
CREATE UNIQUE INDEX rollouts_one_active ON rollouts(model) WHERE ended_at IS NULL;
CREATE TABLE rollout_decisions(
  id INTEGER PRIMARY KEY,
  rollout_id INTEGER NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
  t REAL NOT NULL,
  first_t REAL NOT NULL,
  kind TEXT NOT NULL,
  step INTEGER NOT NULL,
  weight_bp INTEGER NOT NULL,
  reason TEXT NOT NULL,
  numbers TEXT NOT NULL DEFAULT '{}',
  repeats INTEGER NOT NULL DEFAULT 1,
  actor TEXT NOT NULL);
CREATE INDEX rollout_decisions_by_rollout ON rollout_decisions(rollout_id, id);
)sql",
    // 9 -> 10: versioned data sets (`lathectl data`): each version's manifest (path, SHA-256,
    // size, mtime of every file; the files themselves are in <workspace>-files/data/objects), which
    // version is current and how it got there, and the version each run trained on (lineage).
    R"sql(
CREATE TABLE datasets(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  current_version INTEGER NOT NULL DEFAULT 0,
  created_at REAL NOT NULL);
CREATE TABLE dataset_versions(
  id INTEGER PRIMARY KEY,
  dataset_id INTEGER NOT NULL REFERENCES datasets(id) ON DELETE CASCADE,
  version INTEGER NOT NULL,
  root_hash TEXT NOT NULL,
  kind TEXT NOT NULL,
  source TEXT NOT NULL,
  files INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  created_at REAL NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  UNIQUE(dataset_id, version));
CREATE TABLE dataset_files(
  version_id INTEGER NOT NULL REFERENCES dataset_versions(id) ON DELETE CASCADE,
  path TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  PRIMARY KEY(version_id, path)) WITHOUT ROWID;
CREATE INDEX dataset_files_by_hash ON dataset_files(sha256);
CREATE TABLE dataset_history(
  id INTEGER PRIMARY KEY,
  dataset_id INTEGER NOT NULL REFERENCES datasets(id) ON DELETE CASCADE,
  t REAL NOT NULL,
  version INTEGER NOT NULL,
  action TEXT NOT NULL);
ALTER TABLE runs ADD COLUMN data_version_id INTEGER;
)sql",
    // 10 -> 11: hyper-parameter studies (`lathectl tune`): a study's space, algorithm, objective
    // and state; its trials (each an ordinary run) with their parameters and outcome; the value
    // each trial had at each ASHA rung.
    R"sql(
CREATE TABLE studies(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  sampler TEXT NOT NULL,
  pruner TEXT NOT NULL,
  objective TEXT NOT NULL,
  direction TEXT NOT NULL,
  space TEXT NOT NULL,
  base_config TEXT NOT NULL,
  settings TEXT NOT NULL DEFAULT '{}',
  state TEXT NOT NULL DEFAULT '{}',
  status TEXT NOT NULL,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL);
CREATE TABLE trials(
  id INTEGER PRIMARY KEY,
  study_id INTEGER NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
  number INTEGER NOT NULL,
  run_id INTEGER REFERENCES runs(id) ON DELETE SET NULL,
  state TEXT NOT NULL,
  params TEXT NOT NULL,
  value REAL,
  pruned_at REAL NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  host TEXT NOT NULL DEFAULT '',
  pid INTEGER NOT NULL DEFAULT 0,
  started_at REAL NOT NULL,
  ended_at REAL NOT NULL DEFAULT 0,
  UNIQUE(study_id, number));
CREATE INDEX trials_by_run ON trials(run_id);
CREATE TABLE trial_rungs(
  trial_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
  rung INTEGER NOT NULL,
  budget REAL NOT NULL,
  value REAL NOT NULL,
  promoted INTEGER NOT NULL,
  PRIMARY KEY(trial_id, rung)) WITHOUT ROWID;
)sql",
    // 11 -> 12: packed copies of ended runs' series (float32 steps and values in step order, as
    // the overlay draws them), so that overlaying many runs reads a blob per series rather than
    // a row per point. Derived data: the writer packs a run when it ends (Store::packSeries for
    // older ones) and drops a key's pack whenever points are added to it or dropped from it.
    R"sql(
CREATE TABLE metric_packs(
  key_id INTEGER PRIMARY KEY REFERENCES metric_keys(id) ON DELETE CASCADE,
  points INTEGER NOT NULL,
  steps BLOB NOT NULL,
  vals BLOB NOT NULL);
)sql",
};
constexpr int kLatestSchema = static_cast<int>(sizeof(kMigrations) / sizeof(kMigrations[0]));
static_assert(kLatestSchema == Store::kSchemaVersion, "add a migration when bumping the schema version");

// One key's points as the overlay draws them, through the (key, step) index: floats in step
// order, ties as written, NaN for a missing value. Packs (Impl::packRun) and readSeries' reads of
// unpacked series both come this way, so the two never disagree.
constexpr const char* kKeyPointsSql = "SELECT step, value FROM metrics WHERE key_id = ? ORDER BY step, rowid";
void readKeyPoints(Stmt& points, int64_t keyId, std::vector<float>& steps, std::vector<float>& values) {
    points.bind(1, keyId);
    while (points.step()) {
        steps.push_back(float(points.i64(0)));
        values.push_back(points.isNull(1) ? std::numeric_limits<float>::quiet_NaN() : float(points.f64(1)));
    }
    points.reset();
}

// A metric point as queued: 40 bytes, the key interned (Impl::keyNames), so a million queued
// points cost ~40 MB rather than a full WriteOp each.
struct MetricRow {
    int64_t run;
    uint32_t key;
    int64_t step;
    double t, value;
};

struct WriteOp {
    enum class Kind {
        CreateRun,
        Status,
        UpdateConfig,
        Metrics,
        Spans,
        Log,
        Artifact,
        DropMetrics,
        PackSeries,
        MaxPages,
        AddHost,
        UpdateHost,
        RemoveHost,
        Flush
    } kind;
    int64_t run = 0;
    std::string a, b, c, d, e, f;  // meaning per kind
    int64_t step = 0;
    double t = 0;
    std::map<std::string, std::string> params;
    std::vector<MetricRow> rows;                         // Kind::Metrics: consecutive points, in order
    std::vector<std::pair<int64_t, ProfileSpan>> spans;  // Kind::Spans: (run, span), in order
    std::shared_ptr<const HostRecord> host;              // AddHost, UpdateHost (RemoveHost: a = name)
    std::vector<int64_t> ids;                            // PackSeries: the runs
    std::shared_ptr<std::promise<int64_t>> reply;
};

// Producers wait once this many points are queued: memory stays bounded when a run logs
// faster than the disk takes it.
constexpr size_t kMaxQueuedRows = size_t{1} << 20;
// How long the writer lets metrics and spans gather before committing them, and how many rows
// wake it earlier. Producers wake it only when the queue was empty (or reaches kWakeRows).
constexpr auto kLinger = std::chrono::milliseconds(20);
constexpr size_t kWakeRows = kMaxQueuedRows / 4;

}  // namespace

struct Store::Impl {
    std::string path;
    int schema = 0;
    sqlite3* writeDb = nullptr;
    sqlite3* readDb = nullptr;
    mutable std::mutex readMutex;

    std::mutex queueMutex;
    std::condition_variable queueCv;
    std::condition_variable spaceCv;
    std::deque<WriteOp> queue;
    size_t queuedRows = 0;
    std::unordered_map<std::string, uint32_t> keyIndex;  // metric key -> index in keyNames
    std::vector<std::string> keyNames;                   // both guarded by queueMutex
    bool stopping = false;
    // Something other than metrics and spans is queued (a reply is awaited, a status changes):
    // the writer commits at once instead of lingering.
    bool urgent = false;
    std::exception_ptr writerError;
    std::atomic<bool> writeFailed{false};  // a batch was given up since the last flush()
    std::thread writer;
    // Writer-thread state: metric_keys ids per (run, interned key), so each point is one insert.
    std::vector<std::string> writerKeyNames;  // the writer's copy of keyNames
    // With each id, the Metrics op that last dropped its pack (metricsOps): once per op and key.
    struct KeyEntry {
        int64_t id = 0;
        uint64_t unpackedIn = 0;
    };
    std::map<std::pair<int64_t, uint32_t>, KeyEntry> keyIds;
    uint64_t metricsOps = 0;
    std::unique_ptr<Stmt> insertMetric, insertLog, insertSpan, dropPack;

    ~Impl() {
        if (writer.joinable()) {
            {
                std::lock_guard<std::mutex> lk(queueMutex);
                stopping = true;
            }
            queueCv.notify_all();
            writer.join();
        }
        insertMetric.reset();
        insertLog.reset();
        insertSpan.reset();
        dropPack.reset();
        if (readDb) sqlite3_close_v2(readDb);
        if (writeDb) sqlite3_close_v2(writeDb);
    }

    void open();
    void migrate();
    void adoptLegacyFiles();
    std::string workspaceId;
    void writerLoop();
    void beginWrite();
    int64_t apply(const WriteOp& op);
    KeyEntry& keyId(int64_t run, uint32_t key);
    void packRun(int64_t run);
    void enqueue(WriteOp op) {
        {
            std::lock_guard<std::mutex> lk(queueMutex);
            queue.push_back(std::move(op));
            urgent = true;
        }
        queueCv.notify_one();
    }
    int64_t enqueueAndWait(WriteOp op) {
        auto reply = std::make_shared<std::promise<int64_t>>();
        auto fut = reply->get_future();
        op.reply = reply;
        enqueue(std::move(op));
        return fut.get();
    }
};

void Store::Impl::open() {
    std::error_code ec;
    const bool exists = fs::exists(path, ec);
    if (exists && fs::is_directory(path, ec))
        throw StoreError(path + " is a directory, not a Lathe workspace file; pass a file path with --db");
    if (!exists) {
        const auto parent = fs::path(path).parent_path();
        if (!parent.empty()) {
            fs::create_directories(parent, ec);
            if (ec)
                throw StoreError("cannot create workspace directory " + parent.string() + ": " +
                                 ec.message());
        }
    }
    const int flags = SQLITE_OPEN_READWRITE | (exists ? 0 : SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path.c_str(), &writeDb, flags, nullptr) != SQLITE_OK) {
        std::string msg = writeDb ? sqlite3_errmsg(writeDb) : "out of memory";
        throw StoreError("cannot open workspace " + path + ": " + msg);
    }
    sqlite3_busy_timeout(writeDb, 5000);
    // A new workspace is its owner's alone (it keeps deployment tokens): 0600, which SQLite's -wal
    // and -shm files copy.
    if (!exists) ::chmod(path.c_str(), 0600);

    // Inspect before changing anything: a foreign or newer file must be left exactly as it is,
    // so the journal mode is only switched to WAL once the file is known to be ours.
    int appId = 0, version = 0, tables = 0;
    try {
        // One read transaction: another Lathe creating this workspace at the same moment commits
        // its first tables and the application id together, and three separate reads could see
        // the id before and the tables after (a new workspace taken for another program's file).
        exec(writeDb, "BEGIN");
        {
            Stmt s(writeDb, "PRAGMA application_id");
            if (s.step()) appId = static_cast<int>(s.i64(0));
        }
        {
            Stmt s(writeDb, "PRAGMA user_version");
            if (s.step()) version = static_cast<int>(s.i64(0));
        }
        {
            Stmt s(writeDb, "SELECT count(*) FROM sqlite_master");
            if (s.step()) tables = static_cast<int>(s.i64(0));
        }
        exec(writeDb, "COMMIT");
    } catch (const StoreError& ex) {
        sqlite3_exec(writeDb, "ROLLBACK", nullptr, nullptr, nullptr);
        throw StoreError(path + " is not a Lathe workspace (" + ex.what() +
                         "); choose another file with --db or LATHE_DB");
    }
    if (appId != kApplicationId && !(appId == 0 && tables == 0))
        throw StoreError(path +
                         " is not a Lathe workspace (an SQLite database of another program); "
                         "choose another file with --db or LATHE_DB");
    if (version > kLatestSchema)
        throw StoreError(path + " has workspace schema version " + std::to_string(version) +
                         ", newer than this Lathe understands (" + std::to_string(kLatestSchema) +
                         "); upgrade Lathe to open it");
    schema = version;

    // Another process creating or migrating the same new workspace at this moment (a second
    // lathectl started beside the first) can make the switch to WAL answer "database is locked"
    // at once, without waiting on the busy handler: try again for as long as the busy timeout.
    for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);;) {
        const int rc = sqlite3_exec(writeDb, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
        if (rc == SQLITE_OK) break;
        if (((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) ||
            std::chrono::steady_clock::now() > deadline)
            throw StoreError("cannot open workspace " + path +
                             " (switching it to WAL mode): " + sqlite3_errmsg(writeDb));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    exec(writeDb, "PRAGMA synchronous=NORMAL");
    exec(writeDb, "PRAGMA foreign_keys=ON");
    migrate();

    {
        Stmt w(writeDb, "SELECT id FROM workspace LIMIT 1");
        if (!w.step() || w.text(0).empty())
            throw StoreError("workspace " + path + " has no id (damaged file?)");
        workspaceId = w.text(0);
    }
    adoptLegacyFiles();

    if (sqlite3_open_v2(path.c_str(), &readDb, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) !=
        SQLITE_OK)
        throw StoreError("cannot open workspace " + path + " for reading: " + sqlite3_errmsg(readDb));
    sqlite3_busy_timeout(readDb, 5000);
    exec(readDb, "PRAGMA query_only=ON");
}

// Before schema 5 every workspace of a folder kept its files in the folder's shared artifacts/
// and models/, where one workspace's run 1 overwrote another's checkpoint. The files this
// workspace recorded are linked (copied where links fail) into its own directory and the records
// repointed, one table at a time in a transaction after the files are in place: an interrupted
// adoption leaves the old records pointing at the old files, which are never removed (a
// neighbouring workspace may still record them). A file whose checksum is no longer the recorded
// one was overwritten by another workspace: it is left where it is, and a resume from it is
// refused by name.
void Store::Impl::adoptLegacyFiles() {
    const fs::path parent =
        fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    const fs::path own = Store::filesDirFor(path);
    struct Table {
        const char* name;
        const char* select;
        const char* update;
        bool wholeFile;  // model artifacts: the SHA-256 of the file; checkpoints: of their header's fields
    };
    const Table tables[] = {
        {"artifacts", "SELECT rowid, path, sha256 FROM artifacts",
         "UPDATE artifacts SET path = ? WHERE rowid = ?", false},
        {"model_versions", "SELECT rowid, path, sha256 FROM model_versions",
         "UPDATE model_versions SET path = ? WHERE rowid = ?", true},
    };
    for (const auto& table : tables) {
        std::vector<std::pair<int64_t, std::string>> moved;  // rowid, new path
        {
            Stmt s(writeDb, table.select);
            while (s.step()) {
                const std::string old = s.text(1), sha = s.text(2);
                const auto rel = fs::path(old).lexically_relative(parent);
                const auto top = rel.empty() ? std::string() : rel.begin()->string();
                if (top != "artifacts" && top != "models") continue;  // already ours, or elsewhere
                std::error_code ec;
                if (!fs::is_regular_file(old, ec)) continue;
                std::string actual;
                try {
                    actual = table.wholeFile ? sha256File(old) : readCheckpointInfo(old).sha256;
                } catch (const Error&) {
                    continue;  // damaged: stays where it is, and is reported when used
                }
                if (actual != sha) continue;
                const auto target = own / rel;
                fs::create_directories(target.parent_path(), ec);
                if (!fs::exists(target, ec)) {
                    fs::create_hard_link(old, target, ec);
                    if (ec) {
                        ec.clear();
                        const auto tmp = target.string() + ".adopting";
                        fs::copy_file(old, tmp, fs::copy_options::overwrite_existing, ec);
                        if (!ec) fs::rename(tmp, target, ec);
                        if (ec) {
                            fs::remove(tmp, ec);
                            continue;
                        }
                    }
                }
                moved.emplace_back(s.i64(0), target.string());
            }
        }
        if (moved.empty()) continue;
        exec(writeDb, "BEGIN IMMEDIATE");
        try {
            for (const auto& [rowid, p] : moved) {
                Stmt u(writeDb, table.update);
                u.bind(1, p).bind(2, rowid).run();
            }
            exec(writeDb, "COMMIT");
        } catch (...) {
            sqlite3_exec(writeDb, "ROLLBACK", nullptr, nullptr, nullptr);
            throw;
        }
    }
}

void Store::Impl::migrate() {
    while (schema < kLatestSchema) {
        exec(writeDb, "BEGIN IMMEDIATE");
        try {
            // Another process may have migrated while we waited for the write lock.
            {
                Stmt v(writeDb, "PRAGMA user_version");
                if (v.step()) schema = static_cast<int>(v.i64(0));
            }
            if (schema >= kLatestSchema) {
                exec(writeDb, "COMMIT");
                break;
            }
            exec(writeDb, kMigrations[schema]);
            const std::string set = "PRAGMA application_id=" + std::to_string(kApplicationId) +
                                    "; PRAGMA user_version=" + std::to_string(schema + 1);
            exec(writeDb, set.c_str());
            exec(writeDb, "COMMIT");
        } catch (const StoreError& ex) {
            // A failed rollback must not hide why the migration failed.
            sqlite3_exec(writeDb, "ROLLBACK", nullptr, nullptr, nullptr);
            throw StoreError("migrating workspace " + path + " to schema " + std::to_string(schema + 1) +
                             " failed: " + ex.what());
        }
        ++schema;
    }
}

Store::Impl::KeyEntry& Store::Impl::keyId(int64_t run, uint32_t key) {
    const auto cacheKey = std::make_pair(run, key);
    auto it = keyIds.find(cacheKey);
    if (it != keyIds.end()) return it->second;
    const std::string& name = writerKeyNames.at(key);
    Stmt insert(writeDb, "INSERT OR IGNORE INTO metric_keys(run_id, key) VALUES(?, ?)");
    insert.bind(1, run).bind(2, name).run();
    Stmt select(writeDb, "SELECT id FROM metric_keys WHERE run_id = ? AND key = ?");
    select.bind(1, run).bind(2, name);
    if (!select.step()) throw StoreError("metric key lookup failed");
    const int64_t id = select.i64(0);
    return keyIds.emplace(cacheKey, KeyEntry{id, 0}).first->second;
}

void Store::Impl::packRun(int64_t run) {
    Stmt status(writeDb, "SELECT status FROM runs WHERE id = ?");
    status.bind(1, run);
    if (!status.step()) return;  // deleted meanwhile
    const std::string st = status.text(0);
    if (st == "running" || st == "created") return;  // still gaining points
    Stmt keys(writeDb, "SELECT id FROM metric_keys WHERE run_id = ?");
    keys.bind(1, run);
    std::vector<int64_t> ids;
    while (keys.step()) ids.push_back(keys.i64(0));
    Stmt points(writeDb, kKeyPointsSql);
    Stmt put(writeDb, "INSERT OR REPLACE INTO metric_packs(key_id, points, steps, vals) VALUES(?,?,?,?)");
    std::vector<float> steps, values;
    for (const int64_t id : ids) {
        steps.clear();
        values.clear();
        readKeyPoints(points, id, steps, values);
        put.bind(1, id)
            .bind(2, int64_t(steps.size()))
            .bindBlob(3, steps.data(), steps.size() * sizeof(float))
            .bindBlob(4, values.data(), values.size() * sizeof(float))
            .run();
    }
}

int64_t Store::Impl::apply(const WriteOp& op) {
    // Statements that run per metric point are prepared once for the writer's lifetime.
    if (!insertMetric) {
        insertMetric = std::make_unique<Stmt>(
            writeDb, "INSERT INTO metrics(key_id, step, wall_time, value) VALUES(?,?,?,?)");
        insertLog = std::make_unique<Stmt>(
            writeDb, "INSERT INTO events(run_id, wall_time, level, text) VALUES(?,?,?,?)");
        dropPack = std::make_unique<Stmt>(writeDb, "DELETE FROM metric_packs WHERE key_id = ?");
        insertSpan = std::make_unique<Stmt>(
            writeDb,
            "INSERT INTO profile_spans(run_id, step, kind, name, shapes, thread, start_ns, "
            "dur_ns, cuda_ns) VALUES(?,?,?,?,?,?,?,?,?)");
    }
    switch (op.kind) {
        case WriteOp::Kind::Metrics: {
            auto& s = *insertMetric;
            std::exception_ptr firstError;
            // A key given points is no longer what its pack says: the pack goes (once per key here).
            const uint64_t thisOp = ++metricsOps;
            for (const auto& r : op.rows) {
                try {
                    auto& key = keyId(r.run, r.key);
                    if (key.unpackedIn != thisOp) {
                        dropPack->bind(1, key.id).run();
                        key.unpackedIn = thisOp;
                    }
                    s.bind(1, key.id).bind(2, r.step).bind(3, r.t);
                    if (std::isnan(r.value))
                        s.bindNull(4);
                    else
                        s.bind(4, r.value);
                    s.run();
                } catch (...) {
                    // A point for a missing run must not cost the other runs' points.
                    s.reset();
                    if (!firstError) firstError = std::current_exception();
                }
            }
            if (firstError) std::rethrow_exception(firstError);
            return 0;
        }
        case WriteOp::Kind::Spans: {
            auto& s = *insertSpan;
            std::exception_ptr firstError;
            for (const auto& [run, sp] : op.spans) {
                try {
                    s.bind(1, run)
                        .bind(2, sp.step)
                        .bind(3, std::string(sp.kind == ProfileSpan::Kind::Phase ? "phase" : "op"));
                    s.bind(4, sp.name)
                        .bind(5, sp.shapes)
                        .bind(6, sp.thread)
                        .bind(7, sp.startNs)
                        .bind(8, sp.durationNs);
                    if (sp.cudaNs >= 0)
                        s.bind(9, sp.cudaNs);
                    else
                        s.bindNull(9);
                    s.run();
                } catch (...) {
                    if (!firstError) firstError = std::current_exception();
                }
            }
            if (firstError) std::rethrow_exception(firstError);
            return 0;
        }
        case WriteOp::Kind::Log:
            insertLog->bind(1, op.run).bind(2, op.t).bind(3, op.a).bind(4, op.b).run();
            return 0;
        case WriteOp::Kind::CreateRun: {
            Stmt e(writeDb, "INSERT OR IGNORE INTO experiments(name, created_at) VALUES(?, ?)");
            e.bind(1, op.a).bind(2, op.t).run();
            Stmt r(writeDb,
                   "INSERT INTO runs(experiment_id, name, status, model, data, config, host, created_at) "
                   "VALUES((SELECT id FROM experiments WHERE name = ?), ?, 'created', ?, ?, ?, ?, ?)");
            r.bind(1, op.a)
                .bind(2, op.b)
                .bind(3, op.c)
                .bind(4, op.d)
                .bind(5, op.e)
                .bind(6, op.f)
                .bind(7, op.t)
                .run();
            const int64_t id = sqlite3_last_insert_rowid(writeDb);
            if (op.b.empty()) {
                Stmt n(writeDb, "UPDATE runs SET name = ? WHERE id = ?");
                n.bind(1, "run-" + std::to_string(id)).bind(2, id).run();
            }
            Stmt p(writeDb, "INSERT OR REPLACE INTO params(run_id, key, value) VALUES(?,?,?)");
            for (const auto& [k, v] : op.params) p.bind(1, id).bind(2, k).bind(3, v).run();
            return id;
        }
        case WriteOp::Kind::Status: {
            const char* sql =
                op.a == "running"
                    ? "UPDATE runs SET status = ?, error = NULLIF(?, ''), started_at = COALESCE(started_at, "
                      "?), "
                      "ended_at = NULL WHERE id = ?"
                    : "UPDATE runs SET status = ?, error = NULLIF(?, ''), ended_at = ? WHERE id = ?";
            Stmt s(writeDb, sql);
            s.bind(1, op.a).bind(2, op.b).bind(3, op.t).bind(4, op.run).run();
            if (sqlite3_changes(writeDb) == 0) throw StoreError("no run " + std::to_string(op.run));
            // A run that ended has all its points: pack them for overlays of many runs.
            if (op.a != "running" && op.a != "created") packRun(op.run);
            return 0;
        }
        case WriteOp::Kind::UpdateConfig: {
            Stmt r(writeDb, "UPDATE runs SET config = ? WHERE id = ?");
            r.bind(1, op.e).bind(2, op.run).run();
            if (sqlite3_changes(writeDb) == 0) throw StoreError("no run " + std::to_string(op.run));
            Stmt p(writeDb, "INSERT OR REPLACE INTO params(run_id, key, value) VALUES(?,?,?)");
            for (const auto& [k, v] : op.params) p.bind(1, op.run).bind(2, k).bind(3, v).run();
            return 0;
        }
        case WriteOp::Kind::Artifact: {
            Stmt s(writeDb,
                   "INSERT INTO artifacts(run_id, kind, path, sha256, created_at) VALUES(?,?,?,?,?)");
            s.bind(1, op.run).bind(2, op.a).bind(3, op.b).bind(4, op.c).bind(5, op.t).run();
            return sqlite3_last_insert_rowid(writeDb);
        }
        case WriteOp::Kind::DropMetrics: {
            Stmt s(writeDb,
                   "DELETE FROM metrics WHERE step > ? AND key_id IN (SELECT id FROM metric_keys WHERE "
                   "run_id = ?)");
            s.bind(1, op.step).bind(2, op.run).run();
            Stmt packs(
                writeDb,
                "DELETE FROM metric_packs WHERE key_id IN (SELECT id FROM metric_keys WHERE run_id = ?)");
            packs.bind(1, op.run).run();
            Stmt p(writeDb, "DELETE FROM profile_spans WHERE run_id = ? AND step > ?");
            p.bind(1, op.run).bind(2, op.step).run();
            return 0;
        }
        case WriteOp::Kind::PackSeries:
            for (const int64_t run : op.ids) packRun(run);
            return 0;
        case WriteOp::Kind::MaxPages: {
            // A connection setting, applied on the writer's own connection (opened NOMUTEX).
            const std::string sql = "PRAGMA max_page_count = " + std::to_string(op.step);
            Stmt p(writeDb, sql.c_str());
            p.step();
            return 0;
        }
        case WriteOp::Kind::AddHost: {
            const HostRecord& h = *op.host;
            // Checked inside the write transaction: another process cannot add the name between.
            Stmt exists(writeDb, "SELECT 1 FROM hosts WHERE name = ?");
            exists.bind(1, h.name);
            if (exists.step())
                throw StoreError("host '" + h.name +
                                 "' already exists; remove it first or choose another name");
            Stmt s(writeDb,
                   "INSERT INTO hosts(name, address, port, user, identity, lathectl, slots, added_at) "
                   "VALUES(?,?,?,?,?,?,?,?)");
            s.bind(1, h.name)
                .bind(2, h.address)
                .bind(3, int64_t{h.port})
                .bind(4, h.user)
                .bind(5, h.identity)
                .bind(6, h.lathectl)
                .bind(7, int64_t{h.slots})
                .bind(8, h.addedAt)
                .run();
            return 0;
        }
        case WriteOp::Kind::UpdateHost: {
            const HostRecord& h = *op.host;
            Stmt s(writeDb,
                   "UPDATE hosts SET address = ?, port = ?, user = ?, identity = ?, lathectl = ?, slots = ? "
                   "WHERE name = ?");
            s.bind(1, h.address)
                .bind(2, int64_t{h.port})
                .bind(3, h.user)
                .bind(4, h.identity)
                .bind(5, h.lathectl)
                .bind(6, int64_t{h.slots})
                .bind(7, h.name)
                .run();
            if (sqlite3_changes(writeDb) == 0) throw StoreError("no host '" + h.name + "' in " + path);
            return 0;
        }
        case WriteOp::Kind::RemoveHost: {
            Stmt s(writeDb, "DELETE FROM hosts WHERE name = ?");
            s.bind(1, op.a).run();
            return sqlite3_changes(writeDb);
        }
        case WriteOp::Kind::Flush:
            return 0;
    }
    return 0;
}

void Store::Impl::beginWrite() {
    // BEGIN IMMEDIATE waits busy_timeout for another process's write lock; a long writer
    // elsewhere (another lathectl, the GUI) must delay this batch, not drop it.
    for (int attempt = 0;; ++attempt) {
        const int rc = sqlite3_exec(writeDb, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
        if (rc == SQLITE_OK) return;
        if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || attempt >= 60)
            throw StoreError(std::string("cannot start a write transaction: ") + sqlite3_errmsg(writeDb));
    }
}

void Store::Impl::writerLoop() {
    std::deque<WriteOp> batch;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(queueMutex);
            queueCv.wait(lk, [&] { return stopping || !queue.empty(); });
            // Only metrics and spans so far: let a few steps' worth gather, so that a run pays for
            // one commit every kLinger instead of one per step, and its training thread does not
            // wake this one (a futex call) for every point.
            if (!stopping && !urgent)
                queueCv.wait_for(lk, kLinger, [&] { return stopping || urgent || queuedRows >= kWakeRows; });
            urgent = false;
            if (queue.empty() && stopping) return;
            // Packing reads every point of its runs: at most one PackSeries op per transaction, so
            // that other writers (and this Store's own points) wait for one op's worth at most.
            const auto firstPack = std::find_if(queue.begin(), queue.end(), [](const WriteOp& o) {
                return o.kind == WriteOp::Kind::PackSeries;
            });
            if (firstPack == queue.end() || std::next(firstPack) == queue.end()) {
                batch.swap(queue);
                queuedRows = 0;
            } else {
                const auto cut = std::next(firstPack);
                for (auto it = queue.begin(); it != cut; ++it)
                    queuedRows -= std::min(queuedRows, it->rows.size() + it->spans.size());
                batch.assign(std::make_move_iterator(queue.begin()), std::make_move_iterator(cut));
                queue.erase(queue.begin(), cut);
                urgent = true;  // the rest follows at once
            }
            for (size_t i = writerKeyNames.size(); i < keyNames.size(); ++i)
                writerKeyNames.push_back(keyNames[i]);
        }
        spaceCv.notify_all();
        // One transaction per drained batch: thousands of points cost one commit. Replies are
        // answered only after the commit, so a caller never sees data that is not durable.
        std::vector<std::pair<int64_t, std::exception_ptr>> results(batch.size());
        std::exception_ptr batchError;
        // A transaction that cannot start or commit (disk full, I/O error) is rolled back and the
        // whole batch applied again, a few times over about two seconds, before it is given up:
        // then every waiting caller gets the error, and so does the next flush() (writerFailed()
        // at once), so a run is failed with the reason rather than recorded without its points.
        for (int attempt = 0;; ++attempt) {
            batchError = nullptr;
            try {
                beginWrite();
                for (size_t i = 0; i < batch.size(); ++i) {
                    results[i] = {};
                    try {
                        results[i].first = apply(batch[i]);
                    } catch (...) {
                        // SQLite rolls the whole transaction back on some errors (a full disk, an
                        // I/O error): then the batch has failed as a whole, and must not go on
                        // record by record in autocommit mode.
                        if (sqlite3_get_autocommit(writeDb)) throw;
                        // One bad record (e.g. for a deleted run) must not lose the rest of the batch.
                        results[i].second = std::current_exception();
                    }
                }
                exec(writeDb, "COMMIT");
            } catch (...) {
                sqlite3_exec(writeDb, "ROLLBACK", nullptr, nullptr, nullptr);
                batchError = std::current_exception();
                keyIds.clear();  // ids inserted in the rolled-back transaction no longer exist
            }
            if (!batchError || attempt >= kCommitAttempts - 1) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50 << attempt));
        }
        if (batchError) {
            try {
                std::rethrow_exception(batchError);
            } catch (const std::exception& ex) {
                batchError = std::make_exception_ptr(
                    StoreError("workspace " + path + ": " + std::to_string(batch.size()) +
                               " records could not be written after " + std::to_string(kCommitAttempts) +
                               " attempts (" + ex.what() + "); free disk space, then resume the run"));
            }
            writeFailed.store(true);
        }
        for (size_t i = 0; i < batch.size(); ++i) {
            const auto err = batchError ? batchError : results[i].second;
            if (batch[i].reply) {
                if (err)
                    batch[i].reply->set_exception(err);
                else
                    batch[i].reply->set_value(results[i].first);
            } else if (err) {
                std::lock_guard<std::mutex> lk(queueMutex);
                if (!writerError) writerError = err;
            }
        }
        batch.clear();
    }
}

Store::Store(const std::string& path) : d(std::make_unique<Impl>()) {
    // Absolute, so artifact paths recorded in the workspace stay valid from any directory.
    std::error_code ec;
    const auto abs = fs::absolute(path, ec);
    d->path = ec ? path : abs.lexically_normal().string();
    d->open();
    d->writer = std::thread([impl = d.get()] { impl->writerLoop(); });
}

Store::~Store() = default;

std::string Store::resolvePath(const std::string& explicitPath) {
    if (!explicitPath.empty()) return explicitPath;
    if (const char* env = std::getenv("LATHE_DB"); env && *env) return env;
    if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg)
        return std::string(xdg) + "/lathe/lathe.db";
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.local/share/lathe/lathe.db";
}

const std::string& Store::path() const { return d->path; }
int Store::schemaVersion() const { return d->schema; }

const std::string& Store::workspaceId() const { return d->workspaceId; }

std::string Store::filesDirFor(const std::string& workspacePath) { return workspacePath + "-files"; }

std::string Store::filesDir() const { return filesDirFor(d->path); }

std::string Store::artifactDir(int64_t runId) const {
    return (fs::path(filesDir()) / "artifacts" / ("run-" + std::to_string(runId))).string();
}

std::string Store::runLockPath(int64_t runId) const { return artifactDir(runId) + "/train.lock"; }

int64_t Store::createRun(const std::string& experiment, const std::string& name, const std::string& model,
                         const std::string& data, const std::string& configToml,
                         const std::map<std::string, std::string>& params, const std::string& host) {
    WriteOp op{WriteOp::Kind::CreateRun};
    op.a = experiment.empty() ? "default" : experiment;
    op.b = name;
    op.c = model;
    op.d = data;
    op.e = configToml;
    op.f = host;
    op.t = nowSeconds();
    op.params = params;
    return d->enqueueAndWait(std::move(op));
}

void Store::updateRunConfig(int64_t runId, const std::string& configToml,
                            const std::map<std::string, std::string>& params) {
    WriteOp op{WriteOp::Kind::UpdateConfig};
    op.run = runId;
    op.e = configToml;
    op.params = params;
    d->enqueue(std::move(op));
}

void Store::setRunStatus(int64_t runId, RunStatus status, const std::string& error) {
    WriteOp op{WriteOp::Kind::Status};
    op.run = runId;
    op.a = toString(status);
    op.b = error;
    op.t = nowSeconds();
    d->enqueue(std::move(op));
}

void Store::appendMetric(int64_t runId, const std::string& key, int64_t step, double wallTime, double value) {
    bool wake = false;
    {
        std::unique_lock<std::mutex> lk(d->queueMutex);
        d->spaceCv.wait(lk, [&] { return d->queuedRows < kMaxQueuedRows || d->stopping; });
        auto [it, added] = d->keyIndex.try_emplace(key, static_cast<uint32_t>(d->keyNames.size()));
        if (added) d->keyNames.push_back(key);
        wake = d->queue.empty();
        // Consecutive points share one queued op.
        if (d->queue.empty() || d->queue.back().kind != WriteOp::Kind::Metrics)
            d->queue.push_back(WriteOp{WriteOp::Kind::Metrics});
        d->queue.back().rows.push_back({runId, it->second, step, wallTime, value});
        wake = ++d->queuedRows == kWakeRows || wake;
    }
    if (wake) d->queueCv.notify_one();
}

void Store::appendSpan(int64_t runId, const ProfileSpan& span) {
    bool wake = false;
    {
        std::unique_lock<std::mutex> lk(d->queueMutex);
        d->spaceCv.wait(lk, [&] { return d->queuedRows < kMaxQueuedRows || d->stopping; });
        wake = d->queue.empty();
        if (d->queue.empty() || d->queue.back().kind != WriteOp::Kind::Spans)
            d->queue.push_back(WriteOp{WriteOp::Kind::Spans});
        d->queue.back().spans.emplace_back(runId, span);
        wake = ++d->queuedRows == kWakeRows || wake;
    }
    if (wake) d->queueCv.notify_one();
}

void Store::appendLog(int64_t runId, double wallTime, const std::string& level, const std::string& text) {
    WriteOp op{WriteOp::Kind::Log};
    op.run = runId;
    op.t = wallTime;
    op.a = level;
    op.b = text;
    d->enqueue(std::move(op));
}

void Store::addArtifact(int64_t runId, const std::string& kind, const std::string& path,
                        const std::string& sha256) {
    WriteOp op{WriteOp::Kind::Artifact};
    op.run = runId;
    op.a = kind;
    op.b = path;
    op.c = sha256;
    op.t = nowSeconds();
    d->enqueue(std::move(op));
}

void Store::dropMetricsAfter(int64_t runId, int64_t step) {
    WriteOp op{WriteOp::Kind::DropMetrics};
    op.run = runId;
    op.step = step;
    d->enqueue(std::move(op));
}

void Store::packSeries(const std::vector<int64_t>& runIds) {
    // A few runs per op, one op per transaction (writerLoop): a run of 10,000 points packs in
    // about 10 ms, so no transaction holds the workspace for long.
    constexpr size_t kRunsPerOp = 16;
    for (size_t i = 0; i < runIds.size(); i += kRunsPerOp) {
        WriteOp op{WriteOp::Kind::PackSeries};
        op.ids.assign(runIds.begin() + long(i),
                      runIds.begin() + long(std::min(runIds.size(), i + kRunsPerOp)));
        d->enqueue(std::move(op));
    }
}

void Store::setMaxPages(int64_t pages) {
    WriteOp op{WriteOp::Kind::MaxPages};
    op.step = pages;
    d->enqueueAndWait(std::move(op));
}

bool Store::writeFailed() const { return d->writeFailed.load(); }

namespace {

// Printable, so that a record can never smuggle a line break into a probe or a table.
bool hasControl(const std::string& text) {
    for (const unsigned char c : text)
        if (c < 0x20 || c == 0x7f) return true;
    return false;
}

void validateHost(const HostRecord& h) {
    Store::validateHostName(h.name);
    const std::string of = "host '" + h.name + "': ";
    // The address may end up on an ssh command line: it must never read as an option.
    if (h.address.empty()) throw ConfigError(of + "the address is empty");
    if (h.address.size() > 1024 || h.address.front() == '-' ||
        h.address.find_first_of(" \t") != std::string::npos || hasControl(h.address))
        throw ConfigError(of + "address '" + h.address +
                          "' must be a host name, an address or an ssh-config alias (no spaces, not "
                          "starting with '-')");
    if (h.port < 0 || h.port > 65535)
        throw ConfigError(of + "port must be a number from 1 to 65535 (0: not set), got " +
                          std::to_string(h.port));
    if (!h.user.empty() &&
        (h.user.front() == '-' || h.user.find_first_of(" \t") != std::string::npos || hasControl(h.user)))
        throw ConfigError(of + "user '" + h.user + "' must not contain spaces or start with '-'");
    if (hasControl(h.identity) || hasControl(h.lathectl))
        throw ConfigError(of + "the identity and lathectl paths must not contain control characters");
    if (h.slots < 1 || h.slots > 4096)
        throw ConfigError(of + "slots must be from 1 to 4096, got " + std::to_string(h.slots));
}

}  // namespace

void Store::validateHostName(const std::string& name) {
    auto bad = [&](const std::string& why) {
        throw ConfigError("host name '" + name + "' " + why +
                          " (1 to 64 letters, digits, '.', '_' or '-', not starting with '-')");
    };
    if (name.empty()) bad("is empty");
    if (name.size() > 64) bad("is too long");
    if (name.front() == '-') bad("starts with '-'");
    for (const char c : name) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                        c == '.' || c == '_' || c == '-';
        if (!ok) bad("contains a character other than letters, digits, '.', '_' and '-'");
    }
}

void Store::addHost(const HostRecord& host) {
    validateHost(host);
    auto h = std::make_shared<HostRecord>(host);
    if (h->addedAt <= 0) h->addedAt = nowSeconds();
    WriteOp op{WriteOp::Kind::AddHost};
    op.host = std::move(h);
    d->enqueueAndWait(std::move(op));
}

void Store::updateHost(const HostRecord& host) {
    validateHost(host);
    WriteOp op{WriteOp::Kind::UpdateHost};
    op.host = std::make_shared<const HostRecord>(host);
    d->enqueueAndWait(std::move(op));
}

bool Store::removeHost(const std::string& name) {
    WriteOp op{WriteOp::Kind::RemoveHost};
    op.a = name;
    return d->enqueueAndWait(std::move(op)) > 0;
}

void Store::flush() {
    d->enqueueAndWait(WriteOp{WriteOp::Kind::Flush});
    std::exception_ptr err;
    {
        std::lock_guard<std::mutex> lk(d->queueMutex);
        std::swap(err, d->writerError);
        d->writeFailed.store(false);
    }
    if (err) std::rethrow_exception(err);
}

namespace {
RunRecord readRun(const Stmt& s) {
    RunRecord r;
    r.id = s.i64(0);
    r.experiment = s.text(1);
    r.name = s.text(2);
    r.model = s.text(4);
    r.data = s.text(5);
    r.config = s.text(6);
    r.host = s.text(7);
    r.error = s.text(8);
    r.createdAt = s.f64(9);
    r.startedAt = s.isNull(10) ? 0 : s.f64(10);
    r.endedAt = s.isNull(11) ? 0 : s.f64(11);
    // A status this build does not know (written by a newer Lathe) reads as failed, with the name.
    const auto status = s.text(3);
    if (const auto st = runStatusFromString(status)) {
        r.status = *st;
    } else {
        r.status = RunStatus::Failed;
        if (r.error.empty()) r.error = "status '" + status + "' recorded by another version of Lathe";
    }
    return r;
}
constexpr const char* kRunColumns =
    "SELECT r.id, e.name, r.name, r.status, r.model, r.data, r.config, r.host, r.error, r.created_at, "
    "r.started_at, r.ended_at FROM runs r JOIN experiments e ON e.id = r.experiment_id ";
}  // namespace

namespace {

// Whether some process holds the exclusive flock on `path` (FileLock). A shared, non-blocking
// probe on a read-only descriptor creates nothing and is released at once.
bool lockHeld(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);
    return held;
}

// A run recorded as running whose recorder is gone (its lock is free) was interrupted.
void markInterrupted(const Store& store, RunRecord& r) {
    if (r.status == RunStatus::Running && !lockHeld(store.runLockPath(r.id)))
        r.status = RunStatus::Interrupted;
}

}  // namespace

std::vector<RunRecord> Store::listRuns() const {
    std::vector<RunRecord> out;
    {
        std::lock_guard<std::mutex> lk(d->readMutex);
        Stmt s(d->readDb, (std::string(kRunColumns) + "ORDER BY r.id DESC").c_str());
        while (s.step()) out.push_back(readRun(s));
    }
    for (auto& r : out) markInterrupted(*this, r);
    return out;
}

std::optional<RunRecord> Store::run(int64_t runId) const {
    std::optional<RunRecord> r;
    {
        std::lock_guard<std::mutex> lk(d->readMutex);
        Stmt s(d->readDb, (std::string(kRunColumns) + "WHERE r.id = ?").c_str());
        s.bind(1, runId);
        if (!s.step()) return std::nullopt;
        r = readRun(s);
    }
    markInterrupted(*this, *r);
    return r;
}

std::map<std::string, std::string> Store::params(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb, "SELECT key, value FROM params WHERE run_id = ?");
    s.bind(1, runId);
    std::map<std::string, std::string> out;
    while (s.step()) out[s.text(0)] = s.text(1);
    return out;
}

std::vector<std::string> Store::metricKeys(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb, "SELECT key FROM metric_keys WHERE run_id = ? ORDER BY key");
    s.bind(1, runId);
    std::vector<std::string> out;
    while (s.step()) out.push_back(s.text(0));
    return out;
}

std::vector<MetricPoint> Store::metrics(int64_t runId, const std::string& key, int64_t afterStep) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb,
           "SELECT m.step, m.wall_time, m.value FROM metrics m "
           "WHERE m.key_id = (SELECT id FROM metric_keys WHERE run_id = ? AND key = ?) AND m.step > ? "
           "ORDER BY m.step, m.rowid");
    s.bind(1, runId).bind(2, key).bind(3, afterStep);
    std::vector<MetricPoint> out;
    while (s.step())
        out.push_back(
            {s.i64(0), s.f64(1), s.isNull(2) ? std::numeric_limits<double>::quiet_NaN() : s.f64(2)});
    return out;
}

std::map<std::string, double> Store::lastMetrics(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb,
           "SELECT k.key, (SELECT m.value FROM metrics m WHERE m.key_id = k.id ORDER BY m.step DESC, m.rowid "
           "DESC "
           "LIMIT 1) FROM metric_keys k WHERE k.run_id = ?");
    s.bind(1, runId);
    std::map<std::string, double> out;
    while (s.step()) out[s.text(0)] = s.isNull(1) ? std::numeric_limits<double>::quiet_NaN() : s.f64(1);
    return out;
}

namespace {

// A read-only connection of its own, for the static readers (loaders off the GUI thread).
struct ReadOnlyDb {
    sqlite3* db;
    explicit ReadOnlyDb(const std::string& path) : db(openWorkspaceConnection(path, /*readOnly=*/true)) {}
    ~ReadOnlyDb() { sqlite3_close_v2(db); }
    ReadOnlyDb(const ReadOnlyDb&) = delete;
    ReadOnlyDb& operator=(const ReadOnlyDb&) = delete;
};

}  // namespace

std::map<int64_t, std::map<std::string, std::string>> Store::readParams(const std::string& path,
                                                                        const std::vector<int64_t>& runIds) {
    ReadOnlyDb ro(path);
    Stmt s(ro.db, "SELECT key, value FROM params WHERE run_id = ?");
    std::map<int64_t, std::map<std::string, std::string>> out;
    for (const int64_t runId : runIds) {
        s.bind(1, runId);
        while (s.step()) out[runId][s.text(0)] = s.text(1);
        s.reset();
    }
    return out;
}

void Store::readSeries(const std::string& path, const std::vector<int64_t>& runIds,
                       const std::function<bool(const std::string& key)>& wanted,
                       const std::function<bool(Series&&)>& each,
                       const std::function<bool(double done)>& keepGoing,
                       std::vector<int64_t>* unpackedRuns) {
    ReadOnlyDb ro(path);
    sqlite3* db = ro.db;
    // One read transaction: every series of one snapshot, however long the read takes.
    exec(db, "BEGIN");
    struct End {
        sqlite3* db;
        ~End() { sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr); }
    } end{db};
    // The series wanted, in the order they are handed out.
    std::vector<Series> series;
    std::vector<int64_t> keyIds;
    {
        Stmt keys(db, "SELECT id, key FROM metric_keys WHERE run_id = ? ORDER BY key");
        for (const int64_t runId : runIds) {
            keys.bind(1, runId);
            while (keys.step()) {
                std::string key = keys.text(1);
                if (wanted && !wanted(key)) continue;
                keyIds.push_back(keys.i64(0));
                series.push_back({runId, std::move(key), {}, {}});
            }
            keys.reset();
        }
    }
    // Series of runs that ended come packed (Impl::packRun): a blob each, no row per point. A
    // pack whose sizes disagree is ignored and its rows are read.
    std::vector<char> packed(series.size(), 0);
    size_t unpackedCount = 0;
    {
        Stmt pack(db, "SELECT points, steps, vals FROM metric_packs WHERE key_id = ?");
        for (size_t i = 0; i < series.size(); ++i) {
            pack.bind(1, keyIds[i]);
            if (pack.step()) {
                const int64_t n = pack.i64(0);
                size_t stepBytes = 0, valueBytes = 0;
                const void* steps = pack.blob(1, stepBytes);
                const void* values = pack.blob(2, valueBytes);
                if (n >= 0 && stepBytes == size_t(n) * sizeof(float) && valueBytes == stepBytes &&
                    (n == 0 || (steps && values))) {
                    series[i].steps.resize(size_t(n));
                    series[i].values.resize(size_t(n));
                    if (n > 0) {
                        std::memcpy(series[i].steps.data(), steps, stepBytes);
                        std::memcpy(series[i].values.data(), values, valueBytes);
                    }
                    packed[i] = 1;
                }
            }
            pack.reset();
            if (!packed[i]) {
                ++unpackedCount;
                if (unpackedRuns && (unpackedRuns->empty() || unpackedRuns->back() != series[i].runId))
                    unpackedRuns->push_back(series[i].runId);
            }
        }
    }
    int64_t allKeys = 0;
    {
        Stmt count(db, "SELECT count(*) FROM metric_keys");
        if (count.step()) allKeys = count.i64(0);
    }
    auto going = [&](double done) { return !keepGoing || keepGoing(done); };

    if (unpackedCount < 64 || unpackedCount * 3 < size_t(allKeys)) {
        // Through the index: one range of (key, step) per series, a table lookup per point.
        Stmt points(db, kKeyPointsSql);
        for (size_t i = 0; i < series.size(); ++i) {
            if (!going(double(i) / double(series.size()))) return;
            Series& s = series[i];
            if (packed[i]) {
                if (!each(std::move(s))) return;
                continue;
            }
            readKeyPoints(points, keyIds[i], s.steps, s.values);
            if (!each(std::move(s))) return;
        }
        return;
    }

    // Most of the workspace: the table in rowid order, cut into one slice per core, each read on
    // its own connection into its own series; the slices are then joined in order.
    int64_t lo = 0, hi = -1;
    {
        // Two queries: SQLite answers a lone min() or max() of the rowid from the b-tree's edge,
        // but scans the whole table for both in one.
        Stmt first(db, "SELECT min(rowid) FROM metrics"), last(db, "SELECT max(rowid) FROM metrics");
        if (first.step() && !first.isNull(0) && last.step() && !last.isNull(0))
            lo = first.i64(0), hi = last.i64(0);
    }
    // Key ids are small dense integers (the metric_keys rowid): a table, not a hash, per row.
    const int64_t maxKeyId = *std::max_element(keyIds.begin(), keyIds.end());
    std::vector<int32_t> slotOf(size_t(maxKeyId) + 1, -1);
    for (size_t i = 0; i < keyIds.size(); ++i)
        if (keyIds[i] >= 0 && !packed[i]) slotOf[size_t(keyIds[i])] = int32_t(i);
    const int64_t span = hi - lo + 1;
    // At least one slice (an empty table scans nothing and hands out empty series).
    const int slices = int(std::clamp<int64_t>(std::min<int64_t>(std::thread::hardware_concurrency(), 4), 1,
                                               std::max<int64_t>(1, span / 500000)));
    std::vector<std::vector<Series>> parts(size_t(slices), std::vector<Series>(series.size()));
    std::vector<std::exception_ptr> errors(static_cast<size_t>(slices));
    std::atomic<int64_t> scanned{0};
    std::atomic<bool> stop{false};
    std::atomic<int> running{slices};
    // Each slice reads in a transaction of its own: one snapshot per slice, not one for the
    // whole scan. Points recorded meanwhile past the last rowid are left out; a resume that
    // replaced rows meanwhile can show in one slice and not another (the next read is whole).
    auto scan = [&](int t) {
        struct Done {
            std::atomic<int>& running;
            ~Done() { --running; }
        } done{running};
        try {
            if (span <= 0) return;
            ReadOnlyDb own(path);
            exec(own.db, "BEGIN");
            struct EndOwn {
                sqlite3* db;
                ~EndOwn() { sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr); }
            } endOwn{own.db};
            const int64_t from = lo + span * t / slices, to = lo + span * (t + 1) / slices;
            Stmt rows(own.db, "SELECT key_id, step, value FROM metrics WHERE rowid >= ? AND rowid < ?");
            rows.bind(1, from).bind(2, to);
            auto& mine = parts[size_t(t)];
            // A first guess of each series' share of this slice saves most regrowing.
            const size_t guess = size_t(
                std::min<int64_t>((to - from) / int64_t(std::max<size_t>(unpackedCount, 1)) + 16, 1 << 20));
            for (size_t i = 0; i < mine.size(); ++i)
                if (!packed[i]) mine[i].steps.reserve(guess), mine[i].values.reserve(guess);
            int64_t n = 0;
            while (rows.step()) {
                if ((++n & 0xffff) == 0) {
                    const int64_t all = scanned.fetch_add(0x10000) + 0x10000;
                    if (stop.load() ||
                        (t == 0 && !going(double(all) / double(span)))) {  // keepGoing: one thread
                        stop = true;
                        return;
                    }
                }
                const int64_t keyId = rows.i64(0);
                if (keyId < 0 || keyId > maxKeyId || slotOf[size_t(keyId)] < 0) continue;
                Series& s = mine[size_t(slotOf[size_t(keyId)])];
                s.steps.push_back(float(rows.i64(1)));
                s.values.push_back(rows.isNull(2) ? std::numeric_limits<float>::quiet_NaN()
                                                  : float(rows.f64(2)));
            }
        } catch (...) {
            errors[size_t(t)] = std::current_exception();
            stop = true;
        }
    };
    {
        std::vector<std::thread> threads;
        struct Join {
            std::vector<std::thread>& threads;
            std::atomic<bool>& stop;
            ~Join() {
                if (std::uncaught_exceptions()) stop = true;
                for (auto& th : threads) th.join();
            }
        } join{threads, stop};
        for (int t = 1; t < slices; ++t) threads.emplace_back(scan, t);
        scan(0);
        // Slice 0 done: this thread keeps asking keepGoing while the others finish theirs.
        while (running.load() > 0 && !stop.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            if (!going(std::min(1.0, double(scanned.load()) / double(std::max<int64_t>(span, 1)))))
                stop = true;
        }
    }
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    if (stop.load()) return;
    for (size_t i = 0; i < series.size(); ++i) {
        Series& s = series[i];
        if (packed[i]) {
            if (!each(std::move(s))) return;
            continue;
        }
        s.steps = std::move(parts[0][i].steps);
        s.values = std::move(parts[0][i].values);
        for (size_t p = 1; p < parts.size(); ++p) {
            s.steps.insert(s.steps.end(), parts[p][i].steps.begin(), parts[p][i].steps.end());
            s.values.insert(s.values.end(), parts[p][i].values.begin(), parts[p][i].values.end());
            parts[p][i] = {};
        }
        if (s.steps.capacity() > 2 * s.steps.size() + 64) s.steps.shrink_to_fit(), s.values.shrink_to_fit();
        // Rows come in the order they were written, which is step order unless a stream
        // recorded steps out of order: then order by step, ties as written (as the index does).
        if (!std::is_sorted(s.steps.begin(), s.steps.end())) {
            std::vector<size_t> order(s.steps.size());
            for (size_t k = 0; k < order.size(); ++k) order[k] = k;
            std::stable_sort(order.begin(), order.end(),
                             [&](size_t a, size_t b) { return s.steps[a] < s.steps[b]; });
            Series sorted{s.runId, s.key, {}, {}};
            sorted.steps.reserve(order.size());
            sorted.values.reserve(order.size());
            for (size_t k : order) sorted.steps.push_back(s.steps[k]), sorted.values.push_back(s.values[k]);
            s = std::move(sorted);
        }
        if (!each(std::move(s))) return;
    }
}

std::map<int64_t, double> Store::lastMetricOfRuns(const std::string& key) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb,
           "SELECT k.run_id, (SELECT m.value FROM metrics m WHERE m.key_id = k.id ORDER BY m.step DESC, "
           "m.rowid DESC "
           "LIMIT 1) FROM metric_keys k WHERE k.key = ?");
    s.bind(1, key);
    std::map<int64_t, double> out;
    while (s.step())
        if (!s.isNull(1)) out[s.i64(0)] = s.f64(1);
    return out;
}

std::vector<LogRecord> Store::logs(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb, "SELECT wall_time, level, text FROM events WHERE run_id = ? ORDER BY id");
    s.bind(1, runId);
    std::vector<LogRecord> out;
    while (s.step()) out.push_back({s.f64(0), s.text(1), s.text(2)});
    return out;
}

std::vector<ArtifactRecord> Store::artifacts(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb,
           "SELECT id, kind, path, sha256, created_at FROM artifacts WHERE run_id = ? ORDER BY id");
    s.bind(1, runId);
    std::vector<ArtifactRecord> out;
    while (s.step()) out.push_back({s.i64(0), s.text(1), s.text(2), s.text(3), s.f64(4)});
    return out;
}

int64_t Store::profileSpanCount(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb, "SELECT count(*) FROM profile_spans WHERE run_id = ?");
    s.bind(1, runId);
    return s.step() ? s.i64(0) : 0;
}

namespace {
constexpr const char* kHostColumns =
    "SELECT name, address, port, user, identity, lathectl, slots, added_at FROM hosts ";
HostRecord readHost(const Stmt& s) {
    HostRecord h;
    h.name = s.text(0);
    h.address = s.text(1);
    h.port = static_cast<int>(s.i64(2));
    h.user = s.text(3);
    h.identity = s.text(4);
    h.lathectl = s.text(5);
    h.slots = static_cast<int>(s.i64(6));
    h.addedAt = s.f64(7);
    return h;
}
}  // namespace

std::optional<HostRecord> Store::host(const std::string& name) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb, (std::string(kHostColumns) + "WHERE name = ?").c_str());
    s.bind(1, name);
    if (!s.step()) return std::nullopt;
    return readHost(s);
}

std::vector<HostRecord> Store::hosts() const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb, (std::string(kHostColumns) + "ORDER BY name").c_str());
    std::vector<HostRecord> out;
    while (s.step()) out.push_back(readHost(s));
    return out;
}

std::vector<ProfileSpan> Store::profileSpans(int64_t runId, int64_t fromStep, int64_t toStep) const {
    std::lock_guard<std::mutex> lk(d->readMutex);
    Stmt s(d->readDb,
           "SELECT step, kind, name, shapes, thread, start_ns, dur_ns, cuda_ns FROM profile_spans "
           "WHERE run_id = ? AND step BETWEEN ? AND ? ORDER BY start_ns, dur_ns DESC");
    s.bind(1, runId).bind(2, fromStep).bind(3, toStep);
    std::vector<ProfileSpan> out;
    while (s.step()) {
        ProfileSpan sp;
        sp.step = s.i64(0);
        sp.kind = s.text(1) == "phase" ? ProfileSpan::Kind::Phase : ProfileSpan::Kind::Op;
        sp.name = s.text(2);
        sp.shapes = s.text(3);
        sp.thread = s.i64(4);
        sp.startNs = s.i64(5);
        sp.durationNs = s.i64(6);
        sp.cudaNs = s.isNull(7) ? -1 : s.i64(7);
        out.push_back(std::move(sp));
    }
    return out;
}

}  // namespace lathe::core

#pragma once
// The workspace store: one SQLite file per workspace. One writer thread owns the write
// connection and batches queued inserts into transactions; reads use their own connection
// (WAL), so readers never block the writer. Thread-safe.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/profile_analysis.h"
#include "lathe/core/run_status.h"

namespace lathe::core {

struct RunRecord {
    int64_t id = 0;
    std::string experiment;
    std::string name;
    /// As recorded, except Interrupted: recorded as running, but no process holds the run's lock
    /// (runLockPath) any more: it was killed (SIGKILL, power loss) and can be resumed with
    /// `lathectl train --resume ID`.
    RunStatus status = RunStatus::Created;
    std::string model;
    std::string data;
    std::string config;  // TOML of the RunSpec
    std::string host;
    std::string error;
    double createdAt = 0;  // seconds since the Unix epoch; 0 = not yet
    double startedAt = 0;
    double endedAt = 0;
};

struct MetricPoint {
    int64_t step = 0;
    double wallTime = 0;
    double value = 0;
};

struct LogRecord {
    double wallTime = 0;
    std::string level;
    std::string text;
};

struct ArtifactRecord {
    int64_t id = 0;
    std::string kind;  // "checkpoint", ...
    std::string path;
    std::string sha256;
    double createdAt = 0;
};

/// A host of the workspace's inventory (`lathectl hosts add`): where and how to reach it over
/// SSH. No secrets: `identity` is the path of a private key file, never the key.
struct HostRecord {
    std::string name;      // 1..64 of [A-Za-z0-9._-], not starting with '-'
    std::string address;   // a host name, an address or an ssh-config alias
    int port = 0;          // 0: not set (ssh config, else 22)
    std::string user;      // empty: not set (ssh config, else the local user)
    std::string identity;  // private key file; empty: ssh-agent, then the default ~/.ssh keys
    std::string lathectl;  // lathectl on the host; empty: the one on its PATH
    int slots = 1;         // how many runs it takes at once, 1..4096
    double addedAt = 0;    // seconds since the Unix epoch; addHost: 0 = now
};

class Store {
public:
    static constexpr int kSchemaVersion = 12;

    /// Opens or creates a workspace (the path is made absolute). Throws StoreError (file untouched) when the
    /// file is not a Lathe workspace or has a newer schema than this build knows.
    explicit Store(const std::string& path);
    ~Store();
    Store(const Store&) = delete;
    Store& operator=(const Store&) = delete;

    /// --db PATH, else $LATHE_DB, else $XDG_DATA_HOME/lathe/lathe.db (~/.local/share/...).
    static std::string resolvePath(const std::string& explicitPath = {});

    const std::string& path() const;
    int schemaVersion() const;
    /// This workspace's id: random, made with the file (schema 5), and written into every
    /// checkpoint of its runs so that a file of another workspace is refused by name.
    const std::string& workspaceId() const;
    /// The directory of this workspace's files, "<workspace file>-files" beside it (as SQLite's
    /// own -wal and -shm): run artifacts, model artifacts, deployment logs and locks. Two
    /// workspaces in one folder never share a file.
    std::string filesDir() const;
    static std::string filesDirFor(const std::string& workspacePath);
    /// filesDir()/artifacts/run-ID: the run's checkpoints and its lock.
    std::string artifactDir(int64_t runId) const;
    /// The file the process training or ingesting run `runId` holds an exclusive flock on, for
    /// as long as it records the run (training/record.cpp).
    std::string runLockPath(int64_t runId) const;

    // ---- writes: queued to the writer thread ------------------------------------------
    /// Synchronous: returns the new run's id.
    int64_t createRun(const std::string& experiment, const std::string& name, const std::string& model,
                      const std::string& data, const std::string& configToml,
                      const std::map<std::string, std::string>& params, const std::string& host);
    void setRunStatus(int64_t runId, RunStatus status, const std::string& error = {});
    /// A resumed run's config and params after flags such as --epochs changed them.
    void updateRunConfig(int64_t runId, const std::string& configToml,
                         const std::map<std::string, std::string>& params);
    void appendMetric(int64_t runId, const std::string& key, int64_t step, double wallTime, double value);
    void appendLog(int64_t runId, double wallTime, const std::string& level, const std::string& text);
    void addArtifact(int64_t runId, const std::string& kind, const std::string& path,
                     const std::string& sha256);
    /// Profile spans (op and phase) of a run; queued and batched like metric points.
    void appendSpan(int64_t runId, const ProfileSpan& span);
    /// Removes metric points and profile spans recorded after `step` (a resumed run replays
    /// those steps).
    void dropMetricsAfter(int64_t runId, int64_t step);
    /// Packs the series of these runs (those that have ended) for readSeries: a blob per series
    /// instead of a row per point. Runs pack themselves when they end; this is for runs recorded
    /// before workspaces had packs. Queued like the writes.
    void packSeries(const std::vector<int64_t>& runIds);
    /// Blocks until everything queued so far is committed. Rethrows a writer failure.
    void flush();
    /// Whether the writer has given up a batch since the last flush() (which will throw its
    /// error): a recorder checks this cheaply and stops instead of training on unrecorded.
    bool writeFailed() const;
    /// Caps the file at `pages` database pages from now on (SQLite's max_page_count on the
    /// writer's connection): writes that would grow it further fail as on a full disk. A quota,
    /// and how the tests make the disk "full".
    void setMaxPages(int64_t pages);

    // ---- hosts: synchronous, committed when they return ----------------------------------
    /// Throws ConfigError for a bad field (validateHostName; an empty address, one starting
    /// with '-' or with a space or control character, a port outside 0..65535, slots outside
    /// 1..4096) and StoreError when a host of that name already exists.
    void addHost(const HostRecord& host);
    /// Replaces everything but the name and addedAt. Throws as addHost, and StoreError when
    /// there is no host of that name.
    void updateHost(const HostRecord& host);
    /// Whether there was a host of that name.
    bool removeHost(const std::string& name);
    /// Throws ConfigError unless `name` is 1..64 characters of [A-Za-z0-9._-], not starting
    /// with '-' (it must never read as a flag, a path or a user@host).
    static void validateHostName(const std::string& name);

    // ---- reads -----------------------------------------------------------------------
    std::vector<RunRecord> listRuns() const;  // newest first
    std::optional<RunRecord> run(int64_t runId) const;
    std::map<std::string, std::string> params(int64_t runId) const;
    std::vector<std::string> metricKeys(int64_t runId) const;
    /// Points of one key ordered by step; only those with step > afterStep.
    std::vector<MetricPoint> metrics(int64_t runId, const std::string& key,
                                     int64_t afterStep = INT64_MIN) const;
    /// The last value of every key.
    std::map<std::string, double> lastMetrics(int64_t runId) const;
    /// One series handed out by readSeries, for drawing: its points ordered by step, in single
    /// precision (half the memory of 10 M points; steps above 2^24 lose their last bits), NaN
    /// where a value is missing.
    struct Series {
        int64_t runId = 0;
        std::string key;
        std::vector<float> steps;
        std::vector<float> values;
    };
    /// The series of many runs, read on read-only connections of their own to the workspace at
    /// `path`: for loaders off the GUI thread (the overlay of 1,000 runs), which then never wait
    /// on, nor hold up, a Store's own reads. Runs in the order given, keys by name; `wanted`
    /// picks keys; `each` takes one series at a time and returns false to stop. `keepGoing`
    /// (optional, called on the calling thread now and then with the share read so far, 0..1)
    /// returns false to stop early (a newer request superseded this one). A few series are read
    /// through the (key, step) index; a third or more of the workspace's series by scanning the
    /// table in parallel slices, which avoids a table lookup per point (4× fewer page visits).
    /// The series of runs that ended are read packed, a blob each (packSeries); the runs that
    /// had a series without a pack are added to `unpackedRuns` when given.
    /// Throws StoreError when the file cannot be opened or read.
    static void readSeries(const std::string& path, const std::vector<int64_t>& runIds,
                           const std::function<bool(const std::string& key)>& wanted,
                           const std::function<bool(Series&&)>& each,
                           const std::function<bool(double done)>& keepGoing = {},
                           std::vector<int64_t>* unpackedRuns = nullptr);
    /// The params of many runs, read as readSeries reads (runs without params are absent).
    static std::map<int64_t, std::map<std::string, std::string>> readParams(
        const std::string& path, const std::vector<int64_t>& runIds);
    /// The last value of `key` for every run that has one, in one query (runs lists).
    std::map<int64_t, double> lastMetricOfRuns(const std::string& key) const;
    std::vector<LogRecord> logs(int64_t runId) const;
    std::vector<ArtifactRecord> artifacts(int64_t runId) const;
    /// Number of profile spans recorded for a run (0: not profiled).
    int64_t profileSpanCount(int64_t runId) const;
    /// A run's profile spans ordered by start time; only steps in [fromStep, toStep].
    std::vector<ProfileSpan> profileSpans(int64_t runId, int64_t fromStep = 0,
                                          int64_t toStep = INT64_MAX) const;
    std::optional<HostRecord> host(const std::string& name) const;
    std::vector<HostRecord> hosts() const;  // ordered by name

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

}  // namespace lathe::core

#pragma once
// Versioned data sets (core/src/data/versions.cpp): `lathectl data add NAME PATH` snapshots a data
// set — an image folder, a CSV file or an IDX folder — as a manifest of every file's SHA-256 whose
// root hash is the version's id, and keeps the files in a content-addressed store in the
// workspace (<workspace>-files/data/objects, one copy of each distinct content across every
// version and data set, as DVC's cache). Versions are numbered per data set; one is current (the
// newest added, or where `rollback` moved it). A run's `data = "dataset:NAME[:V]"` resolves here,
// and the run records the exact version, so that lineage goes data version -> run -> model
// version -> deployments and back.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/run_spec.h"

namespace lathe::core {

/// One file of a version: its path relative to the data set's root ('/'-separated), content hash
/// (lower-case hex SHA-256), size and modification time when it was taken (nanoseconds).
struct DataFile {
    std::string path;
    std::string sha256;
    int64_t size = 0;
    int64_t mtimeNs = 0;
};

struct DataVersion {
    int64_t id = 0;  // row id in the workspace (runs refer to it)
    std::string name;
    int64_t version = 0;
    std::string rootHash;  // SHA-256 of the manifest: the version's id, the same on every machine
    std::string kind;      // "images" | "csv" | "idx"
    std::string source;    // the absolute path it was taken from
    int64_t files = 0;
    int64_t bytes = 0;
    double createdAt = 0;
    std::string message;
    bool current = false;
    std::string ref() const { return name + ":" + std::to_string(version); }
};

/// NAME (the current version) or NAME:V.
struct DataRef {
    std::string name;
    int64_t version = 0;  // 0: current
};
/// Parses NAME[:V]. Throws ConfigError naming what is wrong.
DataRef parseDataRef(const std::string& text);
/// Throws ConfigError unless `name` is a valid data set name (letters, digits, '.', '_', '-').
void checkDataSetName(const std::string& name);

/// What a data set at `path` is: "images" (a folder of class sub-folders holding .jpg/.jpeg/.png
/// files), "idx" (a folder with train-images-idx3-ubyte[.gz] and its labels) or "csv" (a .csv or
/// .csv.gz file). Throws ConfigError saying what was found instead.
std::string detectDataKind(const std::string& path);
/// Writes an example image folder into `dir` (new or empty): the built-in digits drawn at
/// `side` x `side` pixels, `perClass` (1..170) of each in 0/ .. 9/, JPEG and PNG alternating,
/// tinted and shifted per image. Returns the number of files. Throws ConfigError or DataError.
int64_t writeExampleImages(const std::string& dir, int perClass, int side);
/// Throws ConfigError unless `kind` is one of those, and `path` looks like one.
void checkDataKind(const std::string& kind, const std::string& path);

/// The files of the data set at `path` (a file, or every regular file under a folder, hidden
/// names skipped), sorted by path, each hashed with OpenSSL's SHA-256 on `threads` threads (0: one
/// per core). `progress(bytesDone, bytesTotal)` is called as hashing goes. Throws Error naming a
/// file that cannot be read.
std::vector<DataFile> scanDataFiles(const std::string& path, int threads = 0,
                                    const std::function<void(int64_t, int64_t)>& progress = {});
/// The root hash of a manifest: SHA-256 over "<sha256> <size> <path>\n" of each file in path
/// order (names and contents only: not where or when it was taken).
std::string manifestRootHash(const std::vector<DataFile>& files);

struct DataAddOptions {
    std::string kind;  // empty: detected
    std::string message;
    int threads = 0;
    std::function<void(int64_t, int64_t)> progress;  // bytes hashed / total, then bytes stored / total
};
struct DataAddResult {
    DataVersion version;
    bool created = false;     // false: the files are those of the current version already
    int64_t storedBytes = 0;  // new content written to the store (the rest was there already)
    int64_t storedFiles = 0;
    double hashSeconds = 0;
};
struct DataDiff {
    std::vector<std::string> added, removed, changed;
    bool empty() const { return added.empty() && removed.empty() && changed.empty(); }
};
struct DataVerifyReport {
    int64_t files = 0;
    std::vector<std::string> missing;  // a stored object is gone
    std::vector<std::string> corrupt;  // a stored object's bytes do not hash to its name
    bool ok() const { return missing.empty() && corrupt.empty(); }
};
/// A version against the folder it was taken from, as it is now.
struct DataSourceCheck {
    bool exists = true;
    DataDiff diff;  // changed: size or mtime differ (fast) or content differs (full)
    bool clean() const { return exists && diff.empty(); }
};
/// A run, model version or deployment in a lineage.
struct LineageRun {
    int64_t runId = 0;
    std::string name, status, data;
    int64_t dataVersionId = 0;
};
struct LineageModel {
    std::string name;
    int64_t version = 0;
    int64_t runId = 0;
    std::vector<std::string> aliases;
    std::vector<std::string> deployments;  // "live at URL since ..." / "v3 deployed ... ended ..."
};

/// The workspace's data sets. Opens (and migrates) the workspace as Store does; its own
/// connection, safe from one thread at a time.
class DataSets {
public:
    explicit DataSets(const std::string& workspacePath);
    ~DataSets();
    DataSets(const DataSets&) = delete;
    DataSets& operator=(const DataSets&) = delete;

    /// <workspace>-files/data: objects/ (the content store), checkouts/ (read-only trees of
    /// versions for training).
    std::string dataDir() const;

    /// Takes a new version of NAME from `path` (creating the data set), stores its files and
    /// makes it current. When the files are exactly the current version's, nothing is added
    /// (created = false). Throws ConfigError for a bad name, path or kind.
    DataAddResult add(const std::string& name, const std::string& path, const DataAddOptions& options = {});
    /// Every data set's current version, by name.
    std::vector<DataVersion> list() const;
    /// NAME's versions, oldest first. Throws NotFoundError for an unknown data set.
    std::vector<DataVersion> versions(const std::string& name) const;
    /// Throws NotFoundError (naming what exists) for an unknown data set or version.
    DataVersion resolve(const DataRef& ref) const;
    std::vector<DataFile> files(const DataVersion& v) const;
    DataDiff diff(const DataVersion& from, const DataVersion& to) const;
    /// Writes version `v`'s files under `dir` (which must not exist or be empty), byte for byte
    /// from the store, each checked against its hash. Throws Error naming a missing or corrupt one.
    void checkout(const DataVersion& v, const std::string& dir) const;
    /// Makes the version that was current before the current one current again (a second rollback
    /// undoes the first, as `kubectl rollout undo`). Returns the new current version. Throws
    /// ConfigError when there is nothing to go back to.
    DataVersion rollback(const std::string& name);
    /// Re-hashes every stored file of `v`.
    DataVerifyReport verify(const DataVersion& v) const;
    /// `v` against its source folder now: sizes and mtimes (fast), or contents (`full`).
    DataSourceCheck checkSource(const DataVersion& v, bool full) const;
    /// A read-only tree of `v` in the workspace (hard links into the store; copies across file
    /// systems), made once and reused: what training reads when the source folder moved on.
    std::string materialize(const DataVersion& v) const;

    /// Records that run `runId` trained on version `versionId`.
    void recordRunData(int64_t runId, int64_t versionId);
    /// The data set version run `runId` trained on (none for a run on plain data).
    std::optional<DataVersion> versionOfRun(int64_t runId) const;
    /// Runs that trained on `v`, and model versions registered from them (with deployments).
    std::vector<LineageRun> runsOn(const DataVersion& v) const;
    std::vector<LineageModel> modelsOf(const std::vector<LineageRun>& runs) const;

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

/// A run spec whose `data` is "dataset:NAME[:V]", made ready to train: `data` pinned to the exact
/// version ("dataset:NAME:V", as the run records it) in `recorded`, and the loader's source
/// ("idx:DIR", "csv:FILE", ...) in `used`. Reads the source folder when it is unchanged since the
/// version was taken (sizes and mtimes; contents too with `verify`), a read-only copy from the
/// store for a pinned older version or a source that is gone; refuses (ConfigError listing the
/// changed files) an unpinned data set whose folder changed. Other specs come back as they are.
struct BoundData {
    RunSpec recorded;
    RunSpec used;
    std::optional<DataVersion> version;
    std::string note;  // where the data is read from, for the run's log
};
BoundData bindDataSet(const RunSpec& spec, const std::string& workspacePath, bool verify = false);

}  // namespace lathe::core

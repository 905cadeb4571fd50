// Versioned data sets: manifests of SHA-256 hashes, a content-addressed store of the files, which
// version is current, and the version each run trained on. See lathe/core/data_versions.h.
#include "lathe/core/data_versions.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "data/images.h"
#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/registry.h"
#include "lathe/core/sha256.h"
#include "lathe/core/store.h"
#include "workspace/sqlite_util.h"

namespace fs = std::filesystem;

namespace lathe::core {
namespace {

constexpr size_t kChunk = 1 << 20;

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

bool endsWith(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool isImageName(const std::string& name) {
    const auto l = lower(name);
    return endsWith(l, ".jpg") || endsWith(l, ".jpeg") || endsWith(l, ".png");
}

bool isCsvName(const std::string& name) {
    const auto l = lower(name);
    return endsWith(l, ".csv") || endsWith(l, ".csv.gz");
}

bool hidden(const fs::path& p) {
    const auto n = p.filename().string();
    return !n.empty() && n[0] == '.';
}

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// Reads `path` whole in chunks, handing each to `sink`; returns the bytes read.
template <class Sink>
int64_t readChunks(const std::string& path, std::vector<char>& buf, Sink&& sink) {
    Fd in{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (in.fd < 0) throw Error("cannot read " + path + ": " + std::strerror(errno));
    int64_t total = 0;
    for (;;) {
        const ssize_t n = ::read(in.fd, buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            throw Error("cannot read " + path + ": " + std::strerror(errno));
        }
        if (n == 0) break;
        sink(buf.data(), static_cast<size_t>(n));
        total += n;
    }
    return total;
}

void writeAll(int fd, const char* p, size_t n, const std::string& path) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw Error("cannot write " + path + ": " + std::strerror(errno));
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

std::string randomSuffix() {
    std::random_device rd;
    return std::to_string(::getpid()) + "-" + std::to_string(rd());
}

// Copies `from` to `to` through a temporary name in its folder, hashing what it copies; returns
// the hash of the bytes written (the caller compares it with the one expected).
std::string copyHashed(const std::string& from, const std::string& to, std::vector<char>& buf, mode_t mode) {
    const std::string tmp = to + ".tmp-" + randomSuffix();
    Fd out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
    if (out.fd < 0) throw Error("cannot write " + tmp + ": " + std::strerror(errno));
    Sha256 h;
    try {
        readChunks(from, buf, [&](const char* p, size_t n) {
            h.update(p, n);
            writeAll(out.fd, p, n, tmp);
        });
        if (::fchmod(out.fd, mode) != 0 || ::close(out.fd) != 0) {
            out.fd = -1;
            throw Error("cannot write " + tmp + ": " + std::strerror(errno));
        }
        out.fd = -1;
        if (::rename(tmp.c_str(), to.c_str()) != 0)
            throw Error("cannot write " + to + ": " + std::strerror(errno));
    } catch (...) {
        ::unlink(tmp.c_str());
        throw;
    }
    return h.hex();
}

int threadCount(int threads, size_t work) {
    int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, std::min<int>(n, static_cast<int>(std::max<size_t>(work, 1))));
}

// Runs job(i) for i in [0, n) on `threads` threads, calling tick() about 5 times a second from
// this thread meanwhile; rethrows the first failure once all have stopped.
void parallelFor(size_t n, int threads, const std::function<void(size_t, std::vector<char>&)>& job,
                 const std::function<void()>& tick = {}) {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    std::mutex errorMutex;
    std::atomic<int> running{0};
    auto work = [&] {
        std::vector<char> buf(kChunk);
        for (;;) {
            const size_t i = next++;
            if (i >= n || failed) break;
            try {
                job(i, buf);
            } catch (...) {
                std::lock_guard<std::mutex> lk(errorMutex);
                if (!error) error = std::current_exception();
                failed = true;
            }
        }
        --running;
    };
    const int t = threadCount(threads, n);
    running = t;
    std::vector<std::thread> pool;
    for (int i = 0; i < t; ++i) pool.emplace_back(work);
    while (running > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (tick) tick();
    }
    for (auto& th : pool) th.join();
    if (error) std::rethrow_exception(error);
}

int64_t mtimeNs(const struct stat& st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

// The files of a data set with sizes and mtimes (no hashes), sorted by path.
std::vector<DataFile> listFiles(const std::string& path) {
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw ConfigError("no such file or folder: " + path);
    std::vector<DataFile> out;
    auto add = [&](const fs::path& p, const std::string& rel) {
        struct stat s {};
        if (::stat(p.c_str(), &s) != 0)
            throw Error("cannot read " + p.string() + ": " + std::strerror(errno));
        out.push_back({rel, {}, static_cast<int64_t>(s.st_size), mtimeNs(s)});
    };
    if (fs::is_regular_file(st)) {
        add(path, fs::path(path).filename().string());
        return out;
    }
    if (!fs::is_directory(st)) throw ConfigError(path + " is neither a file nor a folder");
    const fs::path root(path);
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::none, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (hidden(it->path())) {
            if (it->is_directory(ec)) it.disable_recursion_pending();
            continue;
        }
        if (it->is_symlink(ec) && it->is_directory(ec)) {
            it.disable_recursion_pending();  // never loops through a link to a parent
            continue;
        }
        if (!it->is_regular_file(ec)) continue;
        add(it->path(), it->path().lexically_relative(root).generic_string());
    }
    if (ec) throw Error("cannot list " + path + ": " + ec.message());
    std::sort(out.begin(), out.end(), [](const DataFile& a, const DataFile& b) { return a.path < b.path; });
    return out;
}

// A manifest path from the workspace must stay inside the folder it is written to.
void checkRelative(const std::string& rel) {
    const fs::path p(rel);
    bool ok = !rel.empty() && p.is_relative();
    for (const auto& part : p) ok = ok && part != ".." && part != ".";
    if (!ok) throw StoreError("data set manifest holds an unsafe path '" + rel + "'");
}

DataVersion readVersion(Stmt& s) {
    DataVersion v;
    v.id = s.i64(0);
    v.name = s.text(1);
    v.version = s.i64(2);
    v.rootHash = s.text(3);
    v.kind = s.text(4);
    v.source = s.text(5);
    v.files = s.i64(6);
    v.bytes = s.i64(7);
    v.createdAt = s.f64(8);
    v.message = s.text(9);
    v.current = s.i64(10) == v.version;
    return v;
}
constexpr const char* kVersionSelect =
    "SELECT v.id, d.name, v.version, v.root_hash, v.kind, v.source, v.files, v.bytes, v.created_at, "
    "v.message, d.current_version FROM dataset_versions v JOIN datasets d ON d.id = v.dataset_id ";

std::string listText(const std::vector<std::string>& items, size_t most = 8) {
    std::string out;
    for (size_t i = 0; i < items.size() && i < most; ++i) out += (i ? ", " : "") + items[i];
    if (items.size() > most) out += " and " + std::to_string(items.size() - most) + " more";
    return out;
}

}  // namespace

// ---- names and kinds ----------------------------------------------------------------------

void checkDataSetName(const std::string& name) { checkModelName(name, "data set name"); }

DataRef parseDataRef(const std::string& text) {
    DataRef r;
    const auto colon = text.find(':');
    r.name = text.substr(0, colon);
    checkDataSetName(r.name);
    if (colon != std::string::npos) {
        const auto v = text.substr(colon + 1);
        bool digits = !v.empty() && v.size() < 12;
        for (char c : v) digits = digits && std::isdigit(static_cast<unsigned char>(c));
        if (!digits || std::stoll(v) < 1)
            throw ConfigError("data set reference '" + text +
                              "': the version after ':' must be a number >= 1");
        r.version = std::stoll(v);
    }
    return r;
}

std::string detectDataKind(const std::string& path) {
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw ConfigError("no such file or folder: " + path);
    if (fs::is_regular_file(st)) {
        if (isCsvName(path)) return "csv";
        throw ConfigError(path +
                          " is a file but not a .csv or .csv.gz: a data set is a CSV file, an IDX folder or "
                          "an image folder (one sub-folder per class)");
    }
    if (!fs::is_directory(st)) throw ConfigError(path + " is neither a file nor a folder");
    const fs::path root(path);
    if (fs::exists(root / "train-images-idx3-ubyte") || fs::exists(root / "train-images-idx3-ubyte.gz"))
        return "idx";
    int classes = 0, images = 0;
    for (const auto& e : fs::directory_iterator(root, ec)) {
        if (hidden(e.path()) || !e.is_directory()) continue;
        bool any = false;
        for (const auto& f : fs::directory_iterator(e.path(), ec))
            if (f.is_regular_file() && isImageName(f.path().filename().string())) {
                any = true;
                ++images;
            }
        classes += any ? 1 : 0;
    }
    if (classes >= 1 && images >= 1) return "images";
    throw ConfigError(
        path +
        " is not a data set Lathe knows: an image folder has one sub-folder per class holding "
        ".jpg/.jpeg/.png files, an IDX folder has train-images-idx3-ubyte[.gz]; a CSV is a file");
}

void checkDataKind(const std::string& kind, const std::string& path) {
    if (kind != "images" && kind != "csv" && kind != "idx")
        throw ConfigError("--kind must be images, csv or idx (got '" + kind + "')");
    std::error_code ec;
    const bool dir = fs::is_directory(path, ec);
    if (kind == "csv" && dir) throw ConfigError("a csv data set is one file; " + path + " is a folder");
    if (kind != "csv" && !dir)
        throw ConfigError("an " + kind + " data set is a folder; " + path + " is not one");
}

// ---- manifests ------------------------------------------------------------------------------

std::vector<DataFile> scanDataFiles(const std::string& path, int threads,
                                    const std::function<void(int64_t, int64_t)>& progress) {
    auto files = listFiles(path);
    const bool single = fs::is_regular_file(path);
    int64_t total = 0;
    for (const auto& f : files) total += f.size;
    std::atomic<int64_t> done{0};
    parallelFor(
        files.size(), threads,
        [&](size_t i, std::vector<char>& buf) {
            const auto full = single ? path : (fs::path(path) / files[i].path).string();
            Sha256 h;
            const auto n = readChunks(full, buf, [&](const char* p, size_t k) {
                h.update(p, k);
                done += static_cast<int64_t>(k);
            });
            files[i].sha256 = h.hex();
            if (n != files[i].size) {
                files[i].size = n;  // it grew or shrank as we read: what was hashed counts
                struct stat s {};
                if (::stat(full.c_str(), &s) == 0) files[i].mtimeNs = mtimeNs(s);
            }
        },
        [&] {
            if (progress) progress(done.load(), total);
        });
    if (progress) progress(total, total);
    return files;
}

std::string manifestRootHash(const std::vector<DataFile>& files) {
    std::string text;
    for (const auto& f : files) text += f.sha256 + " " + std::to_string(f.size) + " " + f.path + "\n";
    return sha256Hex(text.data(), text.size());
}

// ---- the workspace's data sets -----------------------------------------------------------------

struct DataSets::Impl {
    std::string path;
    std::string dataDir;
    sqlite3* db = nullptr;
    mutable std::mutex mutex;

    ~Impl() {
        if (db) sqlite3_close_v2(db);
    }

    template <class F>
    auto write(F&& f) {
        return writeTransaction(db, std::forward<F>(f));
    }

    std::string objectPath(const std::string& sha) const {
        return (fs::path(dataDir) / "objects" / sha.substr(0, 2) / sha.substr(2)).string();
    }

    // Writes version `v`'s files (`list`) under `dir` from the store: hard links to the read-only
    // objects (`link`; a copy across file systems) or writable copies, each copy checked against
    // its hash.
    void writeTree(const DataVersion& v, const std::vector<DataFile>& list, const fs::path& dir,
                   bool link) const {
        const auto fail = [&](const DataFile& f, const std::string& what, const std::string& object) {
            return Error(v.ref() + ": the stored copy of " + f.path + " is " + what + " (" + object +
                         "); `lathectl data verify " + v.ref() + "` lists every file affected");
        };
        parallelFor(list.size(), 0, [&](size_t i, std::vector<char>& buf) {
            const auto& f = list[i];
            checkRelative(f.path);
            const auto object = objectPath(f.sha256);
            if (!fs::exists(object)) throw fail(f, "missing", object);
            const auto to = dir / f.path;
            fs::create_directories(to.parent_path());
            if (link) {
                std::error_code ec;
                fs::create_hard_link(object, to, ec);  // the object is read-only: so is the link
                if (!ec) return;
            }
            if (copyHashed(object, to.string(), buf, link ? 0444 : 0644) != f.sha256) {
                ::unlink(to.c_str());
                throw fail(f, "corrupt", object);
            }
        });
    }

    std::vector<DataVersion> query(const std::string& where, const std::function<void(Stmt&)>& bind) const {
        Stmt s(db, (std::string(kVersionSelect) + where).c_str());
        if (bind) bind(s);
        std::vector<DataVersion> out;
        while (s.step()) out.push_back(readVersion(s));
        return out;
    }

    std::vector<std::string> names() const {
        Stmt s(db, "SELECT name FROM datasets ORDER BY name");
        std::vector<std::string> out;
        while (s.step()) out.push_back(s.text(0));
        return out;
    }
};

DataSets::DataSets(const std::string& workspacePath) : d(std::make_unique<Impl>()) {
    {
        Store store(workspacePath);  // validates and migrates the file
        d->path = store.path();
    }
    d->dataDir = (fs::path(Store::filesDirFor(d->path)) / "data").string();
    d->db = openWorkspaceConnection(d->path);
}

DataSets::~DataSets() = default;

std::string DataSets::dataDir() const { return d->dataDir; }

DataAddResult DataSets::add(const std::string& name, const std::string& pathIn, const DataAddOptions& o) {
    checkDataSetName(name);
    std::error_code ec;
    const std::string path = fs::absolute(pathIn, ec).lexically_normal().string();
    if (ec || !fs::exists(path, ec)) throw ConfigError("no such file or folder: " + pathIn);
    std::string kind = o.kind;
    if (kind.empty())
        kind = detectDataKind(path);
    else
        checkDataKind(kind, path);
    if (fs::path(path).string().rfind(d->dataDir, 0) == 0)
        throw ConfigError(path + " is inside the workspace's data store; add the folder the data came from");

    DataAddResult result;
    const auto t0 = std::chrono::steady_clock::now();
    auto files = scanDataFiles(path, o.threads, o.progress);
    result.hashSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (files.empty()) throw ConfigError(path + " holds no files");
    const auto root = manifestRootHash(files);

    {
        std::lock_guard<std::mutex> lk(d->mutex);
        const auto current =
            d->query("WHERE d.name = ? AND v.version = d.current_version", [&](Stmt& s) { s.bind(1, name); });
        if (!current.empty() && current.front().rootHash == root) {
            result.version = current.front();
            return result;
        }
    }

    // The content first (a version is recorded only once every file of it is stored), each
    // object written once, through a temporary name, and read-only.
    const bool single = fs::is_regular_file(path);
    int64_t toStore = 0;
    std::vector<size_t> missing;
    {
        std::map<std::string, bool> seen;
        for (size_t i = 0; i < files.size(); ++i) {
            if (seen.count(files[i].sha256) || fs::exists(d->objectPath(files[i].sha256), ec)) continue;
            seen[files[i].sha256] = true;
            missing.push_back(i);
            toStore += files[i].size;
        }
    }
    std::atomic<int64_t> stored{0};
    parallelFor(
        missing.size(), o.threads,
        [&](size_t k, std::vector<char>& buf) {
            const auto& f = files[missing[k]];
            const auto object = d->objectPath(f.sha256);
            fs::create_directories(fs::path(object).parent_path());
            const auto from = single ? path : (fs::path(path) / f.path).string();
            const auto got = copyHashed(from, object, buf, 0444);
            if (got != f.sha256) {
                ::unlink(object.c_str());
                throw ConfigError(from +
                                  " changed while it was being added; add the data set again once it is "
                                  "not being written");
            }
            stored += f.size;
        },
        [&] {
            if (o.progress) o.progress(stored.load(), toStore);
        });
    result.storedBytes = toStore;
    result.storedFiles = static_cast<int64_t>(missing.size());

    int64_t bytes = 0;
    for (const auto& f : files) bytes += f.size;
    std::lock_guard<std::mutex> lk(d->mutex);
    const double now = nowSeconds();
    const int64_t id = d->write([&] {
        {
            Stmt s(d->db,
                   "INSERT OR IGNORE INTO datasets(name, current_version, created_at) VALUES(?, 0, ?)");
            s.bind(1, name).bind(2, now).run();
        }
        int64_t datasetId = 0, next = 1;
        {
            Stmt s(d->db,
                   "SELECT d.id, COALESCE(MAX(v.version), 0) + 1 FROM datasets d LEFT JOIN dataset_versions "
                   "v ON "
                   "v.dataset_id = d.id WHERE d.name = ? GROUP BY d.id");
            s.bind(1, name);
            if (!s.step()) throw StoreError("data set " + name + " vanished while being added");
            datasetId = s.i64(0);
            next = s.i64(1);
        }
        Stmt v(d->db,
               "INSERT INTO dataset_versions(dataset_id, version, root_hash, kind, source, files, bytes, "
               "created_at, "
               "message) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)");
        v.bind(1, datasetId)
            .bind(2, next)
            .bind(3, root)
            .bind(4, kind)
            .bind(5, path)
            .bind(6, static_cast<int64_t>(files.size()))
            .bind(7, bytes)
            .bind(8, now)
            .bind(9, o.message)
            .run();
        const int64_t versionId = sqlite3_last_insert_rowid(d->db);
        Stmt f(d->db,
               "INSERT INTO dataset_files(version_id, path, sha256, size, mtime_ns) VALUES(?, ?, ?, ?, ?)");
        for (const auto& file : files) {
            f.bind(1, versionId)
                .bind(2, file.path)
                .bind(3, file.sha256)
                .bind(4, file.size)
                .bind(5, file.mtimeNs);
            f.run();
        }
        Stmt c(d->db, "UPDATE datasets SET current_version = ? WHERE id = ?");
        c.bind(1, next).bind(2, datasetId).run();
        Stmt h(d->db, "INSERT INTO dataset_history(dataset_id, t, version, action) VALUES(?, ?, ?, 'add')");
        h.bind(1, datasetId).bind(2, now).bind(3, next).run();
        return versionId;
    });
    result.created = true;
    result.version = d->query("WHERE v.id = ?", [&](Stmt& s) { s.bind(1, id); }).at(0);
    return result;
}

std::vector<DataVersion> DataSets::list() const {
    std::lock_guard<std::mutex> lk(d->mutex);
    return d->query("WHERE v.version = d.current_version ORDER BY d.name", {});
}

std::vector<DataVersion> DataSets::versions(const std::string& name) const {
    checkDataSetName(name);
    std::lock_guard<std::mutex> lk(d->mutex);
    auto out = d->query("WHERE d.name = ? ORDER BY v.version", [&](Stmt& s) { s.bind(1, name); });
    if (out.empty()) {
        const auto known = d->names();
        throw NotFoundError("no data set '" + name + "' in this workspace" +
                            (known.empty() ? std::string(" (it has none yet: lathectl data add NAME PATH)")
                                           : " (it has: " + listText(known) + ")"));
    }
    return out;
}

DataVersion DataSets::resolve(const DataRef& ref) const {
    const auto all = versions(ref.name);
    for (const auto& v : all)
        if (ref.version == 0 ? v.current : v.version == ref.version) return v;
    throw NotFoundError("data set " + ref.name + " has no version " + std::to_string(ref.version) +
                        " (it has 1.." + std::to_string(all.back().version) + ")");
}

std::vector<DataFile> DataSets::files(const DataVersion& v) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db,
           "SELECT path, sha256, size, mtime_ns FROM dataset_files WHERE version_id = ? ORDER BY path");
    s.bind(1, v.id);
    std::vector<DataFile> out;
    while (s.step()) out.push_back({s.text(0), s.text(1), s.i64(2), s.i64(3)});
    return out;
}

DataDiff DataSets::diff(const DataVersion& from, const DataVersion& to) const {
    std::map<std::string, std::string> a, b;
    for (const auto& f : files(from)) a[f.path] = f.sha256;
    for (const auto& f : files(to)) b[f.path] = f.sha256;
    DataDiff out;
    for (const auto& [p, h] : b) {
        const auto it = a.find(p);
        if (it == a.end())
            out.added.push_back(p);
        else if (it->second != h)
            out.changed.push_back(p);
    }
    for (const auto& [p, h] : a)
        if (!b.count(p)) out.removed.push_back(p);
    return out;
}

void DataSets::checkout(const DataVersion& v, const std::string& dir) const {
    std::error_code ec;
    if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
        throw ConfigError(dir + " exists and is not an empty folder; check out into a new one");
    fs::create_directories(dir, ec);
    if (ec) throw ConfigError("cannot create " + dir + ": " + ec.message());
    d->writeTree(v, files(v), dir, false);
}

DataVersion DataSets::rollback(const std::string& name) {
    const auto all = versions(name);  // NotFoundError for an unknown name
    std::lock_guard<std::mutex> lk(d->mutex);
    const int64_t target = d->write([&] {
        Stmt s(d->db,
               "SELECT h.version, d.id, d.current_version FROM dataset_history h JOIN datasets d ON d.id = "
               "h.dataset_id WHERE d.name = ? ORDER BY h.id DESC");
        s.bind(1, name);
        int64_t datasetId = 0, current = 0, back = 0;
        while (s.step()) {
            datasetId = s.i64(1);
            current = s.i64(2);
            if (s.i64(0) != current) {
                back = s.i64(0);
                break;
            }
        }
        if (back == 0)
            throw ConfigError("data set " + name +
                              " has no earlier current version to roll back to (current: v" +
                              std::to_string(current) + ")");
        Stmt c(d->db, "UPDATE datasets SET current_version = ? WHERE id = ?");
        c.bind(1, back).bind(2, datasetId).run();
        Stmt h(d->db,
               "INSERT INTO dataset_history(dataset_id, t, version, action) VALUES(?, ?, ?, 'rollback')");
        h.bind(1, datasetId).bind(2, nowSeconds()).bind(3, back).run();
        return back;
    });
    for (auto v : all)
        if (v.version == target) {
            v.current = true;
            return v;
        }
    throw StoreError("data set " + name + " v" + std::to_string(target) + " vanished");
}

DataVerifyReport DataSets::verify(const DataVersion& v) const {
    const auto list = files(v);
    DataVerifyReport r;
    r.files = static_cast<int64_t>(list.size());
    std::mutex m;
    parallelFor(list.size(), 0, [&](size_t i, std::vector<char>& buf) {
        const auto& f = list[i];
        const auto object = d->objectPath(f.sha256);
        struct stat st {};
        if (::stat(object.c_str(), &st) != 0) {
            std::lock_guard<std::mutex> lk(m);
            r.missing.push_back(f.path);
            return;
        }
        Sha256 h;
        readChunks(object, buf, [&](const char* p, size_t n) { h.update(p, n); });
        if (h.hex() != f.sha256) {
            std::lock_guard<std::mutex> lk(m);
            r.corrupt.push_back(f.path);
        }
    });
    std::sort(r.missing.begin(), r.missing.end());
    std::sort(r.corrupt.begin(), r.corrupt.end());
    return r;
}

DataSourceCheck DataSets::checkSource(const DataVersion& v, bool full) const {
    DataSourceCheck c;
    std::error_code ec;
    if (!fs::exists(v.source, ec)) {
        c.exists = false;
        return c;
    }
    const auto now = full ? scanDataFiles(v.source) : listFiles(v.source);
    std::map<std::string, DataFile> was;
    for (auto& f : files(v)) was[f.path] = f;
    std::map<std::string, bool> seen;
    for (const auto& f : now) {
        seen[f.path] = true;
        const auto it = was.find(f.path);
        if (it == was.end())
            c.diff.added.push_back(f.path);
        else if (full ? f.sha256 != it->second.sha256
                      : (f.size != it->second.size || f.mtimeNs != it->second.mtimeNs))
            c.diff.changed.push_back(f.path);
    }
    for (const auto& [p, f] : was)
        if (!seen.count(p)) c.diff.removed.push_back(p);
    return c;
}

std::string DataSets::materialize(const DataVersion& v) const {
    const fs::path final = fs::path(d->dataDir) / "checkouts" / v.rootHash;
    std::error_code ec;
    if (fs::exists(final / ".lathe-complete", ec)) return final.string();
    fs::create_directories(final.parent_path(), ec);
    const fs::path tmp = final.parent_path() / (".tmp-" + v.rootHash.substr(0, 12) + "-" + randomSuffix());
    fs::create_directories(tmp, ec);
    if (ec) throw Error("cannot create " + tmp.string() + ": " + ec.message());
    try {
        d->writeTree(v, files(v), tmp, true);
        Fd done{::open((tmp / ".lathe-complete").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0444)};
        fs::rename(tmp, final, ec);
        if (ec) {  // another process made it meanwhile: theirs is as good
            fs::remove_all(tmp, ec);
            if (!fs::exists(final / ".lathe-complete", ec)) throw Error("cannot create " + final.string());
        }
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    return final.string();
}

void DataSets::recordRunData(int64_t runId, int64_t versionId) {
    std::lock_guard<std::mutex> lk(d->mutex);
    d->write([&] {
        Stmt s(d->db, "UPDATE runs SET data_version_id = ? WHERE id = ?");
        s.bind(1, versionId).bind(2, runId).run();
    });
}

std::optional<DataVersion> DataSets::versionOfRun(int64_t runId) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    auto out = d->query("WHERE v.id = (SELECT data_version_id FROM runs WHERE id = ?)",
                        [&](Stmt& s) { s.bind(1, runId); });
    if (out.empty()) return std::nullopt;
    return out.front();
}

std::vector<LineageRun> DataSets::runsOn(const DataVersion& v) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    Stmt s(d->db,
           "SELECT id, name, status, data, data_version_id FROM runs WHERE data_version_id = ? ORDER BY id");
    s.bind(1, v.id);
    std::vector<LineageRun> out;
    while (s.step()) out.push_back({s.i64(0), s.text(1), s.text(2), s.text(3), s.i64(4)});
    return out;
}

std::vector<LineageModel> DataSets::modelsOf(const std::vector<LineageRun>& runs) const {
    std::lock_guard<std::mutex> lk(d->mutex);
    std::vector<LineageModel> out;
    for (const auto& r : runs) {
        Stmt s(
            d->db,
            "SELECT m.name, v.version, m.id FROM model_versions v JOIN models m ON m.id = v.model_id WHERE "
            "v.run_id = ? ORDER BY m.name, v.version");
        s.bind(1, r.runId);
        while (s.step()) {
            LineageModel m{s.text(0), s.i64(1), r.runId, {}, {}};
            Stmt a(d->db,
                   "SELECT alias FROM model_aliases WHERE model_id = ? AND version = ? ORDER BY alias");
            a.bind(1, s.i64(2)).bind(2, m.version);
            while (a.step()) m.aliases.push_back(a.text(0));
            Stmt dep(d->db,
                     "SELECT url, target, action, started_at, ended_at FROM deployments WHERE model = ? AND "
                     "version = "
                     "? ORDER BY id");
            dep.bind(1, m.name).bind(2, m.version);
            while (dep.step()) {
                const std::string where =
                    dep.text(1) == "local" ? dep.text(0) : dep.text(0) + " (" + dep.text(1) + ")";
                m.deployments.push_back(dep.text(2) + " at " + where +
                                        (dep.isNull(4) ? ", live" : ", ended"));
            }
            out.push_back(std::move(m));
        }
    }
    return out;
}

// ---- runs ---------------------------------------------------------------------------------

int64_t writeExampleImages(const std::string& dir, int perClass, int side) {
    if (perClass < 1 || perClass > 170)
        throw ConfigError("--per-class must be 1..170 (got " + std::to_string(perClass) + ")");
    if (side < 8 || side > 4096)
        throw ConfigError("--side must be 8..4096 pixels (got " + std::to_string(side) + ")");
    std::error_code ec;
    if (fs::exists(dir, ec) && !fs::is_empty(dir, ec))
        throw ConfigError(dir + " is not empty: give a new or empty folder");
    return static_cast<int64_t>(data::writeDigitImages(dir, perClass, side).size());
}

BoundData bindDataSet(const RunSpec& spec, const std::string& workspacePath, bool verify) {
    BoundData b{spec, spec, std::nullopt, {}};
    if (spec.data.rfind("dataset:", 0) != 0) return b;
    const auto ref = parseDataRef(spec.data.substr(8));
    DataSets sets(workspacePath);
    const auto v = sets.resolve(ref);
    b.version = v;
    b.recorded.data = "dataset:" + v.ref();
    if (verify) {
        const auto report = sets.verify(v);
        if (!report.ok())
            throw ConfigError("dataset:" + v.ref() + "'s stored files do not check out (missing: " +
                              listText(report.missing) + "; corrupt: " + listText(report.corrupt) + ")");
    }
    const auto check = sets.checkSource(v, verify);
    std::string dir;
    if (check.clean()) {
        dir = v.source;
        b.note =
            "dataset:" + v.ref() + " (" + v.rootHash.substr(0, 12) + ") read from " + v.source +
            (verify ? ", every file's hash checked" : ", unchanged since it was taken (sizes and mtimes)");
    } else if (ref.version == 0 && check.exists) {
        std::vector<std::string> lines;
        for (const auto& p : check.diff.changed) lines.push_back("changed " + p);
        for (const auto& p : check.diff.added) lines.push_back("added " + p);
        for (const auto& p : check.diff.removed) lines.push_back("removed " + p);
        throw ConfigError("data set " + v.name + " v" + std::to_string(v.version) + " was taken from " +
                          v.source + ", whose files changed since (" + listText(lines) +
                          "): take a new version with `lathectl data add " + v.name + " " + v.source +
                          "`, or train on v" + std::to_string(v.version) +
                          " as it was taken with data = \"dataset:" + v.ref() + "\"");
    } else {
        dir = sets.materialize(v);
        b.note = "dataset:" + v.ref() + " (" + v.rootHash.substr(0, 12) +
                 ") read from the workspace's copy " + dir +
                 (check.exists ? " (its folder " + v.source + " changed since)"
                               : " (its folder " + v.source + " is gone)");
    }
    if (v.kind == "csv") {
        // One file: its name in the manifest.
        const auto list = sets.files(v);
        if (list.size() != 1) throw StoreError("csv data set " + v.ref() + " does not hold exactly one file");
        b.used.data =
            "csv:" + (fs::is_regular_file(dir) ? dir : (fs::path(dir) / list.front().path).string());
    } else {
        b.used.data = v.kind + ":" + dir;
    }
    return b;
}

}  // namespace lathe::core

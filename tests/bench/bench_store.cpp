// bench_store: workspace store ingest and read-back, measured side by side in one process.
//
//   (a) Store::appendMetric + flush(): N points over 8 keys through the batched writer thread.
//   (b) Baseline, like for like: raw sqlite3 inserting the same N rows in one transaction with
//       one prepared statement, same WAL + synchronous=NORMAL + foreign_keys settings and the
//       same metric table shape - the ceiling for an SQLite-backed writer. (a)/(b) shows what
//       the store's queue and writer thread cost (or save).
//   (c) Context only: raw sqlite3, one INSERT per transaction (autocommit), what a naive
//       writer does. Slow, so it is capped (default 20,000 rows) and reported as rows/s.
//       (a)/(c) is large because (c) commits every row, not because of anything the store does.
//   (d) Read-back: Store::metrics(run, key) of one key holding N points (default 1,000,000).
//
// Prints a table ending with the ratios (the like-for-like one first) and writes JSON to
// --out DIR/bench_store.json.
// Exits non-zero only when something is broken (an exception, a wrong point count or value,
// bad arguments), never because a ratio is low.
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lathe/core/store.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double peakRssMiB() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;  // Linux: KiB
}

struct Options {
    int64_t points = 1'000'000;  // (a): over `keys` keys
    int keys = 8;
    int64_t autocommitRows = 20'000;  // (c)
    int64_t readPoints = 1'000'000;   // (d): one key
    bool autocommit = true;           // (c)
    std::string out;
};

void usage() {
    std::cerr << "usage: bench_store [--points N] [--keys K] [--autocommit-rows N] [--read-points N]\n"
                 "                   [--no-autocommit] [--quick] [--out DIR]\n";
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
            return argv[++i];
        };
        if (a == "--points")
            o.points = std::stoll(next());
        else if (a == "--keys")
            o.keys = std::stoi(next());
        else if (a == "--autocommit-rows")
            o.autocommitRows = std::stoll(next());
        else if (a == "--read-points")
            o.readPoints = std::stoll(next());
        else if (a == "--no-autocommit")
            o.autocommit = false;
        else if (a == "--quick") {
            o.points = 200'000;
            o.autocommitRows = 5'000;
            o.readPoints = 200'000;
        } else if (a == "--out")
            o.out = next();
        else if (a == "-h" || a == "--help") {
            usage();
            std::exit(0);
        } else
            throw std::invalid_argument("unknown argument " + a);
    }
    if (o.points <= 0 || o.keys <= 0 || o.autocommitRows <= 0 || o.readPoints <= 0)
        throw std::invalid_argument("counts must be positive");
    return o;
}

void check(int rc, sqlite3* db, const char* what) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW)
        throw std::runtime_error(std::string(what) + ": " + sqlite3_errmsg(db));
}

void exec(sqlite3* db, const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
        std::string msg = err ? err : sqlite3_errmsg(db);
        sqlite3_free(err);
        throw std::runtime_error(std::string("sqlite: ") + msg + " in: " + sql);
    }
}

void removeDb(const std::string& path) {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path + suffix, ec);
}

// The store's metric table shape (metric_keys parent + metrics with its index), with the same
// connection settings the store's writer uses.
sqlite3* openRaw(const std::string& path, int keys) {
    removeDb(path);
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK)
        throw std::runtime_error("cannot open " + path);
    exec(db, "PRAGMA journal_mode=WAL");
    exec(db, "PRAGMA synchronous=NORMAL");
    exec(db, "PRAGMA foreign_keys=ON");
    exec(db,
         "CREATE TABLE metric_keys(id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, key TEXT NOT NULL,"
         " UNIQUE(run_id, key));"
         "CREATE TABLE metrics(key_id INTEGER NOT NULL REFERENCES metric_keys(id) ON DELETE CASCADE,"
         " step INTEGER NOT NULL, wall_time REAL NOT NULL, value REAL);"
         "CREATE INDEX metrics_by_key_step ON metrics(key_id, step);");
    for (int k = 0; k < keys; ++k) {
        const std::string sql = "INSERT INTO metric_keys(id, run_id, key) VALUES(" + std::to_string(k + 1) +
                                ", 1, 'key" + std::to_string(k) + "')";
        exec(db, sql.c_str());
    }
    return db;
}

// Inserts `rows` points round-robin over `keys` keys; one transaction per row unless `oneTxn`.
double rawInsert(const std::string& path, int keys, int64_t rows, bool oneTxn) {
    sqlite3* db = openRaw(path, keys);
    sqlite3_stmt* st = nullptr;
    check(sqlite3_prepare_v2(db, "INSERT INTO metrics(key_id, step, wall_time, value) VALUES(?,?,?,?)", -1,
                             &st, nullptr),
          db, "prepare");
    const auto t0 = Clock::now();
    if (oneTxn) exec(db, "BEGIN IMMEDIATE");
    for (int64_t i = 0; i < rows; ++i) {
        sqlite3_bind_int64(st, 1, i % keys + 1);
        sqlite3_bind_int64(st, 2, i / keys);
        sqlite3_bind_double(st, 3, 1.7e9 + i * 1e-3);
        sqlite3_bind_double(st, 4, std::sin(i * 1e-3));
        const int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE) {
            sqlite3_finalize(st);
            const std::string msg = sqlite3_errmsg(db);
            sqlite3_close_v2(db);
            throw std::runtime_error("raw insert failed: " + msg);
        }
        sqlite3_reset(st);
    }
    if (oneTxn) exec(db, "COMMIT");
    const double secs = secondsSince(t0);
    sqlite3_finalize(st);
    // Verify the rows landed.
    sqlite3_stmt* cnt = nullptr;
    check(sqlite3_prepare_v2(db, "SELECT count(*) FROM metrics", -1, &cnt, nullptr), db, "prepare count");
    check(sqlite3_step(cnt), db, "count");
    const int64_t n = sqlite3_column_int64(cnt, 0);
    sqlite3_finalize(cnt);
    sqlite3_close_v2(db);
    removeDb(path);
    if (n != rows)
        throw std::runtime_error("raw insert: expected " + std::to_string(rows) + " rows, found " +
                                 std::to_string(n));
    return secs;
}

std::string fmtRate(double r) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%12.0f", r);
    return buf;
}

}  // namespace

int main(int argc, char** argv) {
    Options opt;
    try {
        opt = parse(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "bench_store: " << e.what() << "\n";
        usage();
        return 2;
    }

    try {
        const fs::path dir = fs::temp_directory_path() / ("lathe-bench-store-" + std::to_string(getpid()));
        fs::create_directories(dir);
        struct Cleanup {
            fs::path d;
            ~Cleanup() {
                std::error_code ec;
                fs::remove_all(d, ec);
            }
        } cleanup{dir};

        std::vector<std::string> keyNames;
        for (int k = 0; k < opt.keys; ++k) keyNames.push_back("train/metric" + std::to_string(k));

        std::printf("bench_store: sqlite %s, temp dir %s\n", sqlite3_libversion(), dir.c_str());
        std::fflush(stdout);

        // ---- (a) Store ingest: appendMetric + flush ---------------------------------------
        double ingestSecs = 0, enqueueSecs = 0, rssAfterIngest = 0;
        const double rssBefore = peakRssMiB();
        {
            lathe::core::Store store((dir / "store-ingest.db").string());
            const int64_t run = store.createRun("bench", "ingest", "mlp", "synthetic", "", {}, "bench");
            store.flush();
            const auto t0 = Clock::now();
            for (int64_t i = 0; i < opt.points; ++i)
                store.appendMetric(run, keyNames[i % opt.keys], i / opt.keys, 1.7e9 + i * 1e-3,
                                   std::sin(i * 1e-3));
            enqueueSecs = secondsSince(t0);
            store.flush();
            ingestSecs = secondsSince(t0);
            rssAfterIngest = peakRssMiB();
            // Verify: every key holds its share, values intact.
            int64_t total = 0;
            for (int k = 0; k < opt.keys; ++k)
                total += static_cast<int64_t>(store.metrics(run, keyNames[k]).size());
            if (total != opt.points)
                throw std::runtime_error("store ingest: expected " + std::to_string(opt.points) +
                                         " points, read " + std::to_string(total));
        }

        // ---- (b) baseline: raw sqlite3, the same rows in one transaction -------------------
        const double baseSecs = rawInsert((dir / "raw-onetxn.db").string(), opt.keys, opt.points, true);

        // ---- (c) context: raw sqlite3, one row per transaction ----------------------------
        double autoSecs = 0;
        if (opt.autocommit)
            autoSecs = rawInsert((dir / "raw-autocommit.db").string(), opt.keys, opt.autocommitRows, false);

        // ---- (d) read-back of one key holding readPoints points ---------------------------
        double readSecs = 0, fillSecs = 0;
        {
            lathe::core::Store store((dir / "store-read.db").string());
            const int64_t run = store.createRun("bench", "readback", "mlp", "synthetic", "", {}, "bench");
            const auto t0 = Clock::now();
            for (int64_t i = 0; i < opt.readPoints; ++i)
                store.appendMetric(run, "train/loss", i, 1.7e9 + i * 1e-3, 1.0 / (1.0 + i));
            store.flush();
            fillSecs = secondsSince(t0);

            const auto t1 = Clock::now();
            const auto pts = store.metrics(run, "train/loss");
            readSecs = secondsSince(t1);
            if (static_cast<int64_t>(pts.size()) != opt.readPoints)
                throw std::runtime_error("read-back: expected " + std::to_string(opt.readPoints) +
                                         " points, got " + std::to_string(pts.size()));
            for (int64_t i : {int64_t{0}, opt.readPoints / 2, opt.readPoints - 1}) {
                const auto& p = pts[static_cast<size_t>(i)];
                if (p.step != i || p.value != 1.0 / (1.0 + i))
                    throw std::runtime_error("read-back: wrong point at step " + std::to_string(i));
            }
        }

        const double storeRate = opt.points / ingestSecs;
        const double baseRate = opt.points / baseSecs;
        const double autoRate = opt.autocommit ? opt.autocommitRows / autoSecs : 0;
        const double fillRate = opt.readPoints / fillSecs;
        const double readRate = opt.readPoints / readSecs;
        const double ratio = storeRate / baseRate;
        const double ratioAuto = opt.autocommit ? storeRate / autoRate : 0;

        std::printf("\n%-58s %10s %9s %12s\n", "case", "points", "seconds", "points/s");
        std::printf("%s\n", std::string(92, '-').c_str());
        auto row = [](const char* name, int64_t n, double s) {
            std::printf("%-58s %10lld %9.3f %s\n", name, static_cast<long long>(n), s,
                        fmtRate(n / s).c_str());
        };
        char label[128];
        std::snprintf(label, sizeof label, "(a) Store::appendMetric + flush, %d keys", opt.keys);
        row(label, opt.points, ingestSecs);
        std::printf("    (enqueue alone %.3f s; peak RSS %.0f MiB, %.0f MiB before)\n", enqueueSecs,
                    rssAfterIngest, rssBefore);
        row("(b) baseline: raw sqlite3, all rows in 1 transaction", opt.points, baseSecs);
        if (opt.autocommit)
            row("(c) context: raw sqlite3, 1 row per transaction", opt.autocommitRows, autoSecs);
        row("    Store ingest of the read-back key (1 key)", opt.readPoints, fillSecs);
        row("(d) read-back: Store::metrics(run, key)", opt.readPoints, readSecs);
        std::printf("%s\n", std::string(92, '-').c_str());
        std::printf("ratio (a)/(b)  Store ingest vs raw sqlite3, 1 transaction (like for like): %8.2fx\n",
                    ratio);
        if (opt.autocommit)
            std::printf("ratio (a)/(c)  context: vs raw sqlite3, 1 row per transaction         : %8.2fx\n",
                        ratioAuto);
        std::printf("read-back of %lld points                        : %8.1f ms (%.0f points/s)\n",
                    static_cast<long long>(opt.readPoints), readSecs * 1e3, readRate);

        nlohmann::json j;
        j["name"] = "bench_store";
        j["sqlite_version"] = sqlite3_libversion();
        j["config"] = {{"points", opt.points},
                       {"keys", opt.keys},
                       {"autocommit_rows", opt.autocommitRows},
                       {"read_points", opt.readPoints}};
        j["store_ingest"] = {{"points", opt.points},           {"seconds", ingestSecs},
                             {"enqueue_seconds", enqueueSecs}, {"points_per_s", storeRate},
                             {"peak_rss_mib", rssAfterIngest}, {"peak_rss_before_mib", rssBefore}};
        j["baseline_single_txn"] = {{"rows", opt.points}, {"seconds", baseSecs}, {"rows_per_s", baseRate}};
        if (opt.autocommit)
            j["context_autocommit"] = {
                {"rows", opt.autocommitRows}, {"seconds", autoSecs}, {"rows_per_s", autoRate}};
        j["readback"] = {{"points", opt.readPoints},
                         {"seconds", readSecs},
                         {"points_per_s", readRate},
                         {"fill_seconds", fillSecs},
                         {"fill_points_per_s", fillRate}};
        j["ratios"] = {{"store_vs_single_txn", ratio}};
        if (opt.autocommit) j["ratios"]["store_vs_autocommit"] = ratioAuto;

        if (!opt.out.empty()) {
            fs::create_directories(opt.out);
            const fs::path file = fs::path(opt.out) / "bench_store.json";
            std::ofstream f(file);
            f << j.dump(2) << "\n";
            if (!f) throw std::runtime_error("cannot write " + file.string());
            std::printf("results: %s\n", file.c_str());
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_store: FAILED: %s\n", e.what());
        return 1;
    }
}

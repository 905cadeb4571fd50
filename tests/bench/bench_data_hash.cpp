// bench_data_hash: how fast `lathectl data add` hashes a data set, against coreutils' sha256sum
// on the same files, side by side in one run (the files in the page cache for every measure).
//
//   (a) scanDataFiles on one thread per core (what `data add` does), and on one thread;
//   (b) baselines: `sha256sum` over every file in one process (what a script does), and
//       `xargs -P CORES sha256sum` (the same, on every core);
//   (c) context: a whole `data add` into a fresh workspace (hash, then store every file), and a
//       second `data add` of the same files (hash only: nothing to store).
// Two file mixes: large files (images of a video data set, shards) and many small ones (a JPEG
// folder). Reps alternate the order; the median is kept. Prints MB/s and the ratios, and writes
// JSON to --out DIR/bench_data_hash.json. Fails only when something is broken (the hashes differ
// from sha256sum's, an exception), never because a ratio is low.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.h"
#include "lathe/core/data_versions.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using lathe::core::DataSets;
using lathe::core::scanDataFiles;

namespace {

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// `count` files of `size` bytes of random data under dir/class-k/.
int64_t makeFiles(const fs::path& dir, int count, size_t size, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> buf((size + 7) / 8);
    for (int i = 0; i < count; ++i) {
        for (auto& w : buf) w = rng();
        const auto sub = dir / ("class-" + std::to_string(i % 10));
        fs::create_directories(sub);
        std::ofstream(sub / ("f" + std::to_string(i) + ".jpg"), std::ios::binary)
            .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(size));
    }
    return static_cast<int64_t>(count) * static_cast<int64_t>(size);
}

std::string run(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run " + cmd);
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    if (::pclose(p) != 0) throw std::runtime_error("failed: " + cmd);
    return out;
}

struct Mix {
    std::string name;
    int files;
    size_t size;
};

}  // namespace

int main(int argc, char** argv) {
    const auto args = lathe::test::benchArgs(argc, argv);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int reps = args.quick ? 3 : 5;
    const std::vector<Mix> mixes =
        args.quick ? std::vector<Mix>{{"large", 48, 4 << 20}, {"small", 3000, 24 << 10}}
                   : std::vector<Mix>{{"large", 128, 8 << 20}, {"small", 12000, 24 << 10}};
    const fs::path tmp = fs::temp_directory_path() / ("lathe-bench-hash-" + std::to_string(::getpid()));
    nlohmann::json results = nlohmann::json::object();
    int status = 0;
    try {
        std::printf("data add hashing vs sha256sum (%d cores, median of %d, files in the page cache)\n",
                    cores, reps);
        std::printf("%-6s %7s %9s | %12s %12s | %12s %12s | %10s %10s | %8s %8s\n", "files", "count", "MB",
                    "lathe MB/s", "lathe 1 thr", "sha256sum", "xargs -P", "add MB/s", "re-add s", "vs 1proc",
                    "vs -P");
        for (const auto& mix : mixes) {
            const auto dir = tmp / mix.name;
            const int64_t bytes = makeFiles(dir, mix.files, mix.size, 7);
            const double mb = static_cast<double>(bytes) / 1e6;
            // Correctness first: our hashes are sha256sum's.
            const auto ours = scanDataFiles(dir.string(), 0);
            std::map<std::string, std::string> theirs;
            {
                const auto text =
                    run("cd '" + dir.string() + "' && find . -type f -print0 | xargs -0 sha256sum");
                std::istringstream in(text);
                std::string hash, path;
                while (in >> hash >> path) theirs[path.substr(2)] = hash;
            }
            for (const auto& f : ours)
                if (theirs[f.path] != f.sha256)
                    throw std::runtime_error("hash of " + f.path + " differs from sha256sum's");
            std::vector<double> all, one, sum1, sumP;
            const std::string find = "find '" + dir.string() + "' -type f -print0 | xargs -0 ";
            for (int r = 0; r < reps; ++r) {
                auto measure = [&](int which) {
                    const auto t0 = Clock::now();
                    if (which == 0) scanDataFiles(dir.string(), 0);
                    if (which == 1) scanDataFiles(dir.string(), 1);
                    if (which == 2) run(find + "sha256sum > /dev/null");
                    if (which == 3)  // about four batches per core, so that every core gets work
                        run(find + "-P " + std::to_string(cores) + " -n " +
                            std::to_string(std::max(1, mix.files / (4 * cores))) + " sha256sum > /dev/null");
                    const double s = secondsSince(t0);
                    (which == 0 ? all : which == 1 ? one : which == 2 ? sum1 : sumP).push_back(s);
                };
                for (int k = 0; k < 4; ++k) measure((k + r) % 4);
            }
            // A whole add (hash + store) into a fresh workspace, then the same files again.
            double addS = 0, readdS = 0;
            {
                const auto ws = tmp / (mix.name + "-ws") / "lathe.db";
                fs::create_directories(ws.parent_path());
                DataSets sets(ws.string());
                auto t0 = Clock::now();
                const auto first = sets.add("bench", dir.string(), {});
                addS = secondsSince(t0);
                t0 = Clock::now();
                const auto second = sets.add("bench", dir.string(), {});
                readdS = secondsSince(t0);
                if (!first.created || second.created || first.storedFiles != mix.files)
                    throw std::runtime_error("data add stored the wrong files");
            }
            const double a = mb / median(all), o = mb / median(one), s1 = mb / median(sum1),
                         sp = mb / median(sumP);
            std::printf("%-6s %7d %9.0f | %12.0f %12.0f | %12.0f %12.0f | %10.0f %10.2f | %7.2fx %7.2fx\n",
                        mix.name.c_str(), mix.files, mb, a, o, s1, sp, mb / addS, readdS, a / s1, a / sp);
            results[mix.name] = {{"files", mix.files},
                                 {"mb", mb},
                                 {"lathe_mb_s", a},
                                 {"lathe_one_thread_mb_s", o},
                                 {"sha256sum_mb_s", s1},
                                 {"sha256sum_parallel_mb_s", sp},
                                 {"add_mb_s", mb / addS},
                                 {"readd_s", readdS},
                                 {"ratio_vs_sha256sum", a / s1},
                                 {"ratio_one_thread_vs_sha256sum", o / s1},
                                 {"ratio_vs_parallel_sha256sum", a / sp}};
        }
        std::printf(
            "ratios: lathe (all cores) / sha256sum (one process), and / xargs -P %d sha256sum; "
            "'lathe 1 thr' against sha256sum is the per-core comparison\n",
            cores);
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "bench_data_hash: %s\n", ex.what());
        status = 1;
    }
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (!args.out.empty() && status == 0) {
        fs::create_directories(args.out);
        std::ofstream(fs::path(args.out) / "bench_data_hash.json") << results.dump(2) << "\n";
    }
    return status;
}

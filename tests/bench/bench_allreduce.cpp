// bench_allreduce: gradient exchange through Lathe's reducer on 2 local ranks (Gloo over
// loopback), per compression mode, against the plain fp32 Gloo all-reduce in the same run:
// time, bus bandwidth and bytes on the wire for 1, 10 and 100 MB gradients.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "distributed/reducer.h"

using Clock = std::chrono::steady_clock;
using namespace lathe::core;

namespace {

struct Row {
    std::string mode;
    double mb = 0, ms = 0, busGBs = 0, wireRatio = 1;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int runRank(int rank, int port, bool quick, const std::string& out) {
    DistEnv env;
    env.rank = rank;
    env.worldSize = 2;
    env.masterPort = port;
    env.timeoutSec = 60;
    DistContext ctx(env);
    torch::set_num_threads(1);
    std::vector<Row> rows;
    const std::vector<double> sizes = quick ? std::vector<double>{1, 10} : std::vector<double>{1, 10, 100};
    for (double mb : sizes) {
        const auto n = static_cast<int64_t>(mb * 1024 * 1024 / 4);
        const int reps = mb >= 100 ? 3 : (mb >= 10 ? 5 : 15);
        for (const char* mode : {"gloo fp32", "none", "fp16", "bf16", "int8", "int4"}) {
            std::vector<double> times;
            double ratio = 1.0;
            if (std::string(mode) == "gloo fp32") {
                auto t = torch::randn({n});
                for (int r = 0; r < reps; ++r) {
                    ctx.any(false);  // line the ranks up
                    const auto t0 = Clock::now();
                    ctx.allreduceSum(t);
                    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
                }
            } else {
                // The reducer path: hooks fill the bucket during a (trivial) backward and, for
                // "none", start the all-reduce there; timed from before backward, less the same
                // backward without hooks.
                auto p = torch::randn({n}).requires_grad_(true);
                auto q = torch::randn({n}).requires_grad_(true);
                CompressOptions c;
                c.format = mode;
                c.errorFeedback = c.format == "int8" || c.format == "int4";
                Reducer red(ctx, {p}, mb + 1, c);  // one bucket
                std::vector<double> backwardOnly;
                for (int r = 0; r < reps; ++r) {
                    q.mutable_grad() = torch::Tensor();
                    const auto b0 = Clock::now();
                    (q * 1.0f).sum().backward();
                    backwardOnly.push_back(
                        std::chrono::duration<double, std::milli>(Clock::now() - b0).count());
                }
                const double bwd = median(backwardOnly);
                for (int r = 0; r < reps; ++r) {
                    ctx.any(false);
                    red.prepare(r);
                    p.mutable_grad() = torch::Tensor();
                    const auto t0 = Clock::now();
                    (p * 1.0f).sum().backward();
                    const auto stats = red.finish();
                    times.push_back(std::max(
                        0.0, std::chrono::duration<double, std::milli>(Clock::now() - t0).count() - bwd));
                    ratio = stats.compressionRatio;
                }
            }
            const double ms = median(times);
            rows.push_back(
                {mode, mb, ms, 2.0 * (2 - 1) / 2 * mb * 1024 * 1024 / 4 * 4 / (ms / 1000) / 1e9, ratio});
        }
    }
    if (rank != 0) return 0;
    std::printf("bench_allreduce: 2 ranks on loopback (Gloo), median of several exchanges\n");
    std::printf("%-10s %8s %10s %12s %10s %12s\n", "mode", "MB", "ms", "bus GB/s", "wire x", "vs fp32");
    std::string json = "[";
    for (const auto& r : rows) {
        double base = 0;
        for (const auto& b : rows)
            if (b.mb == r.mb && b.mode == "gloo fp32") base = b.ms;
        std::printf("%-10s %8.0f %10.3f %12.3f %10.2f %11.2fx\n", r.mode.c_str(), r.mb, r.ms, r.busGBs,
                    r.wireRatio, base / r.ms);
        json += std::string(json.size() > 1 ? "," : "") + "{\"mode\":\"" + r.mode +
                "\",\"mb\":" + std::to_string(r.mb) + ",\"ms\":" + std::to_string(r.ms) +
                ",\"wire_ratio\":" + std::to_string(r.wireRatio) + "}";
    }
    std::printf(
        "(vs fp32: the plain Gloo all-reduce's time / this mode's time; wire x: fp32 ring bytes / bytes "
        "sent)\n");
    if (!out.empty()) std::ofstream(out + "/bench_allreduce.json") << json << "]\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const auto [out, quick] = lathe::test::benchArgs(argc, argv);
    const int port = 20000 + static_cast<int>(getpid() % 20000);
    std::vector<pid_t> kids;
    for (int rank = 0; rank < 2; ++rank) {
        const pid_t pid = fork();
        if (pid == 0) {
            try {
                const int rc = runRank(rank, port, quick, out);
                std::fflush(stdout);  // _Exit skips stdio flushing
                std::_Exit(rc);
            } catch (const std::exception& ex) {
                std::fprintf(stderr, "rank %d: %s\n", rank, ex.what());
                std::_Exit(1);
            }
        }
        kids.push_back(pid);
    }
    int failed = 0;
    for (pid_t k : kids) {
        int status = 0;
        waitpid(k, &status, 0);
        failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

// bench_allreduce: gradient exchange through Lathe's reducer on 2 local ranks (Gloo over
// loopback), per compression mode, against the plain fp32 Gloo all-reduce in the same run:
// time, bus bandwidth and bytes on the wire for 1, 10 and 100 MB gradients.
//
// Bytes on the wire are measured, not computed: Gloo's TCP transport writes every message with
// writev(2), so the growth of this process's write count (/proc/self/io wchar) across one
// exchange is what rank 0 handed to its sockets, Gloo's message headers included. The measured
// ratio is the plain fp32 all-reduce's bytes over the mode's bytes. Next to it: the bytes the
// reducer accounts for (Reducer::Stats::bytesSent, the comm/bytes_sent metric) and the ratio it
// reports (comm/compression_ratio), which the measurement checks.
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
    double accountedBytes = -1;  // Reducer::Stats::bytesSent (-1: the plain Gloo all-reduce)
    double measuredBytes = -1;   // median wchar growth per exchange (-1: not available)
};

// Bytes this process has passed to write(2)/writev(2) so far (the "wchar" line of
// /proc/self/io, summed over its threads), or -1 where the kernel does not provide it.
long long writtenBytes() {
    std::ifstream f("/proc/self/io");
    std::string key;
    long long value = 0;
    while (f >> key >> value)
        if (key == "wchar:") return value;
    return -1;
}

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
            std::vector<double> times, written;
            double ratio = 1.0, accounted = -1;
            const bool measured = writtenBytes() >= 0;
            if (std::string(mode) == "gloo fp32") {
                auto t = torch::randn({n});
                for (int r = 0; r < reps; ++r) {
                    ctx.any(false);  // line the ranks up
                    const long long w0 = measured ? writtenBytes() : 0;
                    const auto t0 = Clock::now();
                    ctx.allreduceSum(t);
                    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
                    if (measured) written.push_back(static_cast<double>(writtenBytes() - w0));
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
                // As the trainer runs it: zero_grad() keeps the gradients, backward adds into them.
                auto zeroGrad = [](torch::Tensor& t) {
                    if (t.grad().defined()) t.mutable_grad().zero_();
                };
                std::vector<double> backwardOnly;
                for (int r = 0; r < reps; ++r) {
                    zeroGrad(q);
                    const auto b0 = Clock::now();
                    (q * 1.0f).sum().backward();
                    backwardOnly.push_back(
                        std::chrono::duration<double, std::milli>(Clock::now() - b0).count());
                }
                const double bwd = median(backwardOnly);
                for (int r = 0; r < reps; ++r) {
                    ctx.any(false);
                    red.prepare(r);
                    zeroGrad(p);
                    const long long w0 = measured ? writtenBytes() : 0;
                    const auto t0 = Clock::now();
                    (p * 1.0f).sum().backward();
                    const auto stats = red.finish();
                    times.push_back(std::max(
                        0.0, std::chrono::duration<double, std::milli>(Clock::now() - t0).count() - bwd));
                    if (measured) written.push_back(static_cast<double>(writtenBytes() - w0));
                    ratio = stats.compressionRatio;
                    accounted = static_cast<double>(stats.bytesSent);
                }
            }
            const double ms = median(times);
            rows.push_back({mode, mb, ms, 2.0 * (2 - 1) / 2 * mb * 1024 * 1024 / 4 * 4 / (ms / 1000) / 1e9,
                            ratio, accounted, written.empty() ? -1.0 : median(written)});
        }
    }
    // The reducer's own cost, fp32: Reducer::finish() without overlap (the gradient already in
    // place, as backward leaves it) against the plain all-reduce of the same bytes, in alternated
    // pairs so that both see the same machine.
    struct Cost {
        double mb, glooMs, reducerMs, pairRatio;
    };
    std::vector<Cost> costs;
    for (double mb : sizes) {
        const auto n = static_cast<int64_t>(mb * 1024 * 1024 / 4);
        const int pairs = mb >= 100 ? 7 : (mb >= 10 ? 15 : 41);
        auto t = torch::randn({n});
        auto p = torch::randn({n}).requires_grad_(true);
        const auto g = torch::randn({n});
        CompressOptions c;
        Reducer red(ctx, {p}, mb + 1, c, {}, /*overlap=*/false);
        p.mutable_grad() = g.clone();
        red.prepare(0);
        red.finish();  // warm: from here on the gradient is the bucket's memory
        std::vector<double> gloo, reducer, ratios;
        for (int r = 0; r < pairs; ++r) {
            double ms[2] = {0, 0};
            for (int half = 0; half < 2; ++half) {
                const bool plain = (half == 0) == (r % 2 == 0);  // ABBA...: neither always goes first
                if (plain) {
                    t.copy_(g);
                } else {
                    torch::NoGradGuard noGrad;
                    p.mutable_grad().copy_(g);
                    red.prepare(r + 1);
                }
                ctx.any(false);
                const auto t0 = Clock::now();
                if (plain)
                    ctx.allreduceSum(t);
                else
                    red.finish();
                ms[plain ? 0 : 1] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            }
            gloo.push_back(ms[0]);
            reducer.push_back(ms[1]);
            ratios.push_back(ms[1] / ms[0]);
        }
        costs.push_back({mb, median(gloo), median(reducer), median(ratios)});
    }
    if (rank != 0) return 0;
    std::printf(
        "bench_allreduce: 2 ranks on loopback (Gloo), median of several exchanges; bytes sent by rank 0\n");
    std::printf("%-10s %6s %9s %9s %9s %13s %8s %13s %9s\n", "mode", "MB", "ms", "bus GB/s", "vs fp32",
                "measured B", "wire x", "accounted B", "stated x");
    std::string json = "[";
    for (const auto& r : rows) {
        double base = 0, baseBytes = -1;
        for (const auto& b : rows)
            if (b.mb == r.mb && b.mode == "gloo fp32") {
                base = b.ms;
                baseBytes = b.measuredBytes;
            }
        const double measuredRatio = baseBytes > 0 && r.measuredBytes > 0 ? baseBytes / r.measuredBytes : -1;
        char measuredCol[32] = "n/a", ratioCol[32] = "n/a", accountedCol[32] = "-", statedCol[32] = "-";
        if (r.measuredBytes >= 0) std::snprintf(measuredCol, sizeof measuredCol, "%.0f", r.measuredBytes);
        if (measuredRatio > 0) std::snprintf(ratioCol, sizeof ratioCol, "%.2f", measuredRatio);
        if (r.accountedBytes >= 0) {
            std::snprintf(accountedCol, sizeof accountedCol, "%.0f", r.accountedBytes);
            std::snprintf(statedCol, sizeof statedCol, "%.2f", r.wireRatio);
        }
        std::printf("%-10s %6.0f %9.3f %9.3f %8.2fx %13s %8s %13s %9s\n", r.mode.c_str(), r.mb, r.ms,
                    r.busGBs, base / r.ms, measuredCol, ratioCol, accountedCol, statedCol);
        json += std::string(json.size() > 1 ? "," : "") + "{\"mode\":\"" + r.mode +
                "\",\"mb\":" + std::to_string(r.mb) + ",\"ms\":" + std::to_string(r.ms) +
                ",\"measured_bytes\":" + std::to_string(r.measuredBytes) +
                ",\"measured_wire_ratio\":" + std::to_string(measuredRatio) +
                ",\"accounted_bytes\":" + std::to_string(r.accountedBytes) +
                ",\"stated_wire_ratio\":" + std::to_string(r.wireRatio) + "}";
    }
    std::printf("(vs fp32: the plain Gloo all-reduce's time / this mode's time.\n");
    std::printf(" measured B: bytes rank 0 wrote to its sockets in one exchange (/proc/self/io wchar,\n");
    std::printf(" Gloo's headers included; n/a where the kernel does not say); wire x: the plain fp32\n");
    std::printf(" all-reduce's measured bytes / this mode's. accounted B, stated x: the reducer's own\n");
    std::printf(" Stats.bytesSent and compressionRatio (fp32 ring bytes by formula / bytes sent), which\n");
    std::printf(" lathectl train records as comm/bytes_sent and comm/compression_ratio)\n");
    std::printf(
        "\nThe reducer's own cost, fp32 (Reducer::finish without overlap vs the plain Gloo all-reduce\n"
        "of the same bytes, in alternated pairs; target: at most 1.2x)\n");
    std::printf("%6s %10s %12s %8s %14s\n", "MB", "gloo ms", "reducer ms", "ratio", "median of pairs");
    std::string costJson = "[";
    for (const auto& c : costs) {
        std::printf("%6.0f %10.3f %12.3f %7.2fx %13.2fx\n", c.mb, c.glooMs, c.reducerMs,
                    c.reducerMs / c.glooMs, c.pairRatio);
        costJson += std::string(costJson.size() > 1 ? "," : "") + "{\"mb\":" + std::to_string(c.mb) +
                    ",\"gloo_ms\":" + std::to_string(c.glooMs) +
                    ",\"reducer_ms\":" + std::to_string(c.reducerMs) +
                    ",\"pair_ratio\":" + std::to_string(c.pairRatio) + "}";
    }
    if (!out.empty()) {
        std::ofstream(out + "/bench_allreduce.json") << json << "]\n";
        std::ofstream(out + "/bench_allreduce_cost.json") << costJson << "]\n";
    }
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

// bench_serving: the inference server under load from the open-loop generator, in one process,
// on two models (a 1024-wide 3-layer MLP and the trained digits MLP), each against baselines
// measured in the same run:
//   (a) saturated throughput with dynamic batching (max-batch 32) vs max-batch 1;
//   (b) saturated server throughput (rows/s) as a share of LibTorch's own forward on batches of
//       32 in a tight loop (the same artifact, the same thread settings, no HTTP);
//   (c) P99 latency at half of the batched saturation rate vs max-delay + one batch's forward.
// (b) and (c) are measured twice: with JSON numbers, and with Triton's binary tensor data
// extension (what tritonclient sends by default), which takes number parsing off the server.
// Client, server and baseline share this process and the machine's cores, so the server's share
// is a lower bound of what it does with the cores to itself.
// With --compare-instances N it also runs the saturated max-batch 1 and max-batch 32 servers with
// 1 and with N instances, alternated and repeated (--compare-reps, default 3), and prints the
// medians and the N-instance / 1-instance throughput ratios.
#include <dlfcn.h>
#include <sys/resource.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "lathe/core/loadgen.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/server.h"
#include "serving/artifact_io.h"
#include "serving/infer_protocol.h"
#include "serving_fixture.h"

using Clock = std::chrono::steady_clock;
using namespace lathe::core;

namespace {

struct Model {
    std::string name;
    std::string path;  // artifact
    int64_t inputElems = 0;
};

// input 1024 -> 1024 -> 1024 -> 10 with ReLUs, scripted from C++ (no Python needed) in the form
// of nn.Linear and of Lathe's own exports (weights [out, in], addmm with W.t()), then imported
// like any TorchScript file a user brings.
Model makeWideMlp(const lathe::test::TempDir& dir) {
    torch::manual_seed(7);
    torch::jit::Module m("WideMlp");
    auto init = [](int64_t in, int64_t out) {
        return torch::randn({out, in}) / std::sqrt(static_cast<double>(in));
    };
    m.register_parameter("w1", init(1024, 1024), false);
    m.register_parameter("b1", torch::zeros({1024}), false);
    m.register_parameter("w2", init(1024, 1024), false);
    m.register_parameter("b2", torch::zeros({1024}), false);
    m.register_parameter("w3", init(1024, 10), false);
    m.register_parameter("b3", torch::zeros({10}), false);
    m.define(R"JIT(
def forward(self, x):
    h = torch.relu(torch.addmm(self.b1, x, self.w1.t()))
    h = torch.relu(torch.addmm(self.b2, h, self.w2.t()))
    return torch.addmm(self.b3, h, self.w3.t())
)JIT");
    const auto ts = dir.file("mlp1024.pt");
    m.save(ts);
    const auto info = importTorchScript(ts, {1024}, dir.file("mlp1024.lathe.pt"));
    return {"mlp1024", info.path, 1024};
}

double processCpuS() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The 1-minute load average: on a shared machine, other processes' share of the cores.
double loadAverage() {
    double l = 0;
    std::ifstream("/proc/loadavg") >> l;
    return l;
}

// LibTorch intra-op threads and OpenBLAS's own pool, which the intra-op setting does not bound.
void setThreads(int n) {
    torch::set_num_threads(n);
    using SetFn = void (*)(int);
    if (auto fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(n);
}

// LibTorch alone: forward of `batch` rows in a loop on `threads` intra-op and BLAS threads, of
// the module as loaded or (`optimized`) frozen and optimised for inference as the server may run it.
// Returns rows/s; `batchMs` gets the median time of one forward.
double rawRowsPerS(const Model& model, int64_t batch, double seconds, int threads, bool optimized,
                   double& batchMs, double& cores) {
    setThreads(threads);
    auto module = torch::jit::load(model.path);
    module.eval();
    if (optimized) module = optimizedForInference(module);
    c10::InferenceMode guard;
    auto x = torch::randn({batch, model.inputElems});
    for (int i = 0; i < 5; ++i) module.forward({x});
    std::vector<double> times;
    const double cpu0 = processCpuS();
    const auto t0 = Clock::now();
    int64_t n = 0;
    while (Clock::now() - t0 < std::chrono::duration<double>(seconds)) {
        const auto s = Clock::now();
        auto y = module.forward({x}).toTensor();
        times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s).count());
        ++n;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    cores = (processCpuS() - cpu0) / elapsed;
    std::sort(times.begin(), times.end());
    batchMs = times[times.size() / 2];
    return static_cast<double>(n * batch) / elapsed;
}

// The server's cost to parse one single-row request body of `elems` floats (JSON, as the load
// generator sends it), in microseconds: the part of a request's CPU cost that grows with its size.
double parseUs(int64_t elems, bool binary) {
    ModelSignature sig;
    sig.inputs = {{"x", "FP32", {-1, elems}}};
    sig.outputs = {{"y", "FP32", {-1, 10}}};
    std::string body =
        R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,)" + std::to_string(elems) + "]";
    auto x = torch::randn({elems});
    std::optional<std::string> headerLength;
    if (binary) {
        body += R"(,"parameters":{"binary_data_size":)" + std::to_string(elems * 4) + "}}]}";
        headerLength = std::to_string(body.size());
        body.append(reinterpret_cast<const char*>(x.data_ptr<float>()), static_cast<size_t>(elems) * 4);
    } else {
        body += R"(,"data":[)";
        for (int64_t i = 0; i < elems; ++i) body += (i ? "," : "") + std::to_string(x[i].item<float>());
        body += "]}]}";
    }
    serving::InferRequest req;
    serving::ProtocolError err;
    int64_t n = 0;
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::milliseconds(400)) {
        if (!serving::parseInferRequest(
                body, sig, 32, req, err,
                headerLength ? std::optional<std::string_view>(*headerLength) : std::nullopt))
            throw std::runtime_error(err.message);
        ++n;
    }
    return 1e6 * std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(n);
}

struct Run {
    LoadReport report;
    double rowsPerS = 0;
    double meanBatch = 0;      // rows per executed batch, from the server's /metrics
    double meanComputeMs = 0;  // forward time per batch
    double computeShare = 0;   // share of the run's wall time the batcher spent in forward
    double cores = 0;          // CPU time of the whole process (client + server) per second
    double clientCores = 0;    // CPU time of the load generator's I/O thread per second
};

// The sum of one Prometheus series family's `_sum` or `_count` over all label sets.
double metricTotal(const std::string& text, const std::string& series) {
    double total = 0;
    size_t pos = 0;
    while ((pos = text.find(series, pos)) != std::string::npos) {
        const bool lineStart = pos == 0 || text[pos - 1] == '\n';
        const size_t eol = text.find('\n', pos);
        const std::string line = text.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
        pos += series.size();
        if (!lineStart ||
            (line.size() > series.size() && line[series.size()] != '{' && line[series.size()] != ' '))
            continue;
        total += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return total;
}

// --io-threads / --compute-threads: the server's split of the cores (0 = its default).
int g_ioThreads = 0, g_computeThreads = 0, g_instances = 0;

double medianOf(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

Run loadServer(const Model& model, int64_t maxBatch, double maxDelayMs, double rate, int users,
               double seconds, bool binary = false) {
    ServeOptions so;
    so.port = 0;
    so.maxBatch = maxBatch;
    so.maxDelayMs = maxDelayMs;
    so.maxQueue = 4096;
    if (g_ioThreads > 0) so.ioThreads = g_ioThreads;
    so.computeThreads = g_computeThreads;
    if (g_instances > 0) so.instances = g_instances;
    InferenceServer server(so);
    server.load({model.name, 0, model.path});
    const auto port = server.start();
    LoadOptions lo;
    lo.url = "http://127.0.0.1:" + std::to_string(port);
    lo.model = model.name;
    lo.rate = rate;
    lo.durationS = seconds;
    lo.users = users;
    lo.timeoutS = 30;
    lo.binary = binary;
    Run r;
    const double cpu0 = processCpuS();
    r.report = runLoad(lo);
    r.cores = (processCpuS() - cpu0) / r.report.elapsedS;
    r.clientCores = r.report.clientCpuS / r.report.elapsedS;
    r.rowsPerS = r.report.qps;  // one row per request
    const auto metrics = lathe::test::httpGet(port, "/metrics");
    const double batches = metricTotal(metrics.body, "lathe_batch_size_count");
    if (batches > 0) {
        r.meanBatch = metricTotal(metrics.body, "lathe_batch_size_sum") / batches;
        const double computeS = metricTotal(metrics.body, "lathe_compute_duration_seconds_sum");
        r.meanComputeMs = 1000 * computeS / batches;
        r.computeShare = computeS / r.report.elapsedS;
    }
    if (r.report.errors > 0) {
        std::string by;
        for (const auto& [k, n] : r.report.byStatus) by += " " + k + ":" + std::to_string(n);
        std::fprintf(stderr, "bench_serving: %s: %lld failed requests (%s)\n", model.name.c_str(),
                     static_cast<long long>(r.report.errors), by.c_str());
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    const auto [out, quick] = lathe::test::benchArgs(argc, argv);
    int compareInstances = 0, compareReps = 3;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--io-threads" && i + 1 < argc) g_ioThreads = std::atoi(argv[++i]);
        if (std::string(argv[i]) == "--compute-threads" && i + 1 < argc)
            g_computeThreads = std::atoi(argv[++i]);
        if (std::string(argv[i]) == "--instances" && i + 1 < argc) g_instances = std::atoi(argv[++i]);
        if (std::string(argv[i]) == "--compare-instances" && i + 1 < argc)
            compareInstances = std::atoi(argv[++i]);
        if (std::string(argv[i]) == "--compare-reps" && i + 1 < argc)
            compareReps = std::max(1, std::atoi(argv[++i]));
    }
    const double satS = quick ? 2.5 : 4;  // seconds per saturation run
    const double halfS = quick ? 3 : 5;   // seconds for the half-load latency run
    const double rawS = quick ? 1.5 : 3;
    const int satUsers = 128;  // > 2 × max-batch: a full batch waits while one computes
    const double maxDelayMs = 5;

    lathe::test::TempDir dir;
    std::vector<Model> models{makeWideMlp(dir)};
    {
        std::printf("bench_serving: training the digits MLP (2 epochs) for its artifact...\n");
        std::fflush(stdout);
        static lathe::test::ServingWorkspace ws(2);  // lives until exit: its files back the artifact
        models.push_back({"digits", ws.version().path, 64});
    }
    const double loadBefore = loadAverage();
    std::printf(
        "bench_serving: %u hardware threads; the client (1 I/O thread), the server (%d I/O threads, %d "
        "instance(s)) and the baseline share this process. Saturated runs send at 10^6 req/s on %d "
        "connections: their latencies only grow with the run and are not shown.\n\n",
        std::thread::hardware_concurrency(), g_ioThreads > 0 ? g_ioThreads : ServeOptions{}.ioThreads,
        g_instances > 0 ? g_instances : ServeOptions{}.instances, satUsers);

    nlohmann::json results = nlohmann::json::array();
    std::printf("%-8s %-34s %9s %8s %8s %6s %6s %7s %5s %6s %6s\n", "model", "measurement", "rows/s",
                "p50 ms", "p99 ms", "errors", "batch", "fwd ms", "busy", "cores", "client");
    auto row = [](const Model& m, const std::string& what, const Run& r, bool saturated) {
        char p50[16] = "-", p99[16] = "-";
        if (!saturated) {
            std::snprintf(p50, sizeof p50, "%.2f", r.report.p50Ms);
            std::snprintf(p99, sizeof p99, "%.2f", r.report.p99Ms);
        }
        std::printf("%-8s %-34s %9.0f %8s %8s %6lld %6.1f %7.2f %4.0f%% %6.2f %6.2f\n", m.name.c_str(),
                    what.c_str(), r.rowsPerS, p50, p99, static_cast<long long>(r.report.errors), r.meanBatch,
                    r.meanComputeMs, 100 * r.computeShare, r.cores, r.clientCores);
        std::fflush(stdout);
    };
    struct Ratios {
        std::string model;
        double batching, share, p99, shareBin, p99Bin, budget, parseUs, parseBinUs;
        double rawRows, computeUsPerRow, httpUs, httpBinUs, halfForwardMs, halfForwardBinMs, halfBatch,
            halfBatchBin;
    };
    std::vector<Ratios> ratios;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (const auto& m : models) {
        // The baseline is the best the machine does without a server: LibTorch's forward on every
        // core and on one (small models run faster single-threaded), measured before the server
        // runs and again after them (other tenants of a shared machine come and go); the fastest
        // of these sets both the throughput baseline and the one-batch compute time of (c).
        double raw = 0, batchMs = 1e9;
        double computeUsPerRow = 1e30;  // the cheapest forward in CPU time: core-microseconds per row
        // Both forms of the model count: as loaded, and frozen and optimised for inference (what
        // the server's --optimize auto may choose), so the server is held to the faster.
        auto baseline = [&](const char* when) {
            for (int threads : {cores, 1}) {
                if (threads == 1 && cores == 1) continue;
                for (bool optimized : {false, true}) {
                    double ms = 0, rawCores = 0;
                    const double rows = rawRowsPerS(m, 32, rawS, threads, optimized, ms, rawCores);
                    raw = std::max(raw, rows);
                    batchMs = std::min(batchMs, ms);
                    computeUsPerRow = std::min(computeUsPerRow, 1e6 * rawCores / rows);
                    char label[64];
                    std::snprintf(label, sizeof label, "LibTorch%s forward, %d thread%s (%s)",
                                  optimized ? " opt." : "", threads, threads > 1 ? "s" : "", when);
                    std::printf("%-8s %-34s %9.0f %8s %8s %6s %6d %7.2f %4.0f%% %6.2f %6s\n", m.name.c_str(),
                                label, rows, "-", "-", "-", 32, ms, 100.0, rawCores, "-");
                }
            }
        };
        baseline("before");
        const double parse = parseUs(m.inputElems, false), parseBin = parseUs(m.inputElems, true);
        const auto batched = loadServer(m, 32, maxDelayMs, 1e6, satUsers, satS);
        row(m, "server max-batch 32, 5 ms, saturated", batched, true);
        const auto single = loadServer(m, 1, 0, 1e6, satUsers, satS);
        row(m, "server max-batch 1, saturated", single, true);
        const double halfRate = std::max(10.0, batched.rowsPerS / 2);
        const auto half = loadServer(m, 32, maxDelayMs, halfRate, satUsers, halfS);
        char label[64];
        std::snprintf(label, sizeof label, "server max-batch 32 at %.0f req/s", halfRate);
        row(m, label, half, false);
        const auto batchedBin = loadServer(m, 32, maxDelayMs, 1e6, satUsers, satS, true);
        row(m, "binary: max-batch 32, saturated", batchedBin, true);
        const double halfRateBin = std::max(10.0, batchedBin.rowsPerS / 2);
        const auto halfBin = loadServer(m, 32, maxDelayMs, halfRateBin, satUsers, halfS, true);
        std::snprintf(label, sizeof label, "binary: max-batch 32 at %.0f req/s", halfRateBin);
        row(m, label, halfBin, false);
        baseline("after");
        const double budget = maxDelayMs + batchMs;
        // Everything but the forward, per request, in CPU time of the whole process (client and
        // server): the saturated run's cores less the batch worker's busy share. Preemption makes
        // that share read high, so this errs low, and the ceiling below errs high.
        auto httpUs = [](const Run& r) {
            return 1e6 * std::max(0.0, r.cores - r.computeShare) / std::max(1.0, r.rowsPerS);
        };
        ratios.push_back({m.name, batched.rowsPerS / std::max(1e-9, single.rowsPerS), batched.rowsPerS / raw,
                          half.report.p99Ms, batchedBin.rowsPerS / raw, halfBin.report.p99Ms, budget, parse,
                          parseBin, raw, computeUsPerRow, httpUs(batched), httpUs(batchedBin),
                          half.meanComputeMs, halfBin.meanComputeMs, half.meanBatch, halfBin.meanBatch});
        auto runJson = [](const Run& r) {
            return nlohmann::json{{"rows_per_s", r.rowsPerS},       {"p50_ms", r.report.p50Ms},
                                  {"p99_ms", r.report.p99Ms},       {"errors", r.report.errors},
                                  {"mean_batch", r.meanBatch},      {"forward_ms", r.meanComputeMs},
                                  {"forward_busy", r.computeShare}, {"cores", r.cores},
                                  {"client_cores", r.clientCores}};
        };
        results.push_back({{"model", m.name},
                           {"raw_rows_per_s", raw},
                           {"raw_batch32_ms", batchMs},
                           {"batched", runJson(batched)},
                           {"single", runJson(single)},
                           {"half_rate", halfRate},
                           {"half", runJson(half)},
                           {"batched_binary", runJson(batchedBin)},
                           {"half_rate_binary", halfRateBin},
                           {"half_binary", runJson(halfBin)},
                           {"p99_budget_ms", budget},
                           {"parse_us_per_request", parse},
                           {"parse_binary_us_per_request", parseBin},
                           {"batching_speedup", ratios.back().batching},
                           {"server_share_of_raw", ratios.back().share},
                           {"server_share_of_raw_binary", ratios.back().shareBin}});
    }
    std::printf(
        "\nratios (targets: batching >= 5x; server >= 70%% of raw forward; P99 at half load <= max-delay + "
        "one batch-32 forward)\n");
    for (const auto& r : ratios) {
        std::printf("  %-8s batching %5.1fx   server/raw %5.0f%% JSON, %5.0f%% binary\n", r.model.c_str(),
                    r.batching, 100 * r.share, 100 * r.shareBin);
        std::printf(
            "  %-8s P99 at half load %.2f ms JSON, %.2f ms binary vs %.1f + %.2f = %.2f ms (%.2fx, %.2fx)\n",
            "", r.p99, r.p99Bin, maxDelayMs, r.budget - maxDelayMs, r.budget, r.p99 / r.budget,
            r.p99Bin / r.budget);
    }
    // What this machine allows at all, from the run's own measurements: with client, server and
    // forward sharing `cores`, no server can answer more rows/s than cores / (request CPU +
    // forward CPU per row); and under Triton's rule a batch closed by its delay answers its
    // oldest request no sooner than max-delay + the batch's forward as the server runs it.
    std::printf(
        "\nwhat bounds (b) and (c) on this machine (%d cores shared by client, server and forward):\n",
        cores);
    for (size_t i = 0; i < ratios.size(); ++i) {
        const auto& r = ratios[i];
        for (int bin = 0; bin < 2; ++bin) {
            const double h = bin ? r.httpBinUs : r.httpUs;
            const double ceiling = cores * 1e6 / (h + r.computeUsPerRow);
            std::printf(
                "  %-8s %-6s (b) <= %d cores / (%.0f us per request + %.0f us forward per row) = %.0f rows/s"
                " = %.0f%% of raw\n",
                r.model.c_str(), bin ? "binary" : "JSON", cores, h, r.computeUsPerRow, ceiling,
                100 * ceiling / r.rawRows);
            results[i][bin ? "ceiling_share_of_raw_binary" : "ceiling_share_of_raw"] = ceiling / r.rawRows;
        }
        for (int bin = 0; bin < 2; ++bin) {
            const double batch = bin ? r.halfBatchBin : r.halfBatch,
                         fwd = bin ? r.halfForwardBinMs : r.halfForwardMs;
            if (batch <= 0) continue;
            if (batch <
                0.95 * 32)  // batches closed by the delay: each one's oldest request (1 in ~batch) waited it
                std::printf(
                    "  %-8s %-6s (c) 1 request in %.0f waits the %.0f ms delay, then its batch's forward "
                    "(%.2f ms "
                    "in the server at half load): P99 ~>= %.2f ms vs budget %.2f ms\n",
                    r.model.c_str(), bin ? "binary" : "JSON", batch, maxDelayMs, fwd, maxDelayMs + fwd,
                    r.budget);
            else
                std::printf("  %-8s %-6s (c) batches filled before the delay (mean %.1f rows)\n",
                            r.model.c_str(), bin ? "binary" : "JSON", batch);
        }
    }
    bool compareErrors = false;
    if (compareInstances > 1) {
        // 1 instance against N, saturated, on the same model and settings as above; the order
        // alternates from one repetition to the next, and each figure is the median.
        std::printf(
            "\ninstances: %d vs 1, saturated (128 connections), max-batch 1 and max-batch 32 / %.0f ms, "
            "median of %d alternated runs each\n",
            compareInstances, maxDelayMs, compareReps);
        const int savedInstances = g_instances;
        for (size_t mi = 0; mi < models.size(); ++mi) {
            const auto& m = models[mi];
            std::vector<double> single1, singleN, batched1, batchedN;
            for (int rep = 0; rep < compareReps; ++rep) {
                const std::vector<int> order = rep % 2 == 0 ? std::vector<int>{1, compareInstances}
                                                            : std::vector<int>{compareInstances, 1};
                for (int inst : order) {
                    g_instances = inst;
                    const auto s1 = loadServer(m, 1, 0, 1e6, satUsers, satS);
                    const auto b32 = loadServer(m, 32, maxDelayMs, 1e6, satUsers, satS);
                    compareErrors |= s1.report.errors > 0 || b32.report.errors > 0;
                    char label[64];
                    std::snprintf(label, sizeof label, "max-batch 1, %d instance(s)", inst);
                    row(m, label, s1, true);
                    std::snprintf(label, sizeof label, "max-batch 32, %d instance(s)", inst);
                    row(m, label, b32, true);
                    (inst == 1 ? single1 : singleN).push_back(s1.rowsPerS);
                    (inst == 1 ? batched1 : batchedN).push_back(b32.rowsPerS);
                }
            }
            const double s1 = medianOf(single1), sN = medianOf(singleN), b1 = medianOf(batched1),
                         bN = medianOf(batchedN);
            std::printf("  %-8s 1 -> %d instances: max-batch 1 %.0f -> %.0f rows/s (%.2fx), ", m.name.c_str(),
                        compareInstances, s1, sN, sN / std::max(1e-9, s1));
            std::printf("max-batch 32 %.0f -> %.0f rows/s (%.2fx); batching with %d instances %.2fx\n", b1,
                        bN, bN / std::max(1e-9, b1), compareInstances, bN / std::max(1e-9, sN));
            results[mi]["instances_compare"] = {{"instances", compareInstances},
                                                {"reps", compareReps},
                                                {"single_rows_per_s_1", s1},
                                                {"single_rows_per_s_n", sN},
                                                {"batched_rows_per_s_1", b1},
                                                {"batched_rows_per_s_n", bN},
                                                {"single_ratio", sN / std::max(1e-9, s1)},
                                                {"batched_ratio", bN / std::max(1e-9, b1)}};
        }
        g_instances = savedInstances;
    }
    std::printf("\nload average before/after: %.2f / %.2f (other processes compete for the same cores)\n",
                loadBefore, loadAverage());
    std::printf("the server's parse of one single-row request (one core), JSON / binary:");
    for (const auto& r : ratios) std::printf("  %s %.1f / %.2f us", r.model.c_str(), r.parseUs, r.parseBinUs);
    std::printf("\n");
    if (!out.empty()) std::ofstream(out + "/bench_serving.json") << results.dump(2) << "\n";
    // Broken, not slow, is a failure: every request must have been answered.
    for (const auto& r : results)
        for (const char* run : {"batched", "single", "half", "batched_binary", "half_binary"})
            if (r[run]["errors"] != 0) return 1;
    return compareErrors ? 1 : 0;
}

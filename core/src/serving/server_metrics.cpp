// The inference server's Prometheus metrics: per-version children and the process figures.
#include "server_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace lathe::core::serving {
namespace {

const prometheus::Histogram::BucketBoundaries kLatencyBuckets{
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05,   0.075, 0.1,   0.15,  0.25,  0.5,    1,    2.5,   5,    10};
const prometheus::Histogram::BucketBoundaries kBatchBuckets{1, 2, 4, 8, 16, 32, 64, 128, 256};

}  // namespace

Metrics::PerVersion& Metrics::of(const std::string& model, int64_t version) {
    std::lock_guard<std::mutex> lk(mutex);
    auto it = perVersion.find({model, version});
    if (it != perVersion.end()) return it->second;
    const prometheus::Labels l{{"model", model}, {"version", std::to_string(version)}};
    PerVersion p{&latency.Add(l, kLatencyBuckets), &queue.Add(l, kLatencyBuckets),
                 &compute.Add(l, kLatencyBuckets), &batch.Add(l, kBatchBuckets), &computeCpu.Add(l)};
    return perVersion.emplace(std::make_pair(model, version), p).first->second;
}

prometheus::Counter* Metrics::counter(const std::string& model, int64_t version, int code) {
    std::lock_guard<std::mutex> lk(mutex);
    auto& slot = counters[{model, version, code}];
    if (!slot)
        slot = &requests.Add(
            {{"model", model}, {"version", std::to_string(version)}, {"code", std::to_string(code)}});
    return slot;
}

void Metrics::count(const std::string& model, int64_t version, int code) {
    counter(model, version, code)->Increment();
}

void Metrics::setServed(const std::string& model, int64_t oldVersion, int64_t newVersion) {
    if (oldVersion >= 0) info.Add({{"model", model}, {"version", std::to_string(oldVersion)}}).Set(0);
    info.Add({{"model", model}, {"version", std::to_string(newVersion)}}).Set(1);
}

void Metrics::refreshProcess() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double cpuNow = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                          1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    {
        std::lock_guard<std::mutex> lk(mutex);
        if (cpuNow > lastCpu) cpu.Add({}).Increment(cpuNow - lastCpu);
        lastCpu = std::max(lastCpu, cpuNow);
    }
    std::ifstream statm("/proc/self/statm");
    long pages = 0, resident = 0;
    if (statm >> pages >> resident) rss.Add({}).Set(static_cast<double>(resident) * sysconf(_SC_PAGESIZE));
}

}  // namespace lathe::core::serving

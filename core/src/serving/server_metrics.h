#pragma once
// The inference server's Prometheus metric families (prometheus-cpp), served at GET /metrics, and
// the per-label children, created once per (model, version[, code]).
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

namespace lathe::core::serving {

struct Metrics {
    prometheus::Registry registry;
    prometheus::Family<prometheus::Counter>& requests =
        prometheus::BuildCounter()
            .Name("lathe_requests_total")
            .Help("Inference requests by model, version and HTTP status")
            .Register(registry);
    prometheus::Family<prometheus::Histogram>& latency =
        prometheus::BuildHistogram()
            .Name("lathe_request_duration_seconds")
            .Help("Request latency from the whole request read to the response handed to the socket")
            .Register(registry);
    prometheus::Family<prometheus::Histogram>& queue = prometheus::BuildHistogram()
                                                           .Name("lathe_queue_duration_seconds")
                                                           .Help("Time a request waited for its batch")
                                                           .Register(registry);
    prometheus::Family<prometheus::Histogram>& compute = prometheus::BuildHistogram()
                                                             .Name("lathe_compute_duration_seconds")
                                                             .Help("Forward time per batch")
                                                             .Register(registry);
    prometheus::Family<prometheus::Counter>& computeCpu =
        prometheus::BuildCounter()
            .Name("lathe_compute_cpu_seconds_total")
            .Help(
                "CPU time of the batch worker's thread in forward (LibTorch's other intra-op threads not "
                "included); below the forward's wall time when the worker waits for a core")
            .Register(registry);
    prometheus::Family<prometheus::Histogram>& batch = prometheus::BuildHistogram()
                                                           .Name("lathe_batch_size")
                                                           .Help("Rows per executed batch")
                                                           .Register(registry);
    prometheus::Family<prometheus::Gauge>& depth = prometheus::BuildGauge()
                                                       .Name("lathe_queue_depth")
                                                       .Help("Rows waiting for a batch")
                                                       .Register(registry);
    prometheus::Family<prometheus::Gauge>& info = prometheus::BuildGauge()
                                                      .Name("lathe_model_info")
                                                      .Help("1 for the version now served under a model name")
                                                      .Register(registry);
    prometheus::Family<prometheus::Counter>& routed =
        prometheus::BuildCounter()
            .Name("lathe_routed_requests_total")
            .Help(
                "Requests a rollout's split sent to a version: by=\"user\" by their user's id, "
                "by=\"random\" without one")
            .Register(registry);
    prometheus::Family<prometheus::Gauge>& weight =
        prometheus::BuildGauge()
            .Name("lathe_rollout_weight_bp")
            .Help("The share of a model's requests (basis points) its rollout sends to the candidate version")
            .Register(registry);
    prometheus::Family<prometheus::Counter>& cpu = prometheus::BuildCounter()
                                                       .Name("process_cpu_seconds_total")
                                                       .Help("User and system CPU time of the server process")
                                                       .Register(registry);
    prometheus::Family<prometheus::Gauge>& rss = prometheus::BuildGauge()
                                                     .Name("process_resident_memory_bytes")
                                                     .Help("Resident memory of the server process")
                                                     .Register(registry);
    prometheus::Family<prometheus::Gauge>& gpuUtil = prometheus::BuildGauge()
                                                         .Name("lathe_gpu_utilization_percent")
                                                         .Help("GPU utilisation")
                                                         .Register(registry);
    prometheus::Family<prometheus::Gauge>& gpuMem = prometheus::BuildGauge()
                                                        .Name("lathe_gpu_memory_used_bytes")
                                                        .Help("GPU memory in use")
                                                        .Register(registry);

    struct PerVersion {
        prometheus::Histogram* latency;
        prometheus::Histogram* queue;
        prometheus::Histogram* compute;
        prometheus::Histogram* batch;
        prometheus::Counter* computeCpu;
    };
    std::mutex mutex;
    std::map<std::pair<std::string, int64_t>, PerVersion> perVersion;
    std::map<std::tuple<std::string, int64_t, int>, prometheus::Counter*> counters;
    double lastCpu = 0;

    PerVersion& of(const std::string& model, int64_t version);
    void count(const std::string& model, int64_t version, int code);
    /// The requests counter of one (model, version, code), created on first use; for callers that
    /// keep it (a session answering many requests of one version).
    prometheus::Counter* counter(const std::string& model, int64_t version, int code);
    void setServed(const std::string& model, int64_t oldVersion, int64_t newVersion);
    // Process figures are read when scraped.
    void refreshProcess();
};

}  // namespace lathe::core::serving

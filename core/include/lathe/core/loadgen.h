#pragma once
// An HTTP load generator for KServe v2 servers (`lathectl load`), in two modes:
//  - open loop (`rate`): requests are scheduled at fixed intended send times; latency is measured
//    from the intended send time, so a server that falls behind shows its queueing instead of
//    hiding it (the "coordinated omission" correction of wrk2);
//  - closed loop (`connections` > 0, like wrk): each connection sends its next request as soon as
//    the last one is answered, which finds the server's saturated throughput; latency is from
//    the actual send.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lathe::core {

struct LoadOptions {
    std::string url = "http://127.0.0.1:8500";  // server base URL
    std::string model;                          // /v2/models/MODEL/infer
    double rate = 100;                          // requests per second (intended), open loop
    double durationS = 10;
    int users = 8;         // concurrent connections (keep-alive), open loop
    int connections = 0;   // > 0: closed loop on this many connections (rate and users unused)
    double timeoutS = 10;  // per request
    int64_t rowsPerRequest = 1;
    std::string body;     // request body; empty = random FP32 input built from GET /v2/models/MODEL
    bool binary = false;  // the random input and the output as binary tensor data (Triton's
                          // extension) instead of JSON numbers; not with `body`
    int threads = 1;      // client I/O threads; 1 drives thousands of requests/s, 2 at most is useful
};

struct LoadReport {
    int64_t sent = 0;
    int64_t ok = 0;
    int64_t errors = 0;                       // non-2xx answers + transport failures
    std::map<std::string, int64_t> byStatus;  // "200", "503", "connect", "timeout", ...
    int64_t unsent = 0;                       // scheduled before the end, but no connection was free
                                              // in time: the server could not keep up with the rate
    double elapsedS = 0;
    double qps = 0;  // successful (2xx) answers per second
    double p50Ms = 0, p90Ms = 0, p99Ms = 0, p999Ms = 0, maxMs = 0, meanMs = 0;
    double clientCpuS = 0;            // CPU time of the generator's own I/O threads: close to
                                      // elapsedS × threads means the client is the limit
    std::vector<double> latenciesMs;  // every successful request, in completion order
};

/// Progress once a second: seconds elapsed, report so far (counts and percentiles of the
/// successful requests so far; latenciesMs is left empty to keep the call cheap).
using LoadProgress = std::function<void(double, const LoadReport&)>;

/// Runs the load until the duration ends or `stop` is set (then requests in flight get a short
/// grace and are counted as "cancelled"). Throws ConfigError for bad options and Error when the
/// server cannot be reached or the model's metadata is unusable before the run starts.
/// Error kinds in byStatus besides HTTP codes: "connect", "timeout", "closed", "io", "cancelled".
LoadReport runLoad(const LoadOptions& options, const std::atomic<bool>* stop = nullptr,
                   const LoadProgress& progress = {});

/// Percentile (0..100) of unsorted values, nearest-rank; 0 for none.
double percentile(std::vector<double> values, double p);

}  // namespace lathe::core

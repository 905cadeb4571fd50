#pragma once
// The inference server behind `lathectl serve`: an asynchronous HTTP/1.1 server (Boost.Beast)
// speaking the Open Inference (KServe v2) protocol, with a Triton-style dynamic batcher, hot
// model swap, and Prometheus metrics. Torch stays inside core's private sources.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lathe/core/registry.h"

namespace lathe::core {

struct ServeOptions {
    std::string host = "127.0.0.1";
    uint16_t port = 8500;               // 0 = any free port (see InferenceServer::port())
    int64_t maxBatch = 32;              // rows per batch
    double maxDelayMs = 10;             // the oldest request waits at most this long for a fuller batch
    std::string batching = "adaptive";  // adaptive: a free instance takes what is queued at once, so
                                        // requests wait for company only while every instance is busy
                                        // (work-conserving); fixed: a batch waits until it is full or
                                        // its oldest request has waited maxDelayMs (Triton's delay)
    int64_t maxQueue = 1024;            // rows waiting; beyond it requests get 503 + Retry-After
    int ioThreads = 2;                  // HTTP threads (connections are multiplexed on them)
    int computeThreads = 0;       // LibTorch and OpenBLAS threads per instance; 0 = the cores left by the I/O
                                  // threads (at least 1), shared out among the instances
    int instances = 1;            // batches run at once, each on its own worker and batch buffer (Triton's
                                  // instance_group count)
    std::string device = "auto";  // auto (a CUDA GPU when there is one) | cpu | cuda
    std::string optimize =
        "auto";  // on a CPU: freeze + TorchScript's inference optimisations (weights laid out once,
                 // conv-bn folded); auto keeps them when faster, on always, off never
    int64_t maxBodyBytes = 8 << 20;
    double idleTimeoutS = 30;  // a client silent this long mid-request (or idle) is dropped
    std::string workspace;     // registry to load versions from (hot swap by version); optional
    std::string instance;  // echoed by GET /v2: lets `deploy` tell its own server from another on the port
    // The control API (everything under /v2/repository: index, load/hot swap, unload) demands
    // `Authorization: Bearer <controlToken>` when set: 401 without it, 403 with another token.
    // Empty: open on a server that listens on loopback only (isLoopbackHost), refused (403) beyond
    // it. Inference, health, metadata and /metrics are never gated. A secret: the server keeps
    // only its SHA-256, and never logs or echoes it. 16 to 4096 visible ASCII characters.
    std::string controlToken;
};

/// Whether a server listening on `host` is reachable from this machine only: 127.0.0.0/8, ::1,
/// ::ffff:127.x.y.z or "localhost". 0.0.0.0, ::, and any other address are beyond loopback.
bool isLoopbackHost(const std::string& host);

/// A model to serve: a registered version or a plain artifact file.
struct ServedModel {
    std::string name;     // the URL name: /v2/models/NAME
    int64_t version = 0;  // 0 = from a file
    std::string path;
};

class InferenceServer {
public:
    explicit InferenceServer(ServeOptions options);
    ~InferenceServer();  // stops
    InferenceServer(const InferenceServer&) = delete;
    InferenceServer& operator=(const InferenceServer&) = delete;

    /// Loads (and warms up) a model. A model already served under that name is replaced
    /// atomically once the new one is ready: requests admitted before the switch finish on the
    /// old one. Throws (and keeps the old model) when the new one fails to load.
    /// `sha256`: the file must have this digest (a file copied to this host); empty: the
    /// registry's digest for a registered version, none for a plain file.
    void load(const ServedModel& model, const std::string& sha256 = {});
    /// Binds and starts serving; returns the port actually bound. Throws Error("port 8500 is in use ...").
    uint16_t start();
    uint16_t port() const;
    /// The version now served under `name` (0 when none or from a file).
    int64_t servedVersion(const std::string& name) const;
    /// What loading `name` did about optimisation (LoadedModel::optimization), for the log.
    std::string optimization(const std::string& name) const;
    /// Stops accepting, answers what is queued, closes connections. Idempotent.
    void stop();
    /// Blocks until stop() (from another thread or a signal handler's flag via runUntil).
    void runUntil(const std::atomic<bool>& stopFlag);

    struct Impl;  // public only so the server's private session class can name it

private:
    std::unique_ptr<Impl> d;
};

}  // namespace lathe::core

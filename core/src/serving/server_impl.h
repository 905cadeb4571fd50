#pragma once
// The inference server's private state, shared by server.cpp (start, stop, loading and hot swap)
// and http_session.cpp (the connections that read it).
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "batcher.h"
#include "gpu_probe.h"
#include "http_session.h"
#include "lathe/core/server.h"
#include "router.h"
#include "server_metrics.h"

namespace lathe::core {
namespace serving {

/// A rollout's candidate, served beside a model's current version with a batcher of its own.
struct Candidate {
    std::shared_ptr<LoadedModel> model;
    std::shared_ptr<Batcher> batcher;  // sessions hold it for the request they submit to it
    ServedModel source;                // what to load again when it is promoted
    std::string sha256;
    TrafficSplit split;
    prometheus::Counter* routed[2][2] = {};  // [to the candidate][by the user's id]
};

/// One model name: the version served now and the batcher its requests queue in; during a
/// rollout, the candidate beside it.
struct ModelSlot {
    mutable std::mutex mutex;
    std::shared_ptr<LoadedModel> current;
    std::unique_ptr<Batcher> batcher;
    std::shared_ptr<const Candidate> candidate;  // replaced whole, never changed in place
    std::shared_ptr<LoadedModel> get() const {
        std::lock_guard<std::mutex> lk(mutex);
        return current;
    }
};

}  // namespace serving

struct InferenceServer::Impl {
    ServeOptions options;  // its controlToken cleared once its digest below is taken
    // The control API's gate (Session::authorizeControl): the SHA-256 (hex) of the control token,
    // empty when none was given, and whether the server listens on loopback only.
    std::string controlTokenSha256;
    bool loopbackOnly = true;
    // One event loop per I/O thread, as nginx has one per worker: a connection is given to one
    // loop when accepted (round robin) and all of its handlers run on that loop's thread, so it
    // needs no strand, and a loop never wakes another. A shared io_context with a strand per
    // connection cost a mutex and often a futex wake-up per handler (~10% of a saturated
    // server's CPU). The acceptor is on loops[0].
    // One per loop. Declared before `loops`, so destroyed after them: a loop destroyed with a
    // drain still posted gives its memory back to the queue. stop() lets go of the sessions they
    // still hold while the loops exist.
    std::vector<std::unique_ptr<serving::AnswerQueue>> answers;
    std::vector<std::unique_ptr<boost::asio::io_context>> loops;
    size_t nextLoop = 0;  // on loops[0]'s thread only
    std::optional<boost::asio::ip::tcp::acceptor> acceptor;
    std::vector<std::thread> threads;
    std::vector<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
    uint16_t boundPort = 0;
    std::atomic<bool> stopping{false};
    bool stopped = false;
    std::mutex stopMutex;

    std::shared_mutex modelsMutex;
    std::map<std::string, std::shared_ptr<serving::ModelSlot>> models;
    std::mutex loadMutex;  // one load at a time: a second waits rather than racing the first
    std::vector<std::thread> loaders;
    std::mutex loadersMutex;
    std::vector<std::thread> retiring;  // candidates' batchers draining (retire())
    std::mutex retiringMutex;

    serving::Metrics metrics;
    serving::GpuProbe gpu;

    std::shared_ptr<serving::ModelSlot> slot(const std::string& name) {
        std::shared_lock<std::shared_mutex> lk(modelsMutex);
        auto it = models.find(name);
        return it == models.end() ? nullptr : it->second;
    }

    std::unique_ptr<serving::Batcher> makeBatcher(const std::string& name, const std::string& variant);
    std::shared_ptr<serving::LoadedModel> loadModel(const ServedModel& m, const std::string& sha);
    /// Loads `m` and switches it in; throws, and the old version keeps serving, when it fails.
    void load(const ServedModel& m, const std::string& sha);
    /// A rollout of `m` beside the model's current version, at `split`'s weight: loads the
    /// candidate unless it is the one already beside it (then only the split changes). Throws
    /// ConfigError (nothing changed) for a candidate that is the current version or takes other
    /// inputs.
    void startRollout(const ServedModel& m, const std::string& sha, serving::TrafficSplit split);
    /// A new weight for the rollout in force; ConfigError when there is none.
    void setRolloutWeight(const std::string& model, int32_t bp);
    /// Ends the rollout: "abort" (the current version serves all) or "promote" (the candidate is
    /// loaded as the current version, as a hot swap, then the rollout ends).
    void endRollout(const std::string& model, const std::string& how);
    /// The candidate's batcher stops once no session holds it (its queued requests answered).
    void retire(std::shared_ptr<serving::Batcher> batcher);
    void accept();
    void stop();
};

}  // namespace lathe::core

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
#include "server_metrics.h"

namespace lathe::core {
namespace serving {

/// One model name: the version served now and the batcher its requests queue in.
struct ModelSlot {
    mutable std::mutex mutex;
    std::shared_ptr<LoadedModel> current;
    std::unique_ptr<Batcher> batcher;
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

    serving::Metrics metrics;
    serving::GpuProbe gpu;

    std::shared_ptr<serving::ModelSlot> slot(const std::string& name) {
        std::shared_lock<std::shared_mutex> lk(modelsMutex);
        auto it = models.find(name);
        return it == models.end() ? nullptr : it->second;
    }

    /// Loads `m` and switches it in; throws, and the old version keeps serving, when it fails.
    void load(const ServedModel& m, const std::string& sha);
    void accept();
    void stop();
};

}  // namespace lathe::core

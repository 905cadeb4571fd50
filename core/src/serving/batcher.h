#pragma once
// Triton-style dynamic batcher for one model name: requests queue in arrival order; a batch
// runs as soon as it holds max-batch rows or its oldest request has waited max-delay. Requests
// remember the model version they were admitted for, so a hot swap never mixes versions in a
// batch and requests admitted before the swap finish on the old version. Like Triton's
// instance_group, several workers may each run a batch at once (one per model instance): while
// one computes, the next batch forms and starts on another core instead of waiting its turn.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model_runner.h"

namespace lathe::core::serving {

using Clock = std::chrono::steady_clock;

struct BatchResult {
    int status = 200;  // 200, or 500 when the model failed
    std::string error;
    std::vector<float> output;  // rows × outputElems
    double queueS = 0;          // enqueue -> batch start
    double computeS = 0;        // the batch's forward
    int64_t batchRows = 0;
};

struct PendingRequest {
    std::shared_ptr<LoadedModel> model;
    std::vector<float> input;  // rows × inputElems
    int64_t rows = 0;
    Clock::time_point enqueued;
    std::function<void(BatchResult&&)> done;  // called on the batcher thread
};

struct BatcherStats {
    std::function<void(const LoadedModel&, int64_t rows, double computeS)> onBatch;
    std::function<void(int64_t queuedRows)> onQueueDepth;
};

class Batcher {
public:
    /// `instances` workers; a model run by it must have been loaded with at least as many.
    Batcher(int64_t maxBatch, double maxDelayMs, int64_t maxQueueRows, BatcherStats stats, int instances = 1);
    ~Batcher();  // stop()
    /// false (and `done` is not called) when the queue is full.
    bool submit(PendingRequest&& r);
    /// Answers everything queued, then ends the thread.
    void stop();
    int64_t queuedRows() const;

private:
    void loop(int instance);
    void runBatch(int instance, std::vector<PendingRequest>& batch, std::vector<float>& output);

    const int64_t m_maxBatch;
    const std::chrono::nanoseconds m_maxDelay;
    const int64_t m_maxQueueRows;
    BatcherStats m_stats;
    mutable std::mutex m_mutex;
    std::condition_variable m_cv;
    std::deque<PendingRequest> m_queue;
    int64_t m_queuedRows = 0;
    bool m_stopping = false;
    std::vector<std::thread> m_threads;
};

}  // namespace lathe::core::serving

#pragma once
// Dynamic batcher for one model name: requests queue in arrival order. Two policies:
//  - adaptive (work-conserving, the default): a worker that is free takes what is queued at once,
//    up to max-batch rows; requests wait for company only while every worker is computing, so a
//    lone request at light load costs one forward, and under load batches grow by themselves
//    (what arrives during one forward is the next batch). TF Serving's batch scheduler and
//    Triton with no queue delay behave this way.
//  - fixed: a batch runs as soon as it holds max-batch rows or its oldest request has waited
//    max-delay (Triton's max_queue_delay_microseconds), even when a worker is idle.
// Requests
// remember the model version they were admitted for, so a hot swap never mixes versions in a
// batch and requests admitted before the swap finish on the old version. Like Triton's
// instance_group, several workers may each run a batch at once (one per model instance): while
// one computes, the next batch forms and starts on another core instead of waiting its turn.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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
    double queueS = 0;       // enqueue -> batch start
    double computeS = 0;     // the batch's forward
    double computeCpuS = 0;  // its CPU time on the worker's thread
    int64_t batchRows = 0;
};

/// Whoever waits for a request's answer (the HTTP session), told on the batcher thread. An
/// interface rather than a std::function: nothing is allocated per request to say where the
/// answer goes.
class BatchClient {
public:
    virtual ~BatchClient() = default;
    /// `output`: the request's rows of the batch's output, `count` floats, valid during the call
    /// only (null when the batch failed).
    virtual void batchDone(const BatchResult& result, const float* output, int64_t count) = 0;
    /// After every request of the batch was told batchDone: a client that gathers answers (the
    /// server's per-loop AnswerQueue) sends them on now.
    virtual void batchFlush() {}
};

struct PendingRequest {
    std::shared_ptr<LoadedModel> model;
    const float* input = nullptr;  // rows × inputElems, the client's, untouched until batchDone
    int64_t rows = 0;
    Clock::time_point enqueued;
    std::shared_ptr<BatchClient> client;
};

struct BatcherStats {
    std::function<void(const LoadedModel&, int64_t rows, double computeS, double cpuS)> onBatch;
    std::function<void(int64_t queuedRows)> onQueueDepth;
};

/// A FIFO on one growing array: unlike std::deque, which allocates a block every few pushes
/// (512 bytes, 9 requests) and frees it as the front passes, it allocates nothing once it has
/// held the most requests it will hold.
template <class T>
class RingQueue {
public:
    bool empty() const { return m_size == 0; }
    size_t size() const { return m_size; }
    T& operator[](size_t i) { return m_items[(m_head + i) & (m_items.size() - 1)]; }
    const T& operator[](size_t i) const { return m_items[(m_head + i) & (m_items.size() - 1)]; }
    T& front() { return (*this)[0]; }
    T& back() { return (*this)[m_size - 1]; }
    void push_back(T&& item) {
        if (m_size == m_items.size()) grow();
        (*this)[m_size++] = std::move(item);
    }
    void pop_front() {
        front() = T();  // releases what the item holds now, not when its slot is reused
        m_head = (m_head + 1) & (m_items.size() - 1);
        --m_size;
    }

private:
    void grow() {
        std::vector<T> bigger(std::max<size_t>(16, 2 * m_items.size()));  // a power of two
        for (size_t i = 0; i < m_size; ++i) bigger[i] = std::move((*this)[i]);
        m_items = std::move(bigger);
        m_head = 0;
    }
    std::vector<T> m_items;
    size_t m_head = 0, m_size = 0;
};

class Batcher {
public:
    /// `instances` workers; a model run by it must have been loaded with at least as many.
    enum class Policy { Adaptive, Fixed };
    Batcher(int64_t maxBatch, double maxDelayMs, int64_t maxQueueRows, BatcherStats stats, int instances = 1,
            Policy policy = Policy::Adaptive);
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
    const Policy m_policy;
    BatcherStats m_stats;
    mutable std::mutex m_mutex;
    std::condition_variable m_cv;
    RingQueue<PendingRequest> m_queue;
    int64_t m_queuedRows = 0;
    bool m_stopping = false;
    std::vector<std::thread> m_threads;
};

}  // namespace lathe::core::serving

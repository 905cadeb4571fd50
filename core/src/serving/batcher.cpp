#include "batcher.h"

#include <pthread.h>

#include <cstring>
#include <ctime>
#include <string>

namespace lathe::core::serving {
namespace {

// This thread's CPU time: what a forward cost, apart from the moments its thread waited for a
// core (a syscall, not the vDSO: twice per batch, not per request).
double threadCpuS() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

Batcher::Batcher(int64_t maxBatch, double maxDelayMs, int64_t maxQueueRows, BatcherStats stats, int instances,
                 Policy policy)
    : m_maxBatch(std::max<int64_t>(1, maxBatch)),
      m_maxDelay(std::chrono::nanoseconds(static_cast<int64_t>(std::max(0.0, maxDelayMs) * 1e6))),
      m_maxQueueRows(std::max<int64_t>(1, maxQueueRows)),
      m_policy(policy),
      m_stats(std::move(stats)) {
    try {
        for (int i = 0; i < std::max(1, instances); ++i)
            m_threads.emplace_back([this, i] {
                pthread_setname_np(pthread_self(),
                                   ("lathe-batch-" + std::to_string(i)).c_str());  // for top and perf
                loop(i);
            });
    } catch (...) {
        stop();  // the workers already started end before the error goes on
        throw;
    }
}

Batcher::~Batcher() { stop(); }

bool Batcher::submit(PendingRequest&& r) {
    int64_t depth = 0;
    bool wake = false;
    {
        std::lock_guard<std::mutex> lk(m_mutex);
        if (m_stopping || m_queuedRows + r.rows > m_maxQueueRows) return false;
        // A worker needs waking only when there is something new for it to do: a first request
        // (adaptive: a waiting worker takes it now; fixed: its delay starts), a batch's worth of
        // rows, or a version boundary that closes the batch. Waking it for every request of a
        // forming batch cost a context switch each. Adaptive needs no more: a queue that is not
        // empty means every worker is computing, and each looks at the queue when it is done.
        wake = m_queue.empty() || m_queuedRows + r.rows >= m_maxBatch || m_queue.back().model != r.model;
        m_queuedRows += r.rows;
        depth = m_queuedRows;
        m_queue.push_back(std::move(r));
    }
    if (wake) m_cv.notify_one();
    if (m_stats.onQueueDepth) m_stats.onQueueDepth(depth);
    return true;
}

int64_t Batcher::queuedRows() const {
    std::lock_guard<std::mutex> lk(m_mutex);
    return m_queuedRows;
}

void Batcher::stop() {
    {
        std::lock_guard<std::mutex> lk(m_mutex);
        m_stopping = true;
    }
    m_cv.notify_all();
    for (auto& t : m_threads)
        if (t.joinable()) t.join();
}

void Batcher::loop(int instance) {
    std::vector<PendingRequest> batch;
    std::vector<float> output;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(m_mutex);
            // Rows that could join the oldest request's batch: same model version, in order.
            auto ready = [&] {
                int64_t rows = 0;
                for (size_t i = 0; i < m_queue.size(); ++i) {
                    const auto& r = m_queue[i];
                    if (r.model != m_queue.front().model) return true;  // a version boundary closes the batch
                    rows += r.rows;
                    if (rows >= m_maxBatch) return true;
                }
                return false;
            };
            // Wait for a batch. Adaptive: anything queued (this worker is free). Fixed: full, or
            // its oldest request's delay spent; another worker may take the batch meanwhile, so
            // the oldest request (and its deadline) is looked at afresh after every wake-up.
            for (;;) {
                if (m_queue.empty()) {
                    if (m_stopping) return;  // stopping and drained
                    m_cv.wait(lk);
                    continue;
                }
                if (m_stopping || m_policy == Policy::Adaptive || ready()) break;
                const auto deadline = m_queue.front().enqueued + m_maxDelay;
                if (Clock::now() >= deadline) break;
                m_cv.wait_until(lk, deadline);
            }
            const auto model = m_queue.front().model;
            int64_t rows = 0;
            while (!m_queue.empty() && m_queue.front().model == model &&
                   rows + m_queue.front().rows <= m_maxBatch) {
                rows += m_queue.front().rows;
                batch.push_back(std::move(m_queue.front()));
                m_queue.pop_front();
            }
            m_queuedRows -= rows;
            // What is left may already make a batch: another worker can start on it now.
            if (!m_queue.empty()) m_cv.notify_one();
        }
        if (m_stats.onQueueDepth) m_stats.onQueueDepth(queuedRows());
        runBatch(instance, batch, output);
        batch.clear();
    }
}

void Batcher::runBatch(int instance, std::vector<PendingRequest>& batch, std::vector<float>& output) {
    auto& model = *batch.front().model;
    const auto start = Clock::now();
    const double cpu0 = threadCpuS();
    int64_t rows = 0;
    for (const auto& r : batch) rows += r.rows;
    BatchResult proto;
    try {
        // Rows go straight into the instance's pre-allocated batch buffer: no tensor is
        // allocated per request.
        float* in = model.inputBuffer(instance);
        int64_t at = 0;
        for (const auto& r : batch) {
            std::memcpy(in + at * model.inputElems(), r.input,
                        static_cast<size_t>(r.rows * model.inputElems()) * sizeof(float));
            at += r.rows;
        }
        output.resize(static_cast<size_t>(rows * model.outputElems()));
        model.run(instance, rows, output.data());
    } catch (const std::exception& ex) {
        proto.status = 500;
        proto.error = std::string("inference failed: ") + ex.what();
    }
    const auto end = Clock::now();
    proto.computeCpuS = threadCpuS() - cpu0;
    proto.computeS = std::chrono::duration<double>(end - start).count();
    proto.batchRows = rows;
    if (m_stats.onBatch && proto.status == 200)
        m_stats.onBatch(model, rows, proto.computeS, proto.computeCpuS);
    int64_t offset = 0;
    for (auto& r : batch) {
        proto.queueS = std::chrono::duration<double>(start - r.enqueued).count();
        const auto n = r.rows * model.outputElems();
        r.client->batchDone(proto, proto.status == 200 ? output.data() + offset : nullptr, n);
        offset += n;
    }
    for (auto& r : batch) r.client->batchFlush();
}

}  // namespace lathe::core::serving

// The batch loader (loader.h).
#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "lathe/core/error.h"

namespace lathe::core::data {

BatchBuffer heapBatch(int64_t rows, int64_t floatsPerRow) {
    struct Heap {
        std::vector<float> x;
        std::vector<int64_t> y;
    };
    auto h = std::make_shared<Heap>();
    h->x.resize(static_cast<size_t>(rows * floatsPerRow));
    h->y.resize(static_cast<size_t>(rows));
    BatchBuffer b;
    b.x = h->x.data();
    b.y = h->y.data();
    b.owner = std::move(h);
    return b;
}

Loader::Loader(std::shared_ptr<SampleSource> source, int workers, int prefetch, BatchAllocator allocate)
    : m_source(std::move(source)), m_prefetch(std::max(1, prefetch)), m_allocate(std::move(allocate)) {
    try {
        for (int i = 0; i < workers; ++i) m_threads.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {  // no more threads (a pids limit): stop the started ones
        {
            std::lock_guard lock(m_mu);
            m_stop = true;
        }
        m_cv.notify_all();
        for (auto& t : m_threads) t.join();
        throw Error("cannot start " + std::to_string(workers) + " data loader threads (" + e.what() +
                    "): lower `loader_workers`");
    }
}

Loader::~Loader() {
    {
        std::lock_guard lock(m_mu);
        m_stop = true;
    }
    m_cv.notify_all();
    for (auto& t : m_threads) t.join();
}

void Loader::start(std::vector<int64_t> order, int64_t batch, SampleMode mode, uint64_t seed, int64_t epoch) {
    auto pass = std::make_shared<Pass>();
    pass->order = std::move(order);
    pass->batch = std::max<int64_t>(1, batch);
    pass->mode = mode;
    pass->seed = seed;
    pass->epoch = epoch;
    {
        std::lock_guard lock(m_mu);
        m_batches = (static_cast<int64_t>(pass->order.size()) + pass->batch - 1) / pass->batch;
        m_pass = std::move(pass);
        ++m_generation;  // batches of an abandoned pass are dropped when they finish
        m_claimed = m_consumed = 0;
        m_ready.clear();
    }
    m_cv.notify_all();
}

LoadedBatch Loader::prepare(const Pass& pass, int64_t b) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t from = b * pass.batch;
    const int64_t to = std::min<int64_t>(static_cast<int64_t>(pass.order.size()), from + pass.batch);
    const int64_t d = m_source->sampleFloats();
    LoadedBatch out;
    out.buffer = m_allocate(to - from, d);
    int64_t k = 0;
    for (int64_t i = from; i < to; ++i) {
        const int64_t index = pass.order[static_cast<size_t>(i)];
        if (!m_source->read(index, pass.mode, sampleSeed(pass.seed, pass.epoch, index), out.buffer.x + k * d,
                            out.tally))
            continue;  // skipped (bad_samples = "skip"), counted in the tally
        out.buffer.y[k++] = m_source->label(index);
    }
    // Every sample skipped: the batch takes the next readable samples of the pass instead (in
    // order, wrapping), so that a step never gets an empty batch.
    // (Those met on the way are counted as skipped where their own batch reads them.)
    const auto n = static_cast<int64_t>(pass.order.size());
    SampleTally borrowed;
    for (int64_t i = to; k == 0 && i < to + n; ++i) {
        const int64_t index = pass.order[static_cast<size_t>(i % n)];
        if (m_source->read(index, pass.mode, sampleSeed(pass.seed, pass.epoch, index), out.buffer.x,
                           borrowed))
            out.buffer.y[k++] = m_source->label(index);
    }
    borrowed.skipped = 0;
    out.tally.add(borrowed);
    if (k == 0)
        throw DataError("no sample of the data set could be read (every one was skipped as unreadable)");
    out.rows = k;
    out.busySeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

void Loader::work() {
    std::unique_lock lock(m_mu);
    for (;;) {
        m_cv.wait(lock, [&] {
            return m_stop || (m_pass && m_claimed < m_batches && m_claimed < m_consumed + m_prefetch);
        });
        if (m_stop) return;
        const auto pass = m_pass;
        const uint64_t generation = m_generation;
        const int64_t b = m_claimed++;
        lock.unlock();
        Result r;
        try {
            r.batch = prepare(*pass, b);
        } catch (...) {
            r.error = std::current_exception();
        }
        lock.lock();
        if (generation == m_generation) {
            try {
                m_ready.emplace(b, std::move(r));
            } catch (...) {  // no memory for the map node: the batch is the error
                Result failed;
                failed.error = std::current_exception();
                m_ready[b] = std::move(failed);
            }
            m_cv.notify_all();
        }
    }
}

bool Loader::next(LoadedBatch& out, double* waitSeconds) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock lock(m_mu);
    if (!m_pass || m_consumed >= m_batches) return false;
    const int64_t b = m_consumed;
    if (m_threads.empty()) {
        const auto pass = m_pass;
        ++m_consumed;
        lock.unlock();
        out = prepare(*pass, b);
        if (waitSeconds)
            *waitSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return true;
    }
    m_cv.wait(lock, [&] { return m_ready.count(b) > 0; });
    auto node = m_ready.extract(b);
    ++m_consumed;
    lock.unlock();
    m_cv.notify_all();  // room for one more batch ahead
    if (waitSeconds)
        *waitSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (node.mapped().error) std::rethrow_exception(node.mapped().error);
    out = std::move(node.mapped().batch);
    return true;
}

}  // namespace lathe::core::data

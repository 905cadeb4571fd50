#pragma once
// The batch loader (torch-free): `workers` threads prepare whole batches of a source ahead of the
// training step, at most `prefetch` batches ahead, into buffers the caller allocates (pinned host
// memory when training on CUDA). Batches come out in order, and each sample's random steps are
// seeded by (seed, epoch, sample), so a batch is the same bytes with 0, 1 or 16 workers. With 0
// workers batches are prepared in the calling thread when asked for (no threads at all).
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/pipeline.h"

namespace lathe::core::data {

/// Room for `rows` samples: x holds rows * floatsPerRow floats, y rows labels. `owner` keeps the
/// memory alive (a tensor, a vector).
struct BatchBuffer {
    std::shared_ptr<void> owner;
    float* x = nullptr;
    int64_t* y = nullptr;
};
using BatchAllocator = std::function<BatchBuffer(int64_t rows, int64_t floatsPerRow)>;
/// Plain heap memory.
BatchBuffer heapBatch(int64_t rows, int64_t floatsPerRow);

struct LoadedBatch {
    BatchBuffer buffer;
    int64_t rows = 0;        // samples in it (fewer than asked when unreadable ones were skipped)
    SampleTally tally;       // cache lookups and hits, skipped samples
    double busySeconds = 0;  // the time a worker spent preparing it
};

class Loader {
public:
    Loader(std::shared_ptr<SampleSource> source, int workers, int prefetch,
           BatchAllocator allocate = heapBatch);
    ~Loader();
    Loader(const Loader&) = delete;
    Loader& operator=(const Loader&) = delete;

    /// Starts a pass over `order` (indices into the source) in batches of `batch`; a pass still
    /// under way is abandoned. `seed` and `epoch` seed each sample's random steps.
    void start(std::vector<int64_t> order, int64_t batch, SampleMode mode, uint64_t seed, int64_t epoch);
    int64_t batches() const { return m_batches; }
    /// The pass's next batch, waiting for it; `waitSeconds` is how long that took. False after the
    /// last one. Rethrows a worker's error (DataError naming the file).
    bool next(LoadedBatch& out, double* waitSeconds = nullptr);
    int workers() const { return static_cast<int>(m_threads.size()); }
    SampleSource& source() { return *m_source; }

private:
    struct Pass {
        std::vector<int64_t> order;
        int64_t batch = 0;
        SampleMode mode = SampleMode::Train;
        uint64_t seed = 0;
        int64_t epoch = 0;
    };
    struct Result {
        LoadedBatch batch;
        std::exception_ptr error;
    };
    LoadedBatch prepare(const Pass& pass, int64_t b);
    void work();

    std::shared_ptr<SampleSource> m_source;
    const int m_prefetch;
    const BatchAllocator m_allocate;
    std::mutex m_mu;
    std::condition_variable m_cv;
    bool m_stop = false;
    std::shared_ptr<const Pass> m_pass;
    uint64_t m_generation = 0;
    int64_t m_batches = 0, m_claimed = 0, m_consumed = 0;
    std::map<int64_t, Result> m_ready;
    std::vector<std::thread> m_threads;
};

}  // namespace lathe::core::data

// The int8 GEMM: scalar reference, weight packing, row quantization, the epilogue, the dispatcher
// and the small thread pool the GEMM splits its column blocks over. The SIMD drivers are in
// qgemm_avx2.cpp, qgemm_avx512.cpp and qgemm_amx.cpp. Built with -ffp-contract=off (the
// epilogue's bits must not depend on the compiler's choice to fuse).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "compress_internal.h"
#include "lathe/kernels/info.h"
#include "qgemm_internal.h"

namespace lathe::kernels {

namespace detail {

void Epilogue::apply(std::size_t m0, std::size_t rows, std::size_t col0, std::size_t cols,
                     const std::int32_t* tile, std::size_t ldt) const noexcept {
    if (col0 >= n) return;
    cols = std::min(cols, n - col0);
    if (c) {
        for (std::size_t r = 0; r < rows; ++r)
            std::memcpy(c + (m0 + r) * ldc + col0, tile + r * ldt, cols * sizeof(std::int32_t));
        return;
    }
    for (std::size_t r = 0; r < rows; ++r) {
        const float sa = rowScales[m0 + r];
        const std::int32_t* t = tile + r * ldt;
        float* out = y + (m0 + r) * ldy + col0;
        const float* sw = colScales + col0;
        if (bias) {
            const float* b = bias + col0;
            for (std::size_t j = 0; j < cols; ++j) out[j] = static_cast<float>(t[j]) * (sa * sw[j]) + b[j];
        } else {
            for (std::size_t j = 0; j < cols; ++j) out[j] = static_cast<float>(t[j]) * (sa * sw[j]);
        }
        if (relu)
            for (std::size_t j = 0; j < cols; ++j)
                out[j] = out[j] > 0.f ? out[j] : (out[j] == out[j] ? 0.f : out[j]);
    }
}

bool rowScale(float amax, float fixedScale, float& scale, float& inv, bool& divide) noexcept {
    divide = false;
    if (nonFinite(amax)) {
        scale = fromBits(kCanonicalNan);
        return false;
    }
    if (fixedScale > 0.f) {
        scale = fixedScale;
        inv = 1.f / fixedScale;
    } else {
        scale = amax / 127.f;
        if (scale == 0.f) return false;
        inv = 127.f / amax;
    }
    divide = nonFinite(inv);
    return true;
}

bool beginRow(std::uint32_t amaxBits, float fixedScale, std::int8_t* out, std::size_t ldq, float& scale,
              float& inv, bool& divide) noexcept {
    std::memset(out, 0, ldq);
    return rowScale(fromBits(amaxBits), fixedScale, scale, inv, divide);
}

void quantizeRowsScalar(const float* x, std::size_t r0, std::size_t r1, std::size_t k, std::size_t ldx,
                        std::int8_t* q, std::size_t ldq, float* scales, float fixedScale) noexcept {
    for (std::size_t r = r0; r < r1; ++r) {
        const float* row = x + r * ldx;
        std::int8_t* out = q + r * ldq;
        std::uint32_t amaxBits = 0;
        for (std::size_t i = 0; i < k; ++i) amaxBits = std::max(amaxBits, bits(row[i]) & kAbsMask);
        float inv = 0.f;
        bool divide = false;
        if (!beginRow(amaxBits, fixedScale, out, ldq, scales[r], inv, divide)) continue;
        for (std::size_t i = 0; i < k; ++i) out[i] = codeOf(divide ? row[i] / scales[r] : row[i] * inv);
    }
}

void gemmRangeScalar(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept {
    const std::size_t groups = j.kp / 4;
    std::int32_t tile[kQBlockN];
    for (std::size_t nb = nb0; nb < nb1; ++nb) {
        const std::int8_t* b = j.packed + nb * groups * 64;
        for (std::size_t m = 0; m < j.m; ++m) {
            const std::int8_t* a = j.a + m * j.kp;
            for (std::size_t c = 0; c < kQBlockN; ++c) {
                std::int32_t acc = 0;
                for (std::size_t g = 0; g < groups; ++g)
                    for (std::size_t t = 0; t < 4; ++t)
                        acc += static_cast<std::int32_t>(a[g * 4 + t]) * b[g * 64 + c * 4 + t];
                tile[c] = acc;
            }
            e.apply(m, 1, nb * kQBlockN, kQBlockN, tile, kQBlockN);
        }
    }
}

bool amxPermitted() noexcept {
#if defined(__linux__) && defined(__x86_64__)
    static const bool granted = [] {
        constexpr long kArchReqXcompPerm = 0x1023;
        constexpr long kXfeatureXtiledata = 18;
        return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return granted;
#else
    return false;
#endif
}

}  // namespace detail

namespace {

using namespace detail;

#if defined(__x86_64__) || defined(__i386__)
bool cpuid7(unsigned& ebx, unsigned& ecx, unsigned& edx) noexcept {
    unsigned eax = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    return true;
}
#endif

bool hwVnni() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

bool hwAmx() noexcept {
#if defined(__x86_64__)
    unsigned ebx = 0, ecx = 0, edx = 0;
    if (!cpuid7(ebx, ecx, edx)) return false;
    const bool tile = (edx >> 24) & 1u, int8 = (edx >> 25) & 1u;
    // The epilogue around the tiles is AVX-512; every AMX CPU has it, but be sure.
    return tile && int8 && hwVnni() && amxPermitted();
#else
    return false;
#endif
}

GemmIsa detectBest() noexcept {
    GemmIsa best = gemmIsaAvailable(GemmIsa::Amx)          ? GemmIsa::Amx
                   : gemmIsaAvailable(GemmIsa::Avx512Vnni) ? GemmIsa::Avx512Vnni
                   : gemmIsaAvailable(GemmIsa::Avx2)       ? GemmIsa::Avx2
                                                           : GemmIsa::Scalar;
    if (const char* cap = std::getenv("LATHE_KERNELS_ISA")) {
        GemmIsa wanted = best;
        if (std::strcmp(cap, "scalar") == 0)
            wanted = GemmIsa::Scalar;
        else if (std::strcmp(cap, "avx2") == 0)
            wanted = GemmIsa::Avx2;
        else if (std::strcmp(cap, "avx512") == 0 || std::strcmp(cap, "avx512-vnni") == 0)
            wanted = GemmIsa::Avx512Vnni;
        else if (std::strcmp(cap, "amx") == 0)
            wanted = GemmIsa::Amx;
        if (static_cast<int>(wanted) < static_cast<int>(best)) best = wanted;
    }
    return best;
}

// ---- the pool -------------------------------------------------------------------------------

int defaultThreads() noexcept {
    if (const char* env = std::getenv("LATHE_KERNEL_THREADS")) {
        const int n = std::atoi(env);
        if (n >= 1) return std::min(n, 256);
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

std::atomic<int> g_threads{0};

// Workers wait for a generation number to change, then take task indices from a shared counter
// alongside the calling thread. One job at a time: a second caller runs its job inline.
class Pool {
public:
    static Pool& instance() {
        static Pool* pool = new Pool;  // never destroyed: workers may outlive static destructors
        return *pool;
    }

    void run(std::size_t tasks, int threads, void (*fn)(void*, std::size_t), void* ctx) {
        std::unique_lock<std::mutex> busy(m_busy, std::try_to_lock);
        if (!busy.owns_lock() || threads <= 1 || tasks <= 1) {
            for (std::size_t t = 0; t < tasks; ++t) fn(ctx, t);
            return;
        }
        ensureWorkers(threads - 1);
        {
            std::lock_guard<std::mutex> lk(m_mutex);
            m_fn = fn;
            m_ctx = ctx;
            m_tasks = tasks;
            m_next.store(0);
            m_helpers = std::min<int>(threads - 1, static_cast<int>(m_workers.size()));
            m_active = 0;
            m_open = true;
            ++m_generation;
        }
        m_wake.notify_all();
        work(fn, ctx, tasks);
        // Every task is taken. Close the job: a helper that wakes only now (its core was busy,
        // say with another library's spinning threads) stays out, and only the helpers that did
        // join are waited for. The caller never waits for a thread that has not started.
        std::unique_lock<std::mutex> lk(m_mutex);
        m_open = false;
        m_done.wait(lk, [&] { return m_active == 0; });
    }

private:
    void work(void (*fn)(void*, std::size_t), void* ctx, std::size_t tasks) {
        for (std::size_t t = m_next.fetch_add(1); t < tasks; t = m_next.fetch_add(1)) fn(ctx, t);
    }

    void ensureWorkers(int n) {
        while (static_cast<int>(m_workers.size()) < n) {
            const int index = static_cast<int>(m_workers.size());
            m_workers.emplace_back([this, index] { loop(index); });
            m_workers.back().detach();
        }
    }

    void loop(int index) {
        std::uint64_t seen = 0;
        for (;;) {
            void (*fn)(void*, std::size_t);
            void* ctx;
            std::size_t tasks;
            {
                std::unique_lock<std::mutex> lk(m_mutex);
                m_wake.wait(lk, [&] { return m_generation != seen; });
                seen = m_generation;
                if (!m_open || index >= m_helpers) continue;  // closed, or fewer threads asked
                ++m_active;
                fn = m_fn;
                ctx = m_ctx;
                tasks = m_tasks;
            }
            work(fn, ctx, tasks);
            {
                std::lock_guard<std::mutex> lk(m_mutex);
                if (--m_active == 0) m_done.notify_one();
            }
        }
    }

    std::mutex m_busy;   // held by the one caller whose job the workers run
    std::mutex m_mutex;  // guards the job description and counters below
    std::condition_variable m_wake, m_done;
    std::vector<std::thread> m_workers;
    std::uint64_t m_generation = 0;
    void (*m_fn)(void*, std::size_t) = nullptr;
    void* m_ctx = nullptr;
    std::size_t m_tasks = 0;
    int m_helpers = 0;
    int m_active = 0;     // helpers inside the current job
    bool m_open = false;  // whether helpers may still join it
    std::atomic<std::size_t> m_next{0};
};

void (*rangeFn(GemmIsa isa))(const GemmJob&, std::size_t, std::size_t, const Epilogue&) noexcept {
    switch (isa) {
        case GemmIsa::Amx:
            return gemmRangeAmx;
        case GemmIsa::Avx512Vnni:
            return gemmRangeAvx512Vnni;
        case GemmIsa::Avx2:
            return gemmRangeAvx2;
        case GemmIsa::Scalar:
            break;
    }
    return gemmRangeScalar;
}

struct RunCtx {
    const GemmJob* job;
    const Epilogue* epilogue;
    void (*fn)(const GemmJob&, std::size_t, std::size_t, const Epilogue&) noexcept;
    std::size_t blocksPerTask;
};

void runTask(void* p, std::size_t t) {
    const auto& c = *static_cast<const RunCtx*>(p);
    const std::size_t b0 = t * c.blocksPerTask;
    const std::size_t b1 = std::min(c.job->blocks, b0 + c.blocksPerTask);
    if (b0 < b1) c.fn(*c.job, b0, b1, *c.epilogue);
}

void runGemm(const GemmJob& job, const Epilogue& e, GemmIsa isa) {
    if (!gemmIsaAvailable(isa)) isa = bestGemmIsa();
    if (job.m == 0 || job.blocks == 0) return;
    const int nt = threads();
    // Work per task: enough that waking a thread for it pays (a wake-up costs microseconds;
    // more when another library's threads hold the cores), so a small layer or a batch of one
    // runs on the calling thread. The faster the path, the more multiply-adds that takes: about
    // 20 us of work on each. An even number of blocks (the VNNI and AMX drivers take two at a
    // time).
    const std::size_t perBlock = job.m * job.kp * kQBlockN;
    const std::size_t minWork = std::size_t{1} << (isa == GemmIsa::Amx          ? 22
                                                   : isa == GemmIsa::Avx512Vnni ? 21
                                                   : isa == GemmIsa::Avx2       ? 18
                                                                                : 16);
    std::size_t minBlocks = std::max<std::size_t>(2, minWork / std::max<std::size_t>(perBlock, 1));
    std::size_t tasks = std::max<std::size_t>(1, std::min<std::size_t>(job.blocks / minBlocks, nt * 2));
    std::size_t per = (job.blocks + tasks - 1) / tasks;
    per += per & 1;
    tasks = (job.blocks + per - 1) / per;
    GemmJob run = job;
    if (isa == GemmIsa::Avx512Vnni) {  // its operand is a + 128, made once here for all threads
        thread_local std::vector<std::int8_t> biased;
        biased.resize(job.m * job.kp);
        biasCodesAvx512(job.a, biased.size(), biased.data());
        run.a = biased.data();
    }
    RunCtx ctx{&run, &e, rangeFn(isa), per};
    Pool::instance().run(tasks, nt, runTask, &ctx);
}

thread_local std::vector<std::int8_t> t_rows;
thread_local std::vector<float> t_scales;

}  // namespace

const char* gemmIsaName(GemmIsa isa) noexcept {
    switch (isa) {
        case GemmIsa::Scalar:
            return "scalar";
        case GemmIsa::Avx2:
            return "avx2";
        case GemmIsa::Avx512Vnni:
            return "avx512-vnni";
        case GemmIsa::Amx:
            return "amx";
    }
    return "unknown";
}

bool gemmIsaAvailable(GemmIsa isa) noexcept {
    switch (isa) {
        case GemmIsa::Scalar:
            return true;
        case GemmIsa::Avx2:
            return cpuIsaAvailable(CpuIsa::Avx2);
        case GemmIsa::Avx512Vnni: {
            static const bool v = hwVnni();
            return v;
        }
        case GemmIsa::Amx: {
            static const bool a = hwAmx();
            return a;
        }
    }
    return false;
}

GemmIsa bestGemmIsa() noexcept {
    static const GemmIsa best = detectBest();
    return best;
}

int threads() noexcept {
    const int n = g_threads.load();
    if (n >= 1) return n;
    static const int def = defaultThreads();
    return def;
}

void setThreads(int n) noexcept { g_threads.store(n >= 1 ? std::min(n, 256) : 0); }

void quantizeWeights(const float* w, std::size_t n, std::size_t k, std::size_t ldw, std::int8_t* q,
                     float* scales) noexcept {
    quantizeRowsScalar(w, 0, n, k, ldw, q, k, scales, 0.f);
}

void packWeights(const std::int8_t* q, std::size_t n, std::size_t k, std::size_t ldq, std::int8_t* packed,
                 std::int32_t* colSums) noexcept {
    const std::size_t np = qPaddedN(n), kp = qPaddedK(k), groups = kp / 4;
    std::memset(packed, 0, np * kp);
    for (std::size_t col = 0; col < np; ++col) {
        std::int32_t sum = 0;
        if (col < n) {
            std::int8_t* block = packed + (col / kQBlockN) * groups * 64 + (col % kQBlockN) * 4;
            const std::int8_t* row = q + col * ldq;
            for (std::size_t i = 0; i < k; ++i) {
                block[(i / 4) * 64 + i % 4] = row[i];
                sum += row[i];
            }
        }
        colSums[col] = sum;
    }
}

void quantizeRows(const float* x, std::size_t m, std::size_t k, std::size_t ldx, std::int8_t* q,
                  std::size_t ldq, float* scales, float fixedScale, GemmIsa isa) noexcept {
    if (isa != GemmIsa::Scalar && gemmIsaAvailable(GemmIsa::Avx2))
        quantizeRowsAvx2(x, m, k, ldx, q, ldq, scales, fixedScale);
    else
        quantizeRowsScalar(x, 0, m, k, ldx, q, ldq, scales, fixedScale);
}

void gemmS8S32(const std::int8_t* a, std::size_t m, std::size_t k, const std::int8_t* packed,
               const std::int32_t* colSums, std::size_t n, std::int32_t* c, std::size_t ldc, GemmIsa isa) {
    GemmJob job{a, m, qPaddedK(k), packed, colSums, qPaddedN(n) / kQBlockN};
    Epilogue e;
    e.c = c;
    e.ldc = ldc;
    e.n = n;
    runGemm(job, e, isa);
}

void qlinearQuantized(const std::int8_t* a, const float* rowScales, std::size_t m, const QLinear& w, float* y,
                      std::size_t ldy, bool relu, GemmIsa isa) {
    GemmJob job{a, m, qPaddedK(w.k), w.packed, w.colSums, qPaddedN(w.n) / kQBlockN};
    Epilogue e;
    e.y = y;
    e.ldy = ldy;
    e.rowScales = rowScales;
    e.colScales = w.scales;
    e.bias = w.bias;
    e.relu = relu;
    e.n = w.n;
    runGemm(job, e, isa);
}

void qlinear(const float* x, std::size_t m, std::size_t ldx, const QLinear& w, float* y, std::size_t ldy,
             bool relu, float fixedInputScale, GemmIsa isa) {
    const std::size_t kp = qPaddedK(w.k);
    if (t_rows.size() < m * kp) t_rows.resize(m * kp);
    if (t_scales.size() < m) t_scales.resize(m);
    quantizeRows(x, m, w.k, ldx, t_rows.data(), kp, t_scales.data(), fixedInputScale, isa);
    qlinearQuantized(t_rows.data(), t_scales.data(), m, w, y, ldy, relu, isa);
}

}  // namespace lathe::kernels

#include "training/profiler.h"

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <charconv>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/kernels/cuda_device.h"

namespace lathe::core {
namespace {

// RecordFunction callbacks are plain function pointers: they reach the active profiler here.
// One profiled run at a time per process (the trainer owns it for the run's duration).
std::atomic<Profiler*> g_active{nullptr};
// Callbacks in progress: a profiler waits for them to drain before it goes away.
std::atomic<int> g_inflight{0};

struct InflightGuard {
    InflightGuard() { g_inflight.fetch_add(1, std::memory_order_seq_cst); }
    ~InflightGuard() { g_inflight.fetch_sub(1, std::memory_order_seq_cst); }
};
std::atomic<int64_t> g_nextThread{1};
thread_local int64_t t_thread = -1;

int64_t threadNumber() {
    if (t_thread < 0) t_thread = g_nextThread.fetch_add(1);
    return t_thread;
}

struct OpContext : at::ObserverContext {
    int64_t startNs = 0;
    std::string shapes;
    void* startEvent = nullptr;  // CUDA event before the op, when its device time is measured
};

// The CUDA runtime's current device is per thread: the profiler's events belong to the run's GPU.
thread_local int t_cudaDevice = -1;

// An event recorded now on the run's GPU (default stream), or nullptr when that fails.
void* recordEvent(Profiler* p) {
    try {
        if (t_cudaDevice != p->cudaDevice()) {
            kernels::cuda::setDevice(p->cudaDevice());
            t_cudaDevice = p->cudaDevice();
        }
        void* e = p->takeEvent();
        try {
            kernels::cuda::eventRecord(e);
        } catch (const std::exception&) {
            p->returnEvent(e);
            throw;
        }
        return e;
    } catch (const std::exception&) {
        return nullptr;
    }
}

// "[64, 784], [512, 784]": built with plain appends, since it runs for every op of a recorded
// step and ostringstream costs several times more. `cuda`: whether any input is on a GPU.
std::string shapesOf(const at::RecordFunction& fn, bool& cuda) {
    std::string out;
    out.reserve(48);
    char buf[24];
    cuda = false;
    for (const auto& v : fn.inputs()) {
        if (!v.isTensor()) continue;
        if (!out.empty()) out += ", ";
        const auto& t = v.toTensor();
        out += '[';
        if (t.defined()) {
            cuda = cuda || t.is_cuda();
            const auto sizes = t.sizes();
            for (size_t i = 0; i < sizes.size(); ++i) {
                if (i) out += ", ";
                const auto r = std::to_chars(buf, buf + sizeof buf, sizes[i]);
                out.append(buf, r.ptr);
            }
        }
        out += ']';
    }
    return out;
}

std::unique_ptr<at::ObserverContext> onStart(const at::RecordFunction& fn) {
    InflightGuard inflight;
    Profiler* p = g_active.load(std::memory_order_seq_cst);
    if (!p || !p->recording()) return nullptr;
    auto ctx = std::make_unique<OpContext>();
    bool cuda = false;
    ctx->shapes = shapesOf(fn, cuda);
    if (cuda && p->cudaDevice() >= 0) ctx->startEvent = recordEvent(p);
    ctx->startNs = p->nowNs();
    return ctx;
}

void onEnd(const at::RecordFunction& fn, at::ObserverContext* raw) {
    InflightGuard inflight;
    Profiler* p = g_active.load(std::memory_order_seq_cst);
    if (!raw) return;
    auto* ctx = static_cast<OpContext*>(raw);
    if (!p) {  // the profiler went away mid-op: its pool is gone, the event goes with it
        kernels::cuda::eventDestroy(ctx->startEvent);
        return;
    }
    const int64_t end = p->nowNs();
    void* endEvent = ctx->startEvent ? recordEvent(p) : nullptr;
    ProfileSpan span;
    span.kind = ProfileSpan::Kind::Op;
    span.name = fn.name();
    span.shapes = std::move(ctx->shapes);
    span.step = p->currentStep();
    span.thread = threadNumber();
    span.startNs = ctx->startNs;
    span.durationNs = end - ctx->startNs;
    p->addOp(std::move(span), ctx->startEvent, endEvent);  // a start without an end goes back to the pool
}

}  // namespace

Profiler::Profiler(ProfileSchedule schedule)
    : m_schedule(schedule),
      m_origin(std::chrono::steady_clock::now()),
      // Span times are nanoseconds since the Unix epoch (steady clock for the intervals), so a
      // resumed run's spans follow its earlier ones instead of overlapping them.
      m_originWallNs(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count()) {
    // Claimed up front: a second profiled run in this process fails before its first step,
    // not when its schedule first attaches.
    Profiler* expected = nullptr;
    if (!g_active.compare_exchange_strong(expected, this))
        throw Error("another run in this process is being profiled; profile one run at a time");
    t_thread = 0;  // the trainer's thread is lane 0
}

Profiler::~Profiler() {
    detach();
    // A store followed by a load of another variable: only seq_cst keeps them in order (x86
    // lets a plain store pass a later load), so a callback either sees null or is counted.
    g_active.store(nullptr, std::memory_order_seq_cst);
    // A callback that loaded the pointer before it was cleared may still be running.
    while (g_inflight.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    for (const auto& d : m_deviceTimed) {
        kernels::cuda::eventDestroy(d.start);
        kernels::cuda::eventDestroy(d.end);
    }
    for (void* e : m_freeEvents) kernels::cuda::eventDestroy(e);
}

int64_t Profiler::nowNs() const {
    return m_originWallNs +
           std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - m_origin)
               .count();
}

void Profiler::attach() {
    if (m_attached) return;
    m_handle =
        at::addGlobalCallback(at::RecordFunctionCallback(&onStart, &onEnd)
                                  .needsInputs(true)
                                  .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    m_attached = true;
}

void Profiler::detach() {
    if (!m_attached) return;
    at::removeCallback(m_handle);
    m_attached = false;
}

void Profiler::beginStep(int64_t step) {
    m_step.store(step, std::memory_order_relaxed);
    if (m_schedule.attached(step))
        attach();
    else
        detach();
    m_recording.store(m_schedule.recording(step), std::memory_order_relaxed);
}

void Profiler::addPhase(const char* name, int64_t startNs, int64_t endNs, int64_t cudaNs) {
    ProfileSpan span;
    span.kind = ProfileSpan::Kind::Phase;
    span.name = name;
    span.step = currentStep();
    span.thread = 0;
    span.startNs = startNs;
    span.durationNs = endNs - startNs;
    span.cudaNs = cudaNs;
    std::lock_guard<std::mutex> lk(m_mutex);
    m_spans.push_back(std::move(span));
}

void Profiler::addOp(ProfileSpan&& span, void* startEvent, void* endEvent) {
    std::lock_guard<std::mutex> lk(m_mutex);
    if (startEvent && endEvent)
        m_deviceTimed.push_back({m_spans.size(), startEvent, endEvent});
    else if (startEvent)
        m_freeEvents.push_back(startEvent);
    m_spans.push_back(std::move(span));
}

void Profiler::returnEvent(void* event) {
    std::lock_guard<std::mutex> lk(m_mutex);
    m_freeEvents.push_back(event);
}

void* Profiler::takeEvent() {
    {
        std::lock_guard<std::mutex> lk(m_mutex);
        if (!m_freeEvents.empty()) {
            void* e = m_freeEvents.back();
            m_freeEvents.pop_back();
            return e;
        }
    }
    return kernels::cuda::eventCreate();
}

std::vector<ProfileSpan> Profiler::takeSpans() {
    std::vector<ProfileSpan> out;
    std::vector<DeviceTimed> timed;
    {
        std::lock_guard<std::mutex> lk(m_mutex);
        out.swap(m_spans);
        timed.swap(m_deviceTimed);
    }
    // Device times once the step's work is done (waiting on each op's end event); the events
    // go back to the pool.
    for (const auto& d : timed) {
        try {
            out[d.span].cudaNs = static_cast<int64_t>(kernels::cuda::eventElapsedMs(d.start, d.end) * 1e6);
        } catch (const std::exception&) {
            // left at -1: not measured
        }
    }
    std::lock_guard<std::mutex> lk(m_mutex);
    for (const auto& d : timed) {
        m_freeEvents.push_back(d.start);
        m_freeEvents.push_back(d.end);
    }
    if (m_laneOffset != 0)
        for (auto& span : out) span.thread += m_laneOffset;
    return out;
}

}  // namespace lathe::core

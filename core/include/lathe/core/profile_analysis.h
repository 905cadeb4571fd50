#pragma once
// Profiles of training runs: op-level spans from LibTorch's RecordFunction callbacks and the
// trainer's step phases, stored with the run; summaries (top ops) and Chrome trace export.
// Torch-free: plain structs only.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace lathe::core {

/// Spans of pipeline stage s > 0 (its first replica's process) are on threads
/// s * kStageLaneStride + t, so a run's timeline has lanes per stage; thread t < kStageLaneStride
/// is rank 0's (stage 0).
constexpr int64_t kStageLaneStride = 1000;

struct ProfileSpan {
    enum class Kind { Op, Phase };
    Kind kind = Kind::Op;
    std::string name;     // ATen op ("aten::addmm") or phase ("data", "forward", "backward", "optimizer",
                          // "communication")
    std::string shapes;   // input shapes, e.g. "[64, 64], [128, 64]" (ops only; may be empty)
    int64_t step = 0;     // global step the span belongs to (1-based, like metrics)
    int64_t thread = 0;   // small per-run thread number (0 = the training thread)
    int64_t startNs = 0;  // nanoseconds since the Unix epoch (intervals from a steady clock)
    int64_t durationNs = 0;
    int64_t cudaNs = -1;  // device time when measured on a GPU, else -1
};

inline int64_t spanStage(const ProfileSpan& s) { return s.thread / kStageLaneStride; }

/// Profiler schedule, like torch.profiler.schedule: skip `wait` steps, run `warmup` steps with
/// the callbacks attached but nothing kept, record `active` steps; repeat the cycle `repeat`
/// times (0 = until the run ends).
struct ProfileSchedule {
    int64_t wait = 5;
    int64_t warmup = 1;
    int64_t active = 5;
    int64_t repeat = 1;
    /// Is `step` (1-based) recorded / has the profiler attached?
    bool recording(int64_t step) const;
    bool attached(int64_t step) const;
};

struct OpSummary {
    std::string name;
    int64_t calls = 0;
    int64_t totalNs = 0;       // inclusive
    int64_t selfNs = 0;        // exclusive of nested ops
    double share = 0;          // selfNs / sum of all selfNs
    int64_t cudaTotalNs = -1;  // device time of the calls measured on a GPU (inclusive); -1: none
    int64_t cudaSelfNs = -1;   // the same, exclusive of nested ops' device time
};

struct PhaseSummary {
    int64_t step = 0;
    std::vector<std::pair<std::string, int64_t>> phases;  // phase name -> ns, in step order
};

/// Heaviest ops by self time (all of them when top <= 0). Nesting is derived per thread from
/// the intervals, so self times add up to the op time that is not covered by child ops.
std::vector<OpSummary> topOps(const std::vector<ProfileSpan>& spans, int top = 0);
/// Per-step phase durations (for the stacked bar of step phases): rank 0's (a pipeline's first
/// stage), not summed over stages.
std::vector<PhaseSummary> phasesByStep(const std::vector<ProfileSpan>& spans);
/// Chrome trace-event JSON ({"traceEvents": [...]} with complete "X" events, µs), which
/// Perfetto and chrome://tracing open. Phases and ops share their thread's lane.
void writeChromeTrace(const std::vector<ProfileSpan>& spans, std::ostream& out,
                      const std::string& processName);

}  // namespace lathe::core

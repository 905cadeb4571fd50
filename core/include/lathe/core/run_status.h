#pragma once
// A run's status: one enum for the trainer, the launcher, the store, the CLI and the GUI. The
// names below are what the event stream, the workspace file and `--json` output carry.
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace lathe::core {

enum class RunStatus {
    Created,      // recorded, not started yet
    Running,      // a process is training or ingesting it (and holds its lock)
    Completed,    // trained every epoch
    Stopped,      // stopped on request (Ctrl+C, the GUI's Stop): resumable
    Failed,       // ended by an error, kept with the run
    Interrupted,  // recorded as running, but its process is gone (killed, power loss): resumable
};

constexpr const char* toString(RunStatus s) noexcept {
    switch (s) {
        case RunStatus::Created:
            return "created";
        case RunStatus::Running:
            return "running";
        case RunStatus::Completed:
            return "completed";
        case RunStatus::Stopped:
            return "stopped";
        case RunStatus::Failed:
            return "failed";
        case RunStatus::Interrupted:
            return "interrupted";
    }
    return "unknown";
}

/// The status named `text`, or nothing for a name this build does not know.
constexpr std::optional<RunStatus> runStatusFromString(std::string_view text) noexcept {
    for (auto s : {RunStatus::Created, RunStatus::Running, RunStatus::Completed, RunStatus::Stopped,
                   RunStatus::Failed, RunStatus::Interrupted})
        if (std::string_view(toString(s)) == text) return s;
    return std::nullopt;
}

/// A run in this status will not change again unless resumed.
constexpr bool isFinal(RunStatus s) noexcept {
    return s == RunStatus::Completed || s == RunStatus::Stopped || s == RunStatus::Failed;
}

/// What an interrupted run needs said, for lists and tooltips; `runId` 0 writes "ID".
inline std::string interruptedHint(int64_t runId = 0) {
    return "its process is gone (killed, or the machine went down); continue it from its last checkpoint "
           "with "
           "lathectl train --resume " +
           (runId > 0 ? std::to_string(runId) : std::string("ID"));
}

inline std::ostream& operator<<(std::ostream& out, RunStatus s) { return out << toString(s); }

}  // namespace lathe::core

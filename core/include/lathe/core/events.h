#pragma once
// The event stream: versioned, newline-delimited JSON records that every run produces,
// in-process or from `lathectl worker` on stdout (and, once remote runs exist, over SSH). A
// saved stream replays through the same reader.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "lathe/core/profile_analysis.h"
#include "lathe/core/run_status.h"

namespace lathe::core {

// Version 2 added span records; version-1 streams are still read.
inline constexpr int kEventStreamVersion = 2;

struct Event {
    enum class Type { Run, Metric, Log, Status, Checkpoint, Error, Span };
    Type type = Type::Log;
    int rank = 0;
    double wallTime = 0.0;  // seconds since the Unix epoch
    // Metric
    std::string key;
    int64_t step = 0;
    double value = 0.0;
    // Run (first record of a worker's stream): text = the RunSpec as TOML, level = host.
    // Log: level + text; Status: text = "running" | "completed" | "failed" | "stopped", step =
    // global step reached, value = total steps planned (for progress bars);
    // Error: text = message; Checkpoint: text = path, sha256, step = global step, value = epoch
    std::string level;
    std::string text;
    std::string sha256;
    // Span: one profiled op or step phase.
    ProfileSpan span;

    static Event run(std::string configToml, std::string host);
    static Event metric(std::string key, int64_t step, double value);
    static Event log(std::string level, std::string text);
    static Event status(RunStatus status);
    static Event error(std::string message);
    static Event profileSpan(ProfileSpan span);
    static Event checkpoint(std::string path, std::string sha256, int64_t step, int64_t epoch);
};

using EventSink = std::function<void(const Event&)>;

double nowSeconds();
const char* typeName(Event::Type t);

/// One line of JSON, without the trailing newline.
std::string encodeEvent(const Event& e);
/// Throws EventStreamError on malformed JSON, missing fields, unknown type or a newer version.
Event decodeEvent(const std::string& line);
/// Reads a whole stream; blank lines are skipped. Errors name the line number.
void readEventStream(std::istream& in, const EventSink& sink);

/// The longest record a stream may hold. A longer line is not a record of ours (a remote worker
/// gone wrong, a file that is not a stream), and reading it whole could take any amount of memory.
constexpr size_t kMaxEventLine = size_t{16} << 20;
/// std::getline for event streams: false at the end; throws EventStreamError for a line longer
/// than kMaxEventLine, having read no more of it than that.
bool readEventLine(std::istream& in, std::string& line);

}  // namespace lathe::core

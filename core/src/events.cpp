#include "lathe/core/events.h"

#include <chrono>
#include <cmath>
#include <istream>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "lathe/core/error.h"

namespace lathe::core {

using nlohmann::json;

Event Event::run(std::string configToml, std::string host) {
    Event e;
    e.type = Type::Run;
    e.wallTime = nowSeconds();
    e.text = std::move(configToml);
    e.level = std::move(host);
    return e;
}

Event Event::metric(std::string key, int64_t step, double value) {
    Event e;
    e.type = Type::Metric;
    e.wallTime = nowSeconds();
    e.key = std::move(key);
    e.step = step;
    e.value = value;
    return e;
}

Event Event::log(std::string level, std::string text) {
    Event e;
    e.type = Type::Log;
    e.wallTime = nowSeconds();
    e.level = std::move(level);
    e.text = std::move(text);
    return e;
}

Event Event::status(RunStatus status) {
    Event e;
    e.type = Type::Status;
    e.wallTime = nowSeconds();
    e.text = toString(status);
    return e;
}

Event Event::error(std::string message) {
    Event e;
    e.type = Type::Error;
    e.wallTime = nowSeconds();
    e.text = std::move(message);
    return e;
}

Event Event::profileSpan(ProfileSpan span) {
    Event e;
    e.type = Type::Span;
    e.wallTime = nowSeconds();
    e.step = span.step;
    e.span = std::move(span);
    return e;
}

Event Event::checkpoint(std::string path, std::string sha256, int64_t step, int64_t epoch) {
    Event e;
    e.type = Type::Checkpoint;
    e.wallTime = nowSeconds();
    e.text = std::move(path);
    e.sha256 = std::move(sha256);
    e.step = step;
    e.value = static_cast<double>(epoch);
    return e;
}

double nowSeconds() {
    using namespace std::chrono;
    return duration<double>(system_clock::now().time_since_epoch()).count();
}

const char* typeName(Event::Type t) {
    switch (t) {
        case Event::Type::Run:
            return "run";
        case Event::Type::Metric:
            return "metric";
        case Event::Type::Log:
            return "log";
        case Event::Type::Status:
            return "status";
        case Event::Type::Checkpoint:
            return "checkpoint";
        case Event::Type::Error:
            return "error";
        case Event::Type::Span:
            return "span";
    }
    return "?";
}

std::string encodeEvent(const Event& e) {
    json j;
    j["v"] = kEventStreamVersion;
    j["type"] = typeName(e.type);
    j["t"] = e.wallTime;
    if (e.rank != 0) j["rank"] = e.rank;
    switch (e.type) {
        case Event::Type::Run:
            j["config"] = e.text;
            j["host"] = e.level;
            break;
        case Event::Type::Metric:
            j["key"] = e.key;
            j["step"] = e.step;
            // JSON has no inf/NaN: a diverged loss is still worth recording, as a string.
            if (std::isfinite(e.value))
                j["value"] = e.value;
            else
                j["value"] = std::isnan(e.value) ? "nan" : (e.value > 0 ? "inf" : "-inf");
            break;
        case Event::Type::Log:
            j["level"] = e.level;
            j["msg"] = e.text;
            break;
        case Event::Type::Status:
            j["status"] = e.text;
            if (e.step) j["step"] = e.step;
            if (e.value > 0) j["total_steps"] = static_cast<int64_t>(e.value);
            break;
        case Event::Type::Error:
            j["msg"] = e.text;
            break;
        case Event::Type::Span:
            j["kind"] = e.span.kind == ProfileSpan::Kind::Phase ? "phase" : "op";
            j["name"] = e.span.name;
            if (!e.span.shapes.empty()) j["shapes"] = e.span.shapes;
            j["step"] = e.span.step;
            if (e.span.thread) j["thread"] = e.span.thread;
            j["start_ns"] = e.span.startNs;
            j["dur_ns"] = e.span.durationNs;
            if (e.span.cudaNs >= 0) j["cuda_ns"] = e.span.cudaNs;
            break;
        case Event::Type::Checkpoint:
            j["path"] = e.text;
            j["sha256"] = e.sha256;
            j["step"] = e.step;
            j["epoch"] = static_cast<int64_t>(e.value);
            break;
    }
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

template <typename T>
T field(const json& j, const char* name) {
    auto it = j.find(name);
    if (it == j.end()) throw EventStreamError(std::string("missing field \"") + name + "\"");
    // nlohmann converts any number to an integer with a plain cast: 1.9 would read as 1, and
    // 4294967298 as a version 2. Integers must be integers, and in range.
    if constexpr (std::is_integral_v<T>) {
        if (!it->is_number_integer())
            throw EventStreamError(std::string("field \"") + name + "\" must be a whole number");
        const bool fits = it->is_number_unsigned()
                              ? it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                              : it->get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                    it->get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
        if (!fits) throw EventStreamError(std::string("field \"") + name + "\" is out of range");
    }
    try {
        return it->get<T>();
    } catch (const json::exception&) {
        throw EventStreamError(std::string("field \"") + name + "\" has the wrong type");
    }
}

// An optional whole-number field: `fallback` when absent.
int64_t optionalInt(const json& j, const char* name, int64_t fallback = 0) {
    return j.contains(name) ? field<int64_t>(j, name) : fallback;
}

double numberOrSpecial(const json& v) {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
        const auto s = v.get<std::string>();
        if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
        if (s == "inf") return std::numeric_limits<double>::infinity();
        if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    throw EventStreamError("field \"value\" is not a number");
}

}  // namespace

namespace {
Event decodeEventUnchecked(const std::string& line);
}  // namespace

Event decodeEvent(const std::string& line) {
    try {
        return decodeEventUnchecked(line);
    } catch (const json::exception& ex) {
        // A field of the wrong type (e.g. "step": "5"), from a foreign or damaged stream.
        throw EventStreamError(std::string("malformed record: ") + ex.what());
    }
}

namespace {
Event decodeEventUnchecked(const std::string& line) {
    json j;
    try {
        j = json::parse(line);
    } catch (const json::parse_error& ex) {
        throw EventStreamError(std::string("not JSON: ") + ex.what());
    }
    if (!j.is_object()) throw EventStreamError("record is not a JSON object");
    const int v = field<int>(j, "v");
    if (v > kEventStreamVersion || v < 1)
        throw EventStreamError("event stream version " + std::to_string(v) +
                               " is not supported by this Lathe (it reads version " +
                               std::to_string(kEventStreamVersion) + "); upgrade Lathe");
    Event e;
    const auto type = field<std::string>(j, "type");
    e.wallTime = j.value("t", 0.0);
    e.rank = j.contains("rank") ? field<int>(j, "rank") : 0;
    if (type == "run") {
        e.type = Event::Type::Run;
        e.text = field<std::string>(j, "config");
        e.level = j.value("host", "");
    } else if (type == "metric") {
        e.type = Event::Type::Metric;
        e.key = field<std::string>(j, "key");
        e.step = field<int64_t>(j, "step");
        if (e.step < 0) throw EventStreamError("field \"step\" must not be negative");
        if (!j.contains("value")) throw EventStreamError("missing field \"value\"");
        e.value = numberOrSpecial(j["value"]);
    } else if (type == "log") {
        e.type = Event::Type::Log;
        e.level = j.value("level", "info");
        e.text = field<std::string>(j, "msg");
    } else if (type == "status") {
        e.type = Event::Type::Status;
        e.text = field<std::string>(j, "status");
        // A stream reports what a worker is doing; "interrupted" is only ever inferred by readers.
        const auto st = runStatusFromString(e.text);
        if (!st || *st == RunStatus::Interrupted || *st == RunStatus::Created)
            throw EventStreamError("unknown run status \"" + e.text.substr(0, 40) +
                                   "\" (running, completed, stopped or failed)");
        e.step = optionalInt(j, "step");
        e.value = static_cast<double>(optionalInt(j, "total_steps"));
    } else if (type == "error") {
        e.type = Event::Type::Error;
        e.text = field<std::string>(j, "msg");
    } else if (type == "checkpoint") {
        e.type = Event::Type::Checkpoint;
        e.text = field<std::string>(j, "path");
        e.sha256 = j.value("sha256", "");
        e.step = optionalInt(j, "step");
        e.value = static_cast<double>(optionalInt(j, "epoch"));
    } else if (type == "span") {
        e.type = Event::Type::Span;
        const auto kind = field<std::string>(j, "kind");
        if (kind != "op" && kind != "phase") throw EventStreamError("span kind must be op or phase");
        e.span.kind = kind == "phase" ? ProfileSpan::Kind::Phase : ProfileSpan::Kind::Op;
        e.span.name = field<std::string>(j, "name");
        e.span.shapes = j.value("shapes", "");
        e.span.step = field<int64_t>(j, "step");
        e.span.thread = optionalInt(j, "thread");
        e.span.startNs = field<int64_t>(j, "start_ns");
        e.span.durationNs = field<int64_t>(j, "dur_ns");
        e.span.cudaNs = j.value("cuda_ns", int64_t{-1});
        e.step = e.span.step;
        // Untrusted: keep times and lanes in ranges that later arithmetic cannot overflow.
        constexpr int64_t kMaxNs = int64_t{1} << 62;
        if (e.span.startNs < 0 || e.span.startNs > kMaxNs || e.span.durationNs < 0 ||
            e.span.durationNs > kMaxNs || e.span.step < 0 || e.span.thread < 0 || e.span.thread > 4096 ||
            e.span.cudaNs < -1)
            throw EventStreamError("span record out of range (negative or huge time, step or thread)");
    } else {
        throw EventStreamError("unknown record type \"" + type + "\"");
    }
    return e;
}
}  // namespace

bool readEventLine(std::istream& in, std::string& line) {
    line.clear();
    auto* buf = in.rdbuf();
    if (!buf) return false;
    for (;;) {
        const int c = buf->sbumpc();
        if (c == std::char_traits<char>::eof()) {
            in.setstate(std::ios::eofbit);
            return !line.empty();
        }
        if (c == '\n') return true;
        if (line.size() >= kMaxEventLine)
            throw EventStreamError("a line longer than " + std::to_string(kMaxEventLine >> 20) +
                                   " MiB (not an event stream, or a worker gone wrong)");
        line.push_back(static_cast<char>(c));
    }
}

void readEventStream(std::istream& in, const EventSink& sink) {
    std::string line;
    int64_t lineNo = 0;
    for (;;) {
        try {
            if (!readEventLine(in, line)) break;
        } catch (const EventStreamError& ex) {
            throw EventStreamError("event stream line " + std::to_string(lineNo + 1) + ": " + ex.what());
        }
        ++lineNo;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        try {
            sink(decodeEvent(line));
        } catch (const EventStreamError& ex) {
            throw EventStreamError("event stream line " + std::to_string(lineNo) + ": " + ex.what());
        }
    }
}

}  // namespace lathe::core

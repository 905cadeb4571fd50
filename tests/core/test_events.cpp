#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>

#include "lathe/core/error.h"
#include "lathe/core/events.h"

using namespace lathe::core;

TEST_CASE("events round-trip through their JSON lines", "[events]") {
    for (const Event& e : {Event::metric("val/accuracy", 42, 0.97), Event::log("warn", "a \"quoted\"\nline"),
                           Event::status(lathe::core::RunStatus::Running), Event::error("boom"),
                           Event::checkpoint("/tmp/x.ckpt", std::string(64, 'a'), 230, 10)}) {
        const std::string line = encodeEvent(e);
        CHECK(line.find('\n') == std::string::npos);
        const Event back = decodeEvent(line);
        CHECK(back.type == e.type);
        CHECK(back.key == e.key);
        CHECK(back.step == e.step);
        CHECK(back.value == Approx(e.value));
        CHECK(back.text == e.text);
        CHECK(back.level == (e.type == Event::Type::Log ? e.level : ""));
        CHECK(back.sha256 == e.sha256);
        CHECK(back.wallTime == Approx(e.wallTime));
    }
}

TEST_CASE("non-finite metric values survive the stream", "[events]") {
    auto nan = decodeEvent(encodeEvent(Event::metric("train/loss", 3, std::nan(""))));
    CHECK(std::isnan(nan.value));
    auto inf = decodeEvent(encodeEvent(Event::metric("train/loss", 3, -HUGE_VAL)));
    CHECK(std::isinf(inf.value));
    CHECK(inf.value < 0);
}

TEST_CASE("bad records are rejected with a clear message", "[events]") {
    CHECK_THROWS_WITH(decodeEvent("{not json"), Catch::Contains("not JSON"));
    CHECK_THROWS_WITH(decodeEvent("[1,2]"), Catch::Contains("not a JSON object"));
    CHECK_THROWS_WITH(decodeEvent(R"({"v":99,"type":"metric"})"),
                      Catch::Contains("version 99") && Catch::Contains("upgrade"));
    CHECK_THROWS_WITH(decodeEvent(R"({"v":1,"type":"teleport"})"), Catch::Contains("unknown record type"));
    CHECK_THROWS_WITH(decodeEvent(R"({"v":1,"type":"metric","key":"a","step":"x","value":1})"),
                      Catch::Contains("\"step\""));
    CHECK_THROWS_AS(decodeEvent(R"({"type":"log","msg":"x"})"), EventStreamError);
}

TEST_CASE("a stream reader names the line of a bad record", "[events]") {
    std::stringstream in;
    in << encodeEvent(Event::status(lathe::core::RunStatus::Running)) << "\n\n"
       << encodeEvent(Event::metric("a", 1, 2)) << "\n{oops\n";
    int seen = 0;
    CHECK_THROWS_WITH(readEventStream(in, [&](const Event&) { ++seen; }), Catch::Contains("line 4"));
    CHECK(seen == 2);
}

TEST_CASE("fields of the wrong type are stream errors, not crashes", "[events]") {
    CHECK_THROWS_AS(decodeEvent(R"({"v":1,"type":"status","status":"running","step":"5"})"),
                    EventStreamError);
    CHECK_THROWS_AS(decodeEvent(R"({"v":1,"type":"log","msg":"x","t":null})"), EventStreamError);
    CHECK_THROWS_AS(decodeEvent(R"({"v":1,"type":"run","config":"","host":7})"), EventStreamError);
    // Numbers are not bent into integers: 1.9 is not step 1, and 2^32 + 2 is not version 2.
    CHECK_THROWS_WITH(decodeEvent(R"({"v":1,"type":"metric","key":"a","step":1.9,"value":1})"),
                      Catch::Contains("\"step\" must be a whole number"));
    CHECK_THROWS_WITH(decodeEvent(R"({"v":4294967298,"type":"log","msg":"x"})"),
                      Catch::Contains("\"v\" is out of range"));
    CHECK_THROWS_WITH(decodeEvent(R"({"v":1,"type":"metric","key":"a","step":-3,"value":1})"),
                      Catch::Contains("must not be negative"));
    CHECK_THROWS_WITH(decodeEvent(R"({"v":1,"type":"checkpoint","path":"p","epoch":1e300})"),
                      Catch::Contains("\"epoch\" must be a whole number"));
}

TEST_CASE("a line longer than any record is refused without being read whole", "[events]") {
    std::stringstream in;
    in << encodeEvent(Event::status(lathe::core::RunStatus::Running)) << "\n"
       << std::string(kMaxEventLine + 10, 'x') << "\n";
    int seen = 0;
    CHECK_THROWS_WITH(readEventStream(in, [&](const Event&) { ++seen; }),
                      Catch::Contains("line 2") && Catch::Contains("longer than 16 MiB"));
    CHECK(seen == 1);
    // A last line without its newline is still a line.
    std::stringstream tail(encodeEvent(Event::status(lathe::core::RunStatus::Running)));
    std::string line;
    CHECK(readEventLine(tail, line));
    CHECK_FALSE(line.empty());
    CHECK_FALSE(readEventLine(tail, line));
}

TEST_CASE("run statuses have one name each, and a stream may report only a worker's", "[events]") {
    using lathe::core::RunStatus;
    for (auto s : {RunStatus::Created, RunStatus::Running, RunStatus::Completed, RunStatus::Stopped,
                   RunStatus::Failed, RunStatus::Interrupted})
        CHECK(lathe::core::runStatusFromString(lathe::core::toString(s)) == s);
    CHECK_FALSE(lathe::core::runStatusFromString("paused").has_value());
    CHECK_FALSE(lathe::core::runStatusFromString("").has_value());
    CHECK(decodeEvent(encodeEvent(Event::status(RunStatus::Stopped))).text == "stopped");
    CHECK_THROWS_WITH(decodeEvent(R"({"v":2,"type":"status","status":"paused"})"),
                      Catch::Contains("unknown run status"));
    // Interrupted is what readers infer from a dead recorder, never what a worker says.
    CHECK_THROWS_AS(decodeEvent(R"({"v":2,"type":"status","status":"interrupted"})"), EventStreamError);
}

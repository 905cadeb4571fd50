// The inference server's route table (core/src/serving/routes.h) alone, with a recording context
// instead of an HTTP session: exact paths, captures, guards, 405 and 404 outcomes, precedence.
// The server's own answers through it are tested end to end in tests/integration/test_serving.cpp.
#include "serving/routes.h"

#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

using namespace lathe::core::serving;
namespace http = boost::beast::http;

namespace {

struct Calls {
    std::vector<std::string> log;
};

RouteTable<Calls>::Handler record(std::string what) {
    return [what](Calls& c, const RouteParams& p) {
        std::string line = what;
        for (const char* name : {"model", "version"})
            if (!p.get(name).empty()) line += std::string(" ") + name + "=" + p.get(name);
        c.log.push_back(line);
    };
}

}  // namespace

TEST_CASE("splitPath drops the query string and empty segments", "[serving][routes]") {
    CHECK(splitPath("/v2/health/live") == std::vector<std::string>{"v2", "health", "live"});
    CHECK(splitPath("/v2//health/live/") == std::vector<std::string>{"v2", "health", "live"});
    CHECK(splitPath("/v2/models/x?verbose=1&a=/b") == std::vector<std::string>{"v2", "models", "x"});
    CHECK(splitPath("/").empty());
    CHECK(splitPath("").empty());
}

TEST_CASE("a route answers its exact path and method", "[serving][routes]") {
    RouteTable<Calls> t;
    t.add(http::verb::get, "/v2/health/live", record("live"));
    t.add(http::verb::get, "/v2", record("server"));
    Calls c;
    CHECK(t.dispatch(c, http::verb::get, "/v2/health/live").outcome == RouteOutcome::Handled);
    CHECK(t.dispatch(c, http::verb::get, "/v2").outcome == RouteOutcome::Handled);
    CHECK(t.dispatch(c, http::verb::get, "/v2/health/live/?x=1").outcome == RouteOutcome::Handled);
    CHECK(c.log == std::vector<std::string>{"live", "server", "live"});
    // Neither a prefix nor an extension of a route's path is that route.
    CHECK(t.dispatch(c, http::verb::get, "/v2/health").outcome == RouteOutcome::NotFound);
    CHECK(t.dispatch(c, http::verb::get, "/v2/health/live/now").outcome == RouteOutcome::NotFound);
    CHECK(c.log.size() == 3);
}

TEST_CASE("captures give the handler the path's segments", "[serving][routes]") {
    RouteTable<Calls> t;
    t.add(http::verb::get, "/v2/models/{model}/ready", record("ready"));
    t.add(http::verb::post, "/v2/models/{model}/versions/{version}/infer", record("infer"));
    Calls c;
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/digits/ready").outcome == RouteOutcome::Handled);
    CHECK(t.dispatch(c, http::verb::post, "/v2/models/mlp/versions/3/infer").outcome ==
          RouteOutcome::Handled);
    CHECK(c.log == std::vector<std::string>{"ready model=digits", "infer model=mlp version=3"});
    RouteParams none;
    CHECK(none.get("model").empty());
}

TEST_CASE("a known path with another method is MethodNotAllowed, naming the methods it takes",
          "[serving][routes]") {
    RouteTable<Calls> t;
    t.add(http::verb::post, "/v2/models/{model}/infer", record("infer"));
    t.add(http::verb::get, "/v2/models/{model}", record("metadata"));
    t.add(http::verb::delete_, "/v2/models/{model}", record("unload"));
    Calls c;
    auto r = t.dispatch(c, http::verb::get, "/v2/models/digits/infer");
    CHECK(r.outcome == RouteOutcome::MethodNotAllowed);
    CHECK(r.allowed == std::vector<http::verb>{http::verb::post});
    CHECK(methodList(r.allowed) == "POST");
    r = t.dispatch(c, http::verb::put, "/v2/models/digits");
    CHECK(r.outcome == RouteOutcome::MethodNotAllowed);
    CHECK(methodList(r.allowed) == "GET or DELETE");
    CHECK(c.log.empty());
}

TEST_CASE("an unknown path is NotFound", "[serving][routes]") {
    RouteTable<Calls> t;
    t.add(http::verb::get, "/metrics", record("metrics"));
    Calls c;
    CHECK(t.dispatch(c, http::verb::get, "/v3/anything").outcome == RouteOutcome::NotFound);
    CHECK(t.dispatch(c, http::verb::get, "/").outcome == RouteOutcome::NotFound);
    CHECK(t.dispatch(c, http::verb::post, "/metrics/x").outcome == RouteOutcome::NotFound);
    CHECK(t.dispatch(c, http::verb::get, "/metrics").outcome == RouteOutcome::Handled);
    CHECK(RouteTable<Calls>().dispatch(c, http::verb::get, "/metrics").outcome == RouteOutcome::NotFound);
}

TEST_CASE("the first matching route in the table wins", "[serving][routes]") {
    RouteTable<Calls> t;
    t.add(http::verb::get, "/v2/models/{model}/stats", record("stats"));
    t.add(http::verb::get, "/v2/models/{model}/{what}", record("any"));
    t.add(http::verb::get, "/v2/models/{model}/stats", record("never"));
    Calls c;
    t.dispatch(c, http::verb::get, "/v2/models/digits/stats");
    t.dispatch(c, http::verb::get, "/v2/models/digits/ready");
    CHECK(c.log == std::vector<std::string>{"stats model=digits", "any model=digits"});
    // A later route with the right method answers when an earlier one for the path has another.
    RouteTable<Calls> u;
    u.add(http::verb::get, "/v2/ab", record("get"));
    u.add(http::verb::post, "/v2/ab", record("post"));
    Calls d;
    CHECK(u.dispatch(d, http::verb::post, "/v2/ab").outcome == RouteOutcome::Handled);
    CHECK(d.log == std::vector<std::string>{"post"});
}

TEST_CASE("guards run, in order, before any route of the paths below them", "[serving][routes]") {
    RouteTable<Calls> t;
    std::vector<std::string> seen;
    t.guard("/v2/models/{model}", [&](Calls& c, const RouteParams& p) {
        seen.push_back("model " + p.get("model"));
        if (p.get("model") == "digits") return true;
        c.log.push_back("404 no model " + p.get("model"));
        return false;
    });
    t.guard("/v2/models/{model}/versions/{version}", [&](Calls& c, const RouteParams& p) {
        seen.push_back("version " + p.get("version"));
        if (p.get("version") == "2") return true;
        c.log.push_back("404 version " + p.get("version"));
        return false;
    });
    t.add(http::verb::get, "/v2/models/{model}/versions/{version}", record("metadata"));
    t.add(http::verb::post, "/v2/models/{model}/infer", record("infer"));
    t.add(http::verb::get, "/v2/health/live", record("live"));

    Calls c;
    // An unknown model is the guard's answer, whatever the method or the rest of the path.
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/nope/infer").outcome == RouteOutcome::Handled);
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/nope/no/such/thing").outcome == RouteOutcome::Handled);
    CHECK(c.log == std::vector<std::string>{"404 no model nope", "404 no model nope"});
    CHECK(seen == std::vector<std::string>{"model nope", "model nope"});
    // A served model: the second guard runs only for paths below it.
    c.log.clear();
    seen.clear();
    CHECK(t.dispatch(c, http::verb::post, "/v2/models/digits/infer").outcome == RouteOutcome::Handled);
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/digits/versions/7").outcome == RouteOutcome::Handled);
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/digits/versions/2").outcome == RouteOutcome::Handled);
    CHECK(c.log ==
          std::vector<std::string>{"infer model=digits", "404 version 7", "metadata model=digits version=2"});
    CHECK(seen ==
          std::vector<std::string>{"model digits", "model digits", "version 7", "model digits", "version 2"});
    // Past the guards the routes decide as usual; paths outside them never see the guards.
    seen.clear();
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/digits/infer").outcome ==
          RouteOutcome::MethodNotAllowed);
    CHECK(t.dispatch(c, http::verb::get, "/v2/models/digits/versions").outcome == RouteOutcome::NotFound);
    CHECK(t.dispatch(c, http::verb::get, "/v2/models").outcome == RouteOutcome::NotFound);
    CHECK(t.dispatch(c, http::verb::get, "/v2/health/live").outcome == RouteOutcome::Handled);
    CHECK(seen == std::vector<std::string>{"model digits", "model digits"});
}

TEST_CASE("malformed patterns are refused when the route is added", "[serving][routes]") {
    RouteTable<Calls> t;
    CHECK_THROWS_AS(t.add(http::verb::get, "v2/health", record("x")), std::invalid_argument);
    CHECK_THROWS_AS(t.add(http::verb::get, "/v2/models/{}", record("x")), std::invalid_argument);
    CHECK_THROWS_AS(t.add(http::verb::get, "/v2/models/{model", record("x")), std::invalid_argument);
    CHECK_THROWS_AS(t.add(http::verb::get, "/v2/models/x{model}", record("x")), std::invalid_argument);
    CHECK_THROWS_AS(t.guard("/v2/{a}b}", [](Calls&, const RouteParams&) { return true; }),
                    std::invalid_argument);
    CHECK_NOTHROW(t.add(http::verb::get, "/", record("root")));
    Calls c;
    CHECK(t.dispatch(c, http::verb::get, "/").outcome == RouteOutcome::Handled);
}

#pragma once
// The inference server's route table: which handler answers a request, by method and path.
// Torch-free and Beast-light (only http::verb), so it is tested on its own (tests/core/test_routes.cpp).
//
// A path pattern is literal segments and `{name}` captures: "/v2/models/{model}/versions/{version}".
// Paths are compared segment by segment after dropping the query string and empty segments, so
// "/v2//health/live/" is "/v2/health/live".
//
// dispatch() runs, in this order:
//   1. every guard whose pattern is a prefix of the path, in the order they were added. A guard
//      checks what all paths below it share (the model /v2/models/{model} names is served) and
//      may answer the request itself (404) by returning false, which ends the dispatch;
//   2. the first route, in the order they were added, whose pattern matches the whole path and
//      whose method is the request's: its handler answers;
//   3. otherwise MethodNotAllowed when some route matches the path with another method (with
//      the methods it takes), else NotFound. The caller answers those (405 and 404).
//
// How to add an HTTP endpoint to the server (http_session.cpp, Session::routes()): one line,
//     t.add(http::verb::get, "/v2/models/{model}/stats", &Session::serveStats);
// with `void Session::serveStats(const RouteParams& p)` answering through send()/sendError();
// p.get("model") is the captured segment. Under /v2/models/{model} the guards have already
// resolved the model (Session::m_slot, m_model). A handler must answer exactly once (now, or
// later on the connection's strand), and copy captures it needs after it returns.
#include <ostream>  // before Beast's verb.hpp, which uses it without including it

#include <algorithm>
#include <boost/beast/http/verb.hpp>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lathe::core::serving {

/// A request target's path segments: the query string dropped, the first character (the leading
/// '/') skipped, empty segments dropped.
std::vector<std::string> splitPath(std::string_view target);
/// splitPath into `segments`, reusing its strings' storage (no allocation once warm).
void splitPathInto(std::string_view target, std::vector<std::string>& segments);

/// The methods as a 405 names them: "GET", "GET or POST".
std::string methodList(const std::vector<boost::beast::http::verb>& methods);

/// The segments `{name}` captures matched. Refers to the pattern and the path: valid during the
/// handler's call only.
class RouteParams {
public:
    /// The captured segment, or an empty string when the pattern has no `{name}`.
    const std::string& get(std::string_view name) const;
    void clear() { m_values.clear(); }
    void add(const std::string& name, const std::string& value) { m_values.emplace_back(&name, &value); }

private:
    std::vector<std::pair<const std::string*, const std::string*>> m_values;
};

class PathPattern {
public:
    /// Throws std::invalid_argument for a pattern that does not start with '/', or a malformed
    /// capture ("{}", "{a", "x{a}").
    explicit PathPattern(std::string_view pattern);
    /// Whether `segments` are the pattern's (`prefix`: begin with them); fills `params` on a match
    /// (and leaves it in an unspecified state otherwise).
    bool match(const std::vector<std::string>& segments, RouteParams& params, bool prefix = false) const;
    const std::string& text() const { return m_text; }

private:
    struct Segment {
        std::string text;  // the literal, or the capture's name
        bool capture = false;
    };
    std::string m_text;
    std::vector<Segment> m_segments;
};

enum class RouteOutcome { Handled, MethodNotAllowed, NotFound };

struct RouteResult {
    RouteOutcome outcome = RouteOutcome::NotFound;
    std::vector<boost::beast::http::verb> allowed;  // MethodNotAllowed: the path's methods, in table order
};

/// Routes requests to handlers taking a `Context&` (the server's Session; a test's recorder).
/// Built once, then only read: dispatch() may run on several threads at once.
template <class Context>
class RouteTable {
public:
    using Handler = std::function<void(Context&, const RouteParams&)>;
    /// true: go on to the routes; false: the guard answered the request.
    using Guard = std::function<bool(Context&, const RouteParams&)>;

    void add(boost::beast::http::verb method, std::string_view pattern, Handler handler) {
        m_routes.push_back({method, PathPattern(pattern), std::move(handler)});
    }
    void guard(std::string_view prefix, Guard guard) {
        m_guards.push_back({PathPattern(prefix), std::move(guard)});
    }

    /// `target`: the request target (a query string is ignored).
    RouteResult dispatch(Context& context, boost::beast::http::verb method, std::string_view target) const {
        std::vector<std::string> segments;
        return dispatch(context, method, target, segments);
    }
    /// With the caller's scratch vector for the path's segments (a connection keeps one).
    RouteResult dispatch(Context& context, boost::beast::http::verb method, std::string_view target,
                         std::vector<std::string>& segments) const {
        splitPathInto(target, segments);
        thread_local RouteParams params;
        for (const auto& g : m_guards) {
            params.clear();
            if (g.pattern.match(segments, params, true) && !g.guard(context, params))
                return {RouteOutcome::Handled, {}};
        }
        RouteResult result;
        for (const auto& r : m_routes) {
            params.clear();
            if (!r.pattern.match(segments, params)) continue;
            if (r.method == method) {
                r.handler(context, params);
                return {RouteOutcome::Handled, {}};
            }
            if (std::find(result.allowed.begin(), result.allowed.end(), r.method) == result.allowed.end())
                result.allowed.push_back(r.method);
        }
        result.outcome = result.allowed.empty() ? RouteOutcome::NotFound : RouteOutcome::MethodNotAllowed;
        return result;
    }

private:
    struct Route {
        boost::beast::http::verb method;
        PathPattern pattern;
        Handler handler;
    };
    struct GuardEntry {
        PathPattern pattern;
        Guard guard;
    };
    std::vector<Route> m_routes;
    std::vector<GuardEntry> m_guards;
};

}  // namespace lathe::core::serving

// The load generator behind `lathectl load`: keep-alive Boost.Beast connections on one
// io_context. Open loop: each connection takes the next slot of a fixed schedule (start + i/rate)
// when it is free; latency runs from the slot's intended send time, not from when a connection
// got round to sending it, so a server that falls behind shows its backlog (wrk2's
// coordinated-omission correction) instead of slowing the client down to its own pace. Closed
// loop (wrk's model): each connection sends again as soon as it has its answer.
#include "lathe/core/loadgen.h"

#include <pthread.h>
#include <algorithm>
#include <array>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/core/http_client.h"

namespace lathe::core {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Request = http::request<http::string_body>;

constexpr uint64_t kMaxResponseBytes = 256ull << 20;
const char* const kServerHint = " — is a server running? (lathectl serve / lathectl deploy)";

struct Target {
    std::string base;  // http://host:port[/prefix], without a trailing slash
    std::string host;
    std::string port = "80";
    std::string prefix;  // path before /v2, may be empty
    std::string hostHeader;
};

Target parseTarget(const std::string& url) {
    HttpUrl u;
    try {
        u = parseHttpUrl(url);
    } catch (const ConfigError& ex) {
        throw ConfigError("--url '" + url + "': " + ex.what());
    }
    Target t;
    t.base = url;
    while (!t.base.empty() && t.base.back() == '/') t.base.pop_back();
    t.host = u.host;
    t.port = u.port;
    t.hostHeader = u.authority;
    t.prefix = u.target;
    while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
    return t;
}

std::string modelPath(const Target& t, const std::string& model) { return t.prefix + "/v2/models/" + model; }

std::string errorText(const std::string& body) {
    try {
        const auto j = nlohmann::json::parse(body);
        if (j.is_object() && j.contains("error") && j["error"].is_string())
            return j["error"].get<std::string>();
    } catch (const std::exception&) {
    }
    return body.substr(0, 200);
}

// One blocking exchange for the checks before the run (the shared client, http_client.h).
HttpExchange fetch(const Target& t, const char* method, const std::string& path, const std::string& body,
                   double timeoutS) {
    HttpUrl u;
    u.host = t.host;
    u.port = t.port;
    u.authority = t.hostHeader;
    u.target = path;
    return httpExchange(method, u, body, timeoutS, "application/json", "lathectl-load");
}

[[noreturn]] void unreachable(const Target& t, const HttpExchange& f) {
    if (f.timedOut)
        throw Error("cannot reach " + t.base + ": " + f.reason +
                    (f.connected ? " (it accepted the connection but did not answer)" : kServerHint));
    if (!f.connected) throw Error("cannot reach " + t.base + ": " + f.reason + kServerHint);
    throw Error(t.base + " closed the connection without a valid HTTP answer (" + f.reason +
                "): is it a KServe v2 inference server?");
}

// The input tensor of the served model, from its KServe v2 metadata.
struct InputSpec {
    std::string name;
    std::string datatype;
    std::vector<int64_t> shape;
};

InputSpec inputFromMetadata(const Target& t, const std::string& model, const std::string& body) {
    const std::string where = "GET " + t.base + "/v2/models/" + model;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(body);
    } catch (const std::exception&) {
        throw Error(where + " did not answer with JSON model metadata (KServe v2)");
    }
    if (!j.is_object() || !j.contains("inputs") || !j["inputs"].is_array() || j["inputs"].empty())
        throw Error(where + ": the metadata lists no `inputs`");
    if (j["inputs"].size() != 1)
        throw Error(where + ": the model has " + std::to_string(j["inputs"].size()) +
                    " inputs; the load generator builds bodies for one (pass a request body instead)");
    const auto& in = j["inputs"][0];
    InputSpec s;
    try {
        s.name = in.at("name").get<std::string>();
        s.datatype = in.at("datatype").get<std::string>();
        s.shape = in.at("shape").get<std::vector<int64_t>>();
    } catch (const std::exception&) {
        throw Error(where + ": input 0 lacks a string `name`, a string `datatype` or an integer `shape`");
    }
    if (s.datatype != "FP32")
        throw Error(where + ": input '" + s.name + "' is " + s.datatype +
                    "; the load generator builds FP32 inputs only (pass a request body instead)");
    if (s.shape.empty())
        throw Error(where + ": input '" + s.name + "' has an empty shape (no batch dimension)");
    for (size_t i = 1; i < s.shape.size(); ++i)
        if (s.shape[i] < 1)
            throw Error(where + ": input '" + s.name + "' dimension " + std::to_string(i) +
                        " has no fixed size (" + std::to_string(s.shape[i]) +
                        "), so no random input can be built (pass a request body instead)");
    return s;
}

// A request body of random FP32 rows. With `binary`, Triton's binary tensor data extension:
// `jsonLength` gets the length of the JSON header, the values follow it as raw little-endian
// floats, and the output is asked for the same way.
std::string randomBody(const InputSpec& in, int64_t rows, bool binary, int64_t& jsonLength) {
    int64_t count = rows;
    for (size_t i = 1; i < in.shape.size(); ++i) count *= in.shape[i];
    if (count > (int64_t{64} << 20))
        throw ConfigError("--rows " + std::to_string(rows) + " makes a request of " + std::to_string(count) +
                          " values; choose fewer rows");
    std::string out = "{\"id\":\"lathe-load\",\"inputs\":[{\"name\":" + nlohmann::json(in.name).dump() +
                      ",\"datatype\":\"FP32\",\"shape\":[" + std::to_string(rows);
    for (size_t i = 1; i < in.shape.size(); ++i) out += "," + std::to_string(in.shape[i]);
    std::mt19937 rng(20240611);  // fixed: runs are comparable
    std::normal_distribution<float> normal(0.f, 1.f);
    if (binary) {
        out += "],\"parameters\":{\"binary_data_size\":" + std::to_string(count * 4) +
               "}}],\"parameters\":{\"binary_data_output\":true}}";
        jsonLength = static_cast<int64_t>(out.size());
        std::vector<float> values(static_cast<size_t>(count));
        for (auto& v : values) v = normal(rng);
        out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
        return out;
    }
    jsonLength = -1;
    out += "],\"data\":[";
    out.reserve(out.size() + static_cast<size_t>(count) * 11 + 8);
    char buf[32];
    for (int64_t i = 0; i < count; ++i) {
        if (i) out += ',';
        const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, normal(rng));
        out.append(buf, end);
    }
    out += "]}]}";
    return out;
}

// ---- the run ---------------------------------------------------------------------------

// The answer's status line and whether the connection stays open; the body is counted and
// dropped. A Beast parser with no field storage: the generator must cost the server's client
// as little CPU as wrk does, and response_parser<string_body> allocates every field and body.
class StatusParser : public http::basic_parser<false> {
public:
    int status = 0;

private:
    void on_request_impl(http::verb, beast::string_view, beast::string_view, int,
                         beast::error_code&) override {}
    void on_response_impl(int code, beast::string_view, int, beast::error_code&) override { status = code; }
    void on_field_impl(http::field, beast::string_view, beast::string_view, beast::error_code&) override {}
    void on_header_impl(beast::error_code&) override {}
    void on_body_init_impl(const boost::optional<std::uint64_t>&, beast::error_code&) override {}
    size_t on_body_impl(beast::string_view body, beast::error_code&) override { return body.size(); }
    void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
    size_t on_chunk_body_impl(std::uint64_t, beast::string_view body, beast::error_code&) override {
        return body.size();
    }
    void on_finish_impl(beast::error_code&) override {}
};

using Strand = asio::strand<asio::io_context::executor_type>;
using Socket = asio::basic_stream_socket<tcp, Strand>;
using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, Strand>;

int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
constexpr int64_t kNoDeadline = std::numeric_limits<int64_t>::max();

struct Shared {
    LoadOptions options;
    Target target;
    tcp::resolver::results_type endpoints;
    std::string request;  // the whole request, serialised once: every connection sends these bytes
    Clock::duration timeout{};
    Clock::time_point start, end;
    double interval = 0;  // seconds between intended sends (open loop)
    bool closedLoop = false;
    std::atomic<int64_t> nextSlot{0};
    std::atomic<bool> stopping{false};  // take no new slot
    std::atomic<bool> aborting{false};  // give up on requests in flight

    std::mutex mutex;
    std::condition_variable finished;
    int active = 0;  // connections still running
    LoadReport report;
    std::array<int64_t, 600> byCode{};  // answers by HTTP status, folded into report.byStatus at the end
    double sumMs = 0;

    std::atomic<int64_t> sentCount{0};
    void sent() { sentCount.fetch_add(1, std::memory_order_relaxed); }
    void answered(int status, double latencyMs) {
        std::lock_guard<std::mutex> lk(mutex);
        if (status >= 100 && status < 600)
            ++byCode[static_cast<size_t>(status)];
        else
            ++report.byStatus[std::to_string(status)];
        if (status >= 200 && status < 300) {
            ++report.ok;
            report.latenciesMs.push_back(latencyMs);
            report.maxMs = std::max(report.maxMs, latencyMs);
            sumMs += latencyMs;
        } else {
            ++report.errors;
        }
    }
    void failed(const char* kind) {
        std::lock_guard<std::mutex> lk(mutex);
        ++report.byStatus[kind];
        ++report.errors;
    }
    void connectionDone() {
        std::lock_guard<std::mutex> lk(mutex);
        if (--active == 0) finished.notify_all();
    }
};

// One keep-alive connection. No per-operation timers: the request's deadline is an atomic the
// watchdog (runLoad's thread, every 50 ms) compares with the clock, cancelling the socket of a
// request that ran past it; arming and cancelling a timer around every read and write cost
// the generator more CPU per request than the server's HTTP parsing.
class Connection : public std::enable_shared_from_this<Connection> {
public:
    Connection(asio::io_context& ioc, Shared& shared)
        : m_strand(asio::make_strand(ioc)), m_socket(m_strand), m_timer(m_strand), m_s(shared) {}

    // Connects ahead of the first slot so the first requests do not pay for the handshake;
    // a failure here is not a request failure: the first request will try again and count it.
    void start() {
        asio::dispatch(m_strand, [self = shared_from_this()] {
            self->arm(Clock::now() + self->m_s.timeout);
            self->m_connecting = true;
            asio::async_connect(self->m_socket, self->m_s.endpoints,
                                [self](beast::error_code ec, const tcp::endpoint&) {
                                    self->m_connecting = false;
                                    self->disarm();
                                    if (!ec && self->m_timedOut) ec = asio::error::timed_out;
                                    self->onConnected(ec, /*warmup=*/true);
                                });
        });
    }

    // Wakes a connection waiting for its slot (stop requested) or, once aborting, drops the
    // request in flight.
    void interrupt() {
        asio::post(m_strand, [self = shared_from_this()] {
            self->m_timer.cancel();
            if (self->m_s.aborting && (self->m_inFlight || self->m_connecting)) self->stopIo();
        });
    }

    // The watchdog: a request past its deadline is cancelled (its handler then counts a timeout).
    void checkDeadline(int64_t now) {
        if (now < m_deadlineNs.load(std::memory_order_relaxed)) return;
        asio::post(m_strand, [self = shared_from_this()] {
            if (nowNs() < self->m_deadlineNs.load(std::memory_order_relaxed)) return;  // answered meanwhile
            self->m_deadlineNs.store(kNoDeadline, std::memory_order_relaxed);
            self->m_timedOut = true;
            self->stopIo();
        });
    }

private:
    // Ends the operation in progress. A range connect moves on to the next endpoint when only
    // cancelled, so while connecting the socket is closed instead.
    void stopIo() {
        beast::error_code ignored;
        if (m_connecting)
            m_socket.close(ignored);
        else
            m_socket.cancel(ignored);
    }

    void arm(Clock::time_point deadline) {
        m_timedOut = false;
        m_deadlineNs.store(
            std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count(),
            std::memory_order_relaxed);
    }
    void disarm() { m_deadlineNs.store(kNoDeadline, std::memory_order_relaxed); }

    void next() {
        m_inFlight = false;
        const auto now = Clock::now();
        if (m_s.stopping || now >= m_s.end) return finish();
        m_retried = false;
        if (m_s.closedLoop) {
            m_intended = now;
            return send();
        }
        const int64_t i = m_s.nextSlot.fetch_add(1);
        m_intended = m_s.start + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(i * m_s.interval));
        if (m_intended >= m_s.end) return finish();
        if (m_intended <= now) return send();
        m_timer.expires_at(m_intended);
        m_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (ec || self->m_s.stopping) return self->finish();  // stopped while waiting for its slot
            self->send();
        });
    }

    void send() {
        m_s.sent();
        m_inFlight = true;
        // The timeout runs from the actual send: it bounds how long the server may take, while
        // the latency (from the intended time) also shows how long the request had to wait.
        arm(Clock::now() + m_s.timeout);
        if (!m_connected) return connect();
        write();
    }

    void connect() {
        m_buffer.clear();
        m_connecting = true;
        asio::async_connect(m_socket, m_s.endpoints,
                            [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                                self->m_connecting = false;
                                // Stopped (timeout, abort) just as it connected: not a request to send.
                                if (!ec && (self->m_timedOut || self->m_s.aborting))
                                    ec = asio::error::operation_aborted;
                                self->onConnected(ec, false);
                            });
    }

    void onConnected(beast::error_code ec, bool warmup) {
        if (warmup) {
            m_connected = !ec;
            if (!ec) m_socket.set_option(tcp::no_delay(true), ec);
            // Every connection begins at the common start time.
            m_timer.expires_at(m_s.start);
            m_timer.async_wait([self = shared_from_this()](beast::error_code) { self->next(); });
            return;
        }
        if (ec) {
            disarm();
            closeSocket();
            return failed(m_timedOut ? "timeout" : m_s.aborting ? "cancelled" : "connect");
        }
        m_connected = true;
        m_reused = false;
        m_socket.set_option(tcp::no_delay(true), ec);
        write();
    }

    void write() {
        asio::async_write(m_socket, asio::buffer(m_s.request),
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->transportError(ec);
                              self->read();
                          });
    }

    void read() {
        m_parser.emplace();
        m_parser->body_limit(kMaxResponseBytes);
        m_parser->eager(true);
        http::async_read(m_socket, m_buffer, *m_parser,
                         [self = shared_from_this()](beast::error_code ec, size_t) {
                             if (ec) return self->transportError(ec);
                             self->onResponse();
                         });
    }

    void onResponse() {
        const auto done = Clock::now();
        disarm();
        m_s.answered(m_parser->status, std::chrono::duration<double, std::milli>(done - m_intended).count());
        m_reused = true;
        if (!m_parser->keep_alive()) closeSocket();
        next();
    }

    static bool isClosed(const beast::error_code& ec) {
        return ec == http::error::end_of_stream || ec == http::error::partial_message ||
               ec == asio::error::eof || ec == asio::error::connection_reset ||
               ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
    }

    void transportError(const beast::error_code& ec) {
        const bool gotSome = m_parser && m_parser->got_some();
        const bool reused = m_reused;  // closeSocket() clears it
        closeSocket();
        if (m_s.aborting) return failed("cancelled");
        if (m_timedOut) return failed("timeout");
        // A kept-alive connection the server closed while idle fails on its next use before any
        // byte of an answer: that says nothing about the server, so once more on a fresh one.
        const bool inTime = nowNs() < m_deadlineNs.load(std::memory_order_relaxed);
        if (isClosed(ec) && reused && !m_retried && !gotSome && inTime) {
            m_retried = true;
            return connect();
        }
        failed(isClosed(ec) ? "closed" : "io");
    }

    void failed(const char* kind) {
        disarm();
        closeSocket();
        m_s.failed(kind);
        if (m_s.aborting) {
            m_inFlight = false;
            return finish();
        }
        next();
    }

    void closeSocket() {
        beast::error_code ignored;
        m_socket.shutdown(tcp::socket::shutdown_both, ignored);
        m_socket.close(ignored);
        m_connected = false;
        m_reused = false;
        m_buffer.clear();
    }

    void finish() {
        if (m_finished) return;
        m_finished = true;
        disarm();
        closeSocket();
        m_s.connectionDone();
    }

    Strand m_strand;
    Socket m_socket;
    Timer m_timer;
    Shared& m_s;
    beast::flat_buffer m_buffer;
    std::optional<StatusParser> m_parser;
    Clock::time_point m_intended;
    std::atomic<int64_t> m_deadlineNs{kNoDeadline};
    bool m_timedOut = false;
    bool m_connecting = false;
    bool m_connected = false;
    bool m_reused = false;   // at least one answer came back on this connection
    bool m_retried = false;  // the current request was already resent once
    bool m_inFlight = false;
    bool m_finished = false;
};

// Nearest rank: the smallest value with at least p% of the values at or below it.
size_t nearestRank(size_t n, double p) {
    const double k = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(n));
    return std::min(n, static_cast<size_t>(std::max(1.0, k))) - 1;
}

// The report so far: counts, and percentiles over the successful requests' latencies.
LoadReport summarise(Shared& s, Clock::time_point now, bool keepLatencies) {
    LoadReport r;
    double sumMs;
    {
        std::lock_guard<std::mutex> lk(s.mutex);
        r = s.report;
        r.sent = s.sentCount.load();
        sumMs = s.sumMs;
        for (size_t code = 0; code < s.byCode.size(); ++code)
            if (s.byCode[code]) r.byStatus[std::to_string(code)] += s.byCode[code];
    }
    r.elapsedS = std::max(1e-9, std::chrono::duration<double>(now - s.start).count());
    r.qps = static_cast<double>(r.ok) / r.elapsedS;
    r.meanMs = r.ok ? sumMs / static_cast<double>(r.ok) : 0;
    if (!r.latenciesMs.empty()) {
        // Selection, not a sort: each percentile partitions the part above the previous one, so
        // the once-a-second progress stays cheap on runs of millions of requests.
        std::vector<double> v = r.latenciesMs;
        auto from = v.begin();
        for (auto [p, out] :
             {std::pair{50.0, &r.p50Ms}, {90.0, &r.p90Ms}, {99.0, &r.p99Ms}, {99.9, &r.p999Ms}}) {
            const auto k = v.begin() + static_cast<std::ptrdiff_t>(nearestRank(v.size(), p));
            std::nth_element(from, k, v.end());
            *out = *k;
            from = k;
        }
    }
    if (!keepLatencies) r.latenciesMs.clear();
    return r;
}

void checkOptions(const LoadOptions& o) {
    if (o.model.empty())
        throw ConfigError("--model is required: the name the server serves (GET /v2/models)");
    if (o.connections < 0 || o.connections > 10000)
        throw ConfigError("--connections must be between 1 and 10000");
    if (o.connections == 0 && (!(o.rate > 0) || !std::isfinite(o.rate)))
        throw ConfigError("--rate must be > 0 requests per second");
    if (!(o.durationS > 0) || !std::isfinite(o.durationS))
        throw ConfigError("--duration must be > 0 seconds");
    if (o.users < 1 || o.users > 10000) throw ConfigError("--users must be between 1 and 10000");
    if (!(o.timeoutS > 0) || !std::isfinite(o.timeoutS)) throw ConfigError("--timeout must be > 0 seconds");
    if (o.rowsPerRequest < 1) throw ConfigError("--rows must be at least 1");
    if (o.threads < 1 || o.threads > 16) throw ConfigError("--threads must be between 1 and 16");
    if (o.binary && !o.body.empty())
        throw ConfigError("--binary builds its own random input; it does not apply to a --body-file request");
    for (char c : o.model)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
            throw ConfigError("--model '" + o.model + "' is not a model name ([A-Za-z0-9._-])");
}

}  // namespace

double percentile(std::vector<double> values, double p) {
    if (values.empty()) return 0;
    const auto k = nearestRank(values.size(), p);
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
    return values[k];
}

LoadReport runLoad(const LoadOptions& options, const std::atomic<bool>* stop, const LoadProgress& progress) {
    checkOptions(options);
    Shared s;
    s.options = options;
    s.target = parseTarget(options.url);
    s.timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeoutS));
    {
        asio::io_context ioc;
        tcp::resolver resolver(ioc);
        beast::error_code ec;
        s.endpoints = resolver.resolve(s.target.host, s.target.port, ec);
        if (ec)
            throw Error("cannot reach " + s.target.base + ": cannot resolve '" + s.target.host +
                        "': " + ec.message());
    }

    // Before the run: the server answers and serves the model; its metadata shapes the body.
    const std::string path = modelPath(s.target, options.model);
    const auto fetched = fetch(s.target, "GET", path, {}, std::min(options.timeoutS, 10.0));
    if (!fetched.error.empty()) unreachable(s.target, fetched);
    const auto& meta = fetched.response;
    if (meta.status == 404) {
        std::string served;
        const auto index = fetch(s.target, "POST", s.target.prefix + "/v2/repository/index", "{}",
                                 std::min(options.timeoutS, 10.0));
        try {
            if (index.error.empty() && index.response.status == 200)
                for (const auto& m : nlohmann::json::parse(index.response.body))
                    served += (served.empty() ? "" : ", ") + m.at("name").get<std::string>();
        } catch (const std::exception&) {
        }
        throw Error(s.target.base + " does not serve a model named '" + options.model + "'" +
                    (served.empty() ? " (" + errorText(meta.body) + ")" : " (it serves: " + served + ")"));
    }
    if (meta.status != 200)
        throw Error("GET " + s.target.base + "/v2/models/" + options.model + " answered " +
                    std::to_string(meta.status) + ": " + errorText(meta.body));
    std::string body = options.body;
    int64_t jsonLength = -1;
    if (body.empty())
        body = randomBody(inputFromMetadata(s.target, options.model, meta.body), options.rowsPerRequest,
                          options.binary, jsonLength);

    Request request{http::verb::post, path + "/infer", 11};
    request.set(http::field::host, s.target.hostHeader);
    request.set(http::field::user_agent, "lathectl-load");
    if (jsonLength >= 0) {
        request.set(http::field::content_type, "application/octet-stream");
        request.set("Inference-Header-Content-Length", std::to_string(jsonLength));
    } else {
        request.set(http::field::content_type, "application/json");
    }
    request.body() = std::move(body);
    request.prepare_payload();
    {
        std::ostringstream bytes;
        bytes << request;
        s.request = bytes.str();
    }

    asio::io_context ioc;
    std::vector<std::shared_ptr<Connection>> connections;
    s.closedLoop = options.connections > 0;
    const int users = s.closedLoop ? options.connections : options.users;
    for (int i = 0; i < users; ++i) connections.push_back(std::make_shared<Connection>(ioc, s));
    s.active = users;
    s.interval = s.closedLoop ? 0 : 1.0 / options.rate;
    // A short lead lets every connection finish its handshake before the first slot.
    s.start = Clock::now() + std::chrono::milliseconds(50 + users / 4);
    s.end = s.start +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.durationS));
    for (auto& c : connections) c->start();
    std::vector<std::thread> threads;
    std::atomic<int64_t> clientCpuNs{0};
    for (int i = 0; i < options.threads; ++i)
        threads.emplace_back([&ioc, &clientCpuNs] {
            pthread_setname_np(pthread_self(), "lathe-load");
            ioc.run();
            timespec ts{};
            if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
                clientCpuNs += int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
        });

    // This thread reports progress and watches `stop`; the I/O threads do the rest.
    auto nextTick = s.start + std::chrono::seconds(1);
    std::optional<Clock::time_point> abortAt;
    const auto hardEnd = s.end + s.timeout + std::chrono::seconds(5);
    for (;;) {
        std::unique_lock<std::mutex> lk(s.mutex);
        if (s.finished.wait_for(lk, std::chrono::milliseconds(50), [&] { return s.active == 0; })) break;
        lk.unlock();
        const auto now = Clock::now();
        const int64_t ns = nowNs();
        for (auto& c : connections) c->checkDeadline(ns);
        if (stop && stop->load() && !s.stopping) {
            s.stopping = true;
            abortAt = now + std::min<Clock::duration>(s.timeout, std::chrono::seconds(2));
            for (auto& c : connections) c->interrupt();
        }
        if ((abortAt && now >= *abortAt && !s.aborting) || (now >= hardEnd && !s.aborting)) {
            s.stopping = true;
            s.aborting = true;
            for (auto& c : connections) c->interrupt();
        }
        if (progress && now >= nextTick) {
            try {
                progress(std::chrono::duration<double>(now - s.start).count(), summarise(s, now, false));
            } catch (...) {
                // The caller's callback failed: end the run cleanly before passing that on.
                s.stopping = true;
                s.aborting = true;
                for (auto& c : connections) c->interrupt();
                for (auto& t : threads) t.join();
                throw;
            }
            nextTick += std::chrono::seconds(1);
        }
    }
    const auto done = Clock::now();
    for (auto& t : threads) t.join();
    connections.clear();
    // Slots whose time came before the end that no connection was free to send.
    const int64_t scheduled =
        s.closedLoop ? 0 : static_cast<int64_t>(std::ceil(options.durationS * options.rate - 1e-9));
    auto report = summarise(s, done, true);
    report.clientCpuS = static_cast<double>(clientCpuNs.load()) * 1e-9;
    if (!s.stopping && !s.closedLoop) report.unsent = std::max<int64_t>(0, scheduled - report.sent);
    return report;
}

}  // namespace lathe::core

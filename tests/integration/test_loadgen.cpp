// The load generator against the real inference server (in this process, on a loopback port),
// against stand-in servers that misbehave on purpose, and through `lathectl load`.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/core/loadgen.h"
#include "run_process.h"
#include "serving_fixture.h"

using namespace lathe::core;
using lathe::test::httpGet;
using lathe::test::localUrl;
using lathe::test::ServingWorkspace;
using nlohmann::json;

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// One workspace for the whole file: training it takes a few seconds.
const ServingWorkspace& workspace() {
    static ServingWorkspace ws;
    return ws;
}

// The value of one series (its full name and labels, as /metrics prints them); -1 when absent.
double metricOf(const std::string& metrics, const std::string& series) {
    const auto pos = metrics.find("\n" + series + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(metrics.substr(pos + series.size() + 2));
}

// Sum of lathe_requests_total for one HTTP code, read from the server's /metrics.
double servedWithCode(uint16_t port, int code) {
    const auto m = httpGet(port, "/metrics");
    REQUIRE(m.status == 200);
    std::istringstream in(m.body);
    std::string line;
    double total = 0;
    while (std::getline(in, line))
        if (line.rfind("lathe_requests_total{", 0) == 0 &&
            line.find("code=\"" + std::to_string(code) + "\"") != std::string::npos)
            total += std::stod(line.substr(line.rfind(' ') + 1));
    return total;
}

void checkConsistent(const LoadReport& r) {
    CHECK(r.sent == r.ok + r.errors);
    int64_t byStatus = 0;
    for (const auto& [k, n] : r.byStatus) byStatus += n;
    CHECK(byStatus == r.sent);
    CHECK(static_cast<int64_t>(r.latenciesMs.size()) == r.ok);
    if (r.ok > 0) {
        CHECK(r.p50Ms > 0);
        CHECK(r.p50Ms <= r.p90Ms);
        CHECK(r.p90Ms <= r.p99Ms);
        CHECK(r.p99Ms <= r.p999Ms);
        CHECK(r.p999Ms <= r.maxMs);
        CHECK(r.meanMs <= r.maxMs);
        CHECK(r.maxMs == Approx(*std::max_element(r.latenciesMs.begin(), r.latenciesMs.end())));
        CHECK(r.p99Ms == Approx(percentile(r.latenciesMs, 99)));
    }
}

// A port nothing listens on: bound, read, released.
uint16_t freePort() {
    asio::io_context ioc;
    tcp::acceptor a(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    return a.local_endpoint().port();
}

// A stand-in server that answers the model metadata like a KServe v2 server and then, on every
// infer request: never answers (Hang), closes the connection (Close), or answers 200 after a
// fixed delay (Delay; one request at a time on a connection, as HTTP/1.1 without pipelining is).
class FakeServer {
public:
    enum class Infer { Hang, Close, Delay };
    FakeServer(Infer mode, std::string metadata,
               std::chrono::steady_clock::duration delay = std::chrono::milliseconds(0))
        : m_mode(mode),
          m_metadata(std::move(metadata)),
          m_delay(delay),
          m_acceptor(m_ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
        accept();
        m_thread = std::thread([this] { m_ioc.run(); });
    }
    ~FakeServer() {
        m_ioc.stop();
        m_thread.join();
    }
    uint16_t port() const { return m_acceptor.local_endpoint().port(); }
    int inferRequests() const { return m_infers.load(); }

private:
    struct Conn {
        explicit Conn(tcp::socket s) : stream(std::move(s)), timer(stream.get_executor()) {}
        beast::tcp_stream stream;
        asio::steady_timer timer;
        beast::flat_buffer buffer;
        http::request<http::string_body> req;
        http::response<http::string_body> res;
    };
    void accept() {
        m_acceptor.async_accept([this](beast::error_code ec, tcp::socket s) {
            if (ec) return;
            read(std::make_shared<Conn>(std::move(s)));
            accept();
        });
    }
    void read(std::shared_ptr<Conn> c) {
        c->req = {};
        http::async_read(c->stream, c->buffer, c->req, [this, c](beast::error_code ec, size_t) {
            if (ec) return;
            if (c->req.method() == http::verb::get) {
                c->res = {http::status::ok, 11};
                c->res.set(http::field::content_type, "application/json");
                c->res.body() = m_metadata;
                c->res.keep_alive(c->req.keep_alive());
                c->res.prepare_payload();
                http::async_write(c->stream, c->res, [this, c](beast::error_code ec2, size_t) {
                    if (!ec2 && c->res.keep_alive()) read(c);
                });
                return;
            }
            ++m_infers;
            if (m_mode == Infer::Hang) {
                m_held.push_back(c);  // kept open, never answered
                return;
            }
            if (m_mode == Infer::Delay) {
                // The timer never fires early, so every answer leaves at least m_delay after its
                // request arrived; the next request on this connection is read only after that.
                c->timer.expires_after(m_delay);
                c->timer.async_wait([this, c](beast::error_code ec2) {
                    if (ec2) return;
                    c->res = {http::status::ok, 11};
                    c->res.set(http::field::content_type, "application/json");
                    c->res.body() = R"({"model_name":"fake","outputs":[]})";
                    c->res.keep_alive(c->req.keep_alive());
                    c->res.prepare_payload();
                    http::async_write(c->stream, c->res, [this, c](beast::error_code ec3, size_t) {
                        if (!ec3 && c->res.keep_alive()) read(c);
                    });
                });
                return;
            }
            beast::error_code ignored;
            c->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
            c->stream.socket().close(ignored);
        });
    }

    Infer m_mode;
    std::string m_metadata;
    std::chrono::steady_clock::duration m_delay;
    asio::io_context m_ioc;
    tcp::acceptor m_acceptor;
    std::vector<std::shared_ptr<Conn>> m_held;
    std::atomic<int> m_infers{0};
    std::thread m_thread;
};

const char* kFakeMetadata = R"({"name":"fake","versions":["1"],"platform":"pytorch_torchscript",)"
                            R"("inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]}],)"
                            R"("outputs":[{"name":"y","datatype":"FP32","shape":[-1,2]}]})";

}  // namespace

TEST_CASE("percentile is nearest-rank over unsorted values", "[loadgen]") {
    std::vector<double> v;
    for (int i = 100; i >= 1; --i) v.push_back(i);
    CHECK(percentile(v, 50) == 50);
    CHECK(percentile(v, 90) == 90);
    CHECK(percentile(v, 99) == 99);
    CHECK(percentile(v, 99.9) == 100);
    CHECK(percentile(v, 100) == 100);
    CHECK(percentile(v, 0) == 1);
    CHECK(percentile({}, 99) == 0);
    CHECK(percentile({7.5}, 1) == 7.5);
    CHECK(percentile({3, 1, 2}, 50) == 2);       // rank ceil(1.5) = 2
    CHECK(percentile({4, 1, 3, 2}, 50) == 2);    // rank 2, not an interpolated 2.5
    CHECK(percentile({4, 1, 3, 2}, 75.1) == 4);  // rank ceil(3.004) = 4
}

TEST_CASE("at a modest rate every request to the real server is answered 200", "[loadgen][serving]") {
    const auto& ws = workspace();
    auto server = ws.serve();
    LoadOptions o;
    o.url = localUrl(server->port());
    o.model = "digits";
    o.rate = 200;
    o.durationS = 2;
    o.users = 4;
    int ticks = 0;
    int64_t lastSent = -1;
    const auto r = runLoad(o, nullptr, [&](double t, const LoadReport& p) {
        ++ticks;
        CHECK(t >= 0.9);
        CHECK(p.sent >= lastSent);  // cumulative
        CHECK(p.latenciesMs.empty());
        lastSent = p.sent;
    });
    checkConsistent(r);
    CHECK(r.errors == 0);
    CHECK(r.byStatus == std::map<std::string, int64_t>{{"200", r.ok}});
    // Open loop: the schedule decides how many are sent, not how fast the server answers (a slot
    // is dropped only when every connection is still busy at the very end of the run).
    CHECK(r.sent + r.unsent == 400);
    CHECK(r.sent >= 390);
    CHECK(r.elapsedS == Approx(2).epsilon(0.25));
    CHECK(r.qps > 0.7 * o.rate);
    CHECK(r.qps < 1.3 * o.rate);
    CHECK(ticks >= 1);
    CHECK(ticks <= 3);
    CHECK(r.clientCpuS > 0);
    CHECK(r.clientCpuS < r.elapsedS * o.threads);
    // The server saw exactly these requests.
    CHECK(servedWithCode(server->port(), 200) == static_cast<double>(r.ok));

    SECTION("several rows per request and a given body") {
        o.durationS = 0.5;
        o.rowsPerRequest = 8;
        const auto rows = runLoad(o);
        checkConsistent(rows);
        CHECK(rows.errors == 0);
        CHECK(rows.sent + rows.unsent == 100);
        CHECK(rows.sent >= 90);

        std::string body = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]})";
        o.body = body;
        const auto bad = runLoad(o);  // the server refuses the wrong shape: counted as 400s
        checkConsistent(bad);
        CHECK(bad.ok == 0);
        CHECK(bad.byStatus.count("400") == 1);
        CHECK(bad.errors == bad.sent);
    }
    SECTION("binary tensor data, as Triton's clients send it") {
        o.durationS = 0.5;
        o.rowsPerRequest = 3;
        o.binary = true;
        const double before = servedWithCode(server->port(), 200);
        const auto bin = runLoad(o);
        checkConsistent(bin);
        CHECK(bin.errors == 0);
        CHECK(bin.sent >= 90);
        CHECK(servedWithCode(server->port(), 200) - before == static_cast<double>(bin.ok));
        o.body = R"({"inputs":[]})";
        CHECK_THROWS_WITH(runLoad(o), Catch::Contains("--binary"));
    }
}

TEST_CASE("a kept-alive connection the server closed while idle is retried once, not counted as an error",
          "[loadgen][serving]") {
    const auto& ws = workspace();
    ServeOptions so;
    so.idleTimeoutS = 0.15;  // the server drops a connection idle this long
    auto server = ws.serve(so);
    LoadOptions o;
    o.url = localUrl(server->port());
    o.model = "digits";
    o.rate = 4;  // 250 ms apart: every connection has been dropped by its next request
    o.users = 1;
    o.durationS = 1.5;
    const auto r = runLoad(o);
    checkConsistent(r);
    CHECK(r.sent >= 5);
    CHECK(r.errors == 0);
    CHECK(r.byStatus == std::map<std::string, int64_t>{{"200", r.ok}});
}

TEST_CASE("closed loop: each connection sends again as soon as it is answered, like wrk",
          "[loadgen][serving]") {
    const auto& ws = workspace();
    auto server = ws.serve();
    LoadOptions o;
    o.url = localUrl(server->port());
    o.model = "digits";
    o.connections = 4;
    o.rate = 1;  // unused in closed loop: were it the schedule, about one request would go out
    o.durationS = 1;
    const auto r = runLoad(o);
    checkConsistent(r);
    CHECK(r.errors == 0);
    CHECK(r.unsent == 0);
    // As fast as the server answers: far beyond the (unused) rate, and at most 4 in flight, so
    // the server never saw more than 4 rows in one batch.
    CHECK(r.ok > 100);
    CHECK(servedWithCode(server->port(), 200) == static_cast<double>(r.ok));
    const auto m = httpGet(server->port(), "/metrics").body;
    CHECK(metricOf(m, "lathe_batch_size_count{model=\"digits\",version=\"1\"}") > 0);
    CHECK(metricOf(m, "lathe_batch_size_bucket{model=\"digits\",version=\"1\",le=\"4\"}") ==
          metricOf(m, "lathe_batch_size_count{model=\"digits\",version=\"1\"}"));
    CHECK(r.clientCpuS > 0);
    // One connection: strictly one request at a time, so every batch is one row.
    auto one = ws.serve();
    o.url = localUrl(one->port());
    o.connections = 1;
    o.durationS = 0.5;
    const auto single = runLoad(o);
    CHECK(single.errors == 0);
    CHECK(single.ok > 20);
    const auto m1 = httpGet(one->port(), "/metrics").body;
    CHECK(metricOf(m1, "lathe_batch_size_sum{model=\"digits\",version=\"1\"}") ==
          metricOf(m1, "lathe_batch_size_count{model=\"digits\",version=\"1\"}"));
    o.connections = -1;
    CHECK_THROWS_WITH(runLoad(o), Catch::Contains("--connections"));
}

TEST_CASE("an overloaded server answers 503, the generator counts them, and the server keeps serving",
          "[loadgen][serving]") {
    const auto& ws = workspace();
    ServeOptions so;
    so.maxBatch = 1;
    so.maxQueue = 1;
    so.maxDelayMs = 0;
    auto server = ws.serve(so);
    LoadOptions o;
    o.url = localUrl(server->port());
    o.model = "digits";
    o.rate = 20000;  // far above what a 2-core machine answers
    o.durationS = 1.5;
    o.users = 64;
    o.rowsPerRequest = 1;
    const auto r = runLoad(o);
    checkConsistent(r);
    INFO("by status: " << json(r.byStatus).dump());
    CHECK(r.byStatus.count("503") == 1);
    CHECK(r.byStatus.at("503") > 0);
    CHECK(r.ok > 0);
    // Overload shows as 503 answers, never as broken connections or timeouts.
    for (const auto& [k, n] : r.byStatus) CHECK((k == "200" || k == "503"));
    CHECK(r.errors == r.byStatus.at("503"));
    CHECK(servedWithCode(server->port(), 503) == static_cast<double>(r.byStatus.at("503")));

    // Still up and serving.
    const auto live = httpGet(server->port(), "/v2/health/live");
    CHECK(live.status == 200);
    o.rate = 50;
    o.durationS = 0.5;
    o.users = 2;
    const auto after = runLoad(o);
    checkConsistent(after);
    CHECK(after.errors == 0);
    CHECK(after.ok + after.unsent == 25);
    CHECK(after.ok >= 20);
}

TEST_CASE("with no server the run does not start and the error says what to do", "[loadgen]") {
    LoadOptions o;
    o.model = "digits";
    o.rate = 10;
    o.durationS = 1;
    const auto port = freePort();
    o.url = localUrl(port);
    CHECK_THROWS_WITH(runLoad(o),
                      "cannot reach http://127.0.0.1:" + std::to_string(port) +
                          ": Connection refused — is a server running? (lathectl serve / lathectl deploy)");
}

TEST_CASE("a server that does not serve the model, or not usefully, is refused before the run",
          "[loadgen][serving]") {
    const auto& ws = workspace();
    auto server = ws.serve();
    LoadOptions o;
    o.url = localUrl(server->port()) + "/";  // a trailing slash is fine
    o.model = "nope";
    o.rate = 10;
    o.durationS = 1;
    CHECK_THROWS_WITH(runLoad(o), Catch::Contains("does not serve a model named 'nope' (it serves: digits)"));

    o.model = "digits";
    o.url = "https://127.0.0.1:1";
    CHECK_THROWS_AS(runLoad(o), ConfigError);
    o.url = localUrl(server->port());
    o.rate = 0;
    CHECK_THROWS_AS(runLoad(o), ConfigError);

    FakeServer freeDim(
        FakeServer::Infer::Close,
        R"({"name":"fake","inputs":[{"name":"x","datatype":"FP32","shape":[-1,-1]}],"outputs":[]})");
    o.url = localUrl(freeDim.port());
    o.model = "fake";
    o.rate = 10;
    CHECK_THROWS_WITH(runLoad(o), Catch::Contains("dimension 1 has no fixed size"));
    CHECK(freeDim.inferRequests() == 0);
}

TEST_CASE("transport failures are counted by kind", "[loadgen]") {
    LoadOptions o;
    o.model = "fake";
    o.rate = 20;
    o.durationS = 0.5;
    o.users = 2;

    SECTION("a server that never answers: timeout") {
        FakeServer fake(FakeServer::Infer::Hang, kFakeMetadata);
        o.url = localUrl(fake.port());
        o.timeoutS = 0.3;
        const auto r = runLoad(o);
        checkConsistent(r);
        CHECK(r.ok == 0);
        CHECK(r.sent > 0);
        CHECK(r.byStatus == std::map<std::string, int64_t>{{"timeout", r.sent}});
        CHECK(fake.inferRequests() == r.sent);
    }
    SECTION("a server that closes the connection: closed, then a fresh connection") {
        FakeServer fake(FakeServer::Infer::Close, kFakeMetadata);
        o.url = localUrl(fake.port());
        const auto r = runLoad(o);
        checkConsistent(r);
        CHECK(r.sent == 10);
        CHECK(r.byStatus == std::map<std::string, int64_t>{{"closed", 10}});
        CHECK(fake.inferRequests() == 10);  // every request reached the server: each one reconnected
    }
}

TEST_CASE("latency runs from the intended send time, so a server slower than the rate shows its backlog",
          "[loadgen]") {
    // One connection to a server that takes D per request, driven every D/4: request i is
    // scheduled at i·D/4 but can only be sent once answer i-1 is back, no earlier than i·D, and
    // is answered no earlier than (i+1)·D. From the intended time its latency is therefore at
    // least D + i·(D - D/4): it grows by 3D/4 a request. Measured from the actual send (closed
    // loop, coordinated omission) every request would take about D.
    constexpr double kDelayMs = 20;
    constexpr double kIntervalMs = kDelayMs / 4;
    FakeServer fake(FakeServer::Infer::Delay, kFakeMetadata, std::chrono::milliseconds(20));
    LoadOptions o;
    o.url = localUrl(fake.port());
    o.model = "fake";
    o.rate = 1000 / kIntervalMs;  // 200 requests/s, four times what the server answers
    o.durationS = 0.6;            // 120 slots; about 30 answered
    o.users = 1;
    o.timeoutS = 5;
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = runLoad(o);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    checkConsistent(r);
    CHECK(r.errors == 0);
    CHECK(fake.inferRequests() == r.sent);
    // The server answers at most one request per D: the slots it could not take are unsent.
    CHECK(r.sent <= static_cast<int64_t>(o.durationS * 1000 / kDelayMs) + 1);
    CHECK(r.sent >= 8);
    CHECK(r.sent + r.unsent == 120);

    const auto& lat = r.latenciesMs;  // one connection: completion order is slot order
    REQUIRE(lat.size() >= 8);
    const double slack = 0.5;  // ms: slot times rounded to clock ticks, never a real delay
    for (size_t i = 0; i < lat.size(); ++i) {
        INFO("request " << i << ": " << lat[i] << " ms");
        CHECK(lat[i] >= kDelayMs + static_cast<double>(i) * (kDelayMs - kIntervalMs) - slack);
        if (i > 0) CHECK(lat[i] - lat[i - 1] >= kDelayMs - kIntervalMs - slack);
    }
    // The backlog dominates the tail: far above the server's own D.
    const double lastFloor = kDelayMs + static_cast<double>(lat.size() - 1) * (kDelayMs - kIntervalMs);
    CHECK(r.maxMs >= lastFloor - slack);
    CHECK(r.p99Ms >= 5 * kDelayMs);
    CHECK(r.p50Ms >= 3 * kDelayMs);
    CHECK(r.meanMs >= kDelayMs + static_cast<double>(lat.size() - 1) / 2 * (kDelayMs - kIntervalMs) - slack);
}

TEST_CASE("a stop request ends the run early and in-flight requests count as cancelled", "[loadgen]") {
    FakeServer fake(FakeServer::Infer::Hang, kFakeMetadata);
    LoadOptions o;
    o.url = localUrl(fake.port());
    o.model = "fake";
    o.rate = 100;
    o.durationS = 30;
    o.users = 3;
    o.timeoutS = 60;
    std::atomic<bool> stop{false};
    std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        stop = true;
    });
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = runLoad(o, &stop);
    stopper.join();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(took < 5);  // 2 s grace for requests in flight, not the 30 s run or the 60 s timeout
    checkConsistent(r);
    CHECK(r.sent == 3);  // every connection is stuck on its first request
    CHECK(r.byStatus == std::map<std::string, int64_t>{{"cancelled", 3}});
}

TEST_CASE("an exception from the progress callback ends the run and reaches the caller", "[loadgen]") {
    FakeServer fake(FakeServer::Infer::Hang, kFakeMetadata);
    LoadOptions o;
    o.url = localUrl(fake.port());
    o.model = "fake";
    o.rate = 10;
    o.durationS = 30;
    o.timeoutS = 60;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(
        runLoad(o, nullptr, [](double, const LoadReport&) { throw std::runtime_error("enough"); }), "enough");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("lathectl load prints a report, records it, and exits by outcome", "[loadgen][cli]") {
    using lathe::test::binPath;
    using lathe::test::runShell;
    using lathe::test::said;
    const auto& ws = workspace();
    auto server = ws.serve();
    const std::string lathectl = binPath("lathectl") + " load --url " + localUrl(server->port());

    const auto r = runShell(
        lathectl + " --model digits --rate 100 --duration 1.5 --users 2 --json --record --db " + ws.db());
    INFO(said(r));
    REQUIRE(r.exitCode == 0);
    const auto j = json::parse(r.out);
    CHECK(j.at("sent").get<int>() + j.at("unsent").get<int>() == 150);
    CHECK(j.at("sent").get<int>() >= 140);
    CHECK(j.at("ok") == j.at("sent"));
    CHECK(j.at("errors") == 0);
    CHECK(j.at("by_status") == json{{"200", j.at("ok")}});
    CHECK(j.at("p99_ms").get<double>() >= j.at("p50_ms").get<double>());
    CHECK(j.at("qps").get<double>() > 50);
    CHECK_THAT(r.err, Catch::Contains("1 s  sent "));  // a progress line on stderr

    Registry registry(ws.db());
    const auto qps = registry.servingMetrics("digits", "load/qps");
    REQUIRE(qps.size() == 1);
    CHECK(qps[0].value == Approx(j.at("qps").get<double>()));
    CHECK(registry.servingMetrics("digits", "load/p99_ms").at(0).value ==
          Approx(j.at("p99_ms").get<double>()));
    CHECK(registry.servingMetrics("digits", "load/errors").at(0).value == 0);

    const auto text = runShell(lathectl + " --model digits --rate 50 --duration 0.5");
    REQUIRE(text.exitCode == 0);
    CHECK_THAT(text.out, Catch::Contains("p99.9") && Catch::Contains("by status  200: "));

    FakeServer fake(FakeServer::Infer::Hang, kFakeMetadata);
    const auto failed = runShell(binPath("lathectl") + " load --url " + localUrl(fake.port()) +
                                 " --model fake --rate 10 --duration 0.3 --timeout 0.2");
    CHECK(failed.exitCode == 1);
    CHECK_THAT(failed.out, Catch::Contains("timeout: 3"));

    const auto none = runShell(binPath("lathectl") + " load --url " + localUrl(freePort()) +
                               " --model digits --rate 10 --duration 1");
    CHECK(none.exitCode == 1);
    CHECK_THAT(none.err, Catch::Contains("Connection refused — is a server running?"));

    const auto closed = runShell(lathectl + " --model digits --connections 2 --duration 0.5 --json");
    INFO(said(closed));
    REQUIRE(closed.exitCode == 0);
    const auto c = json::parse(closed.out);
    CHECK(c.at("mode") == "closed");
    CHECK(c.at("users") == 2);
    CHECK(c.at("rate").is_null());
    CHECK(c.at("ok").get<int>() > 20);
    const auto neither = runShell(lathectl + " --model digits --duration 1");
    CHECK(neither.exitCode == 2);
    CHECK_THAT(neither.err, Catch::Contains("Exactly 1 option from [--rate,--connections] is required"));
    // Both: the same rule, not "unknown option '--rate'" (the options live in an option group).
    const auto both = runShell(lathectl + " --model digits --rate 5 --connections 2 --duration 1");
    CHECK(both.exitCode == 2);
    CHECK_THAT(both.err,
               Catch::Contains("Exactly 1 option from [--rate,--connections] is required and 2 were given"));
    CHECK_THAT(both.err, !Catch::Contains("unknown option"));
    CHECK(runShell(lathectl + " --model digits --rate 0 --duration 1").exitCode == 2);
    CHECK(runShell(lathectl + " --model digits --rate 10").exitCode == 2);
    CHECK(runShell(lathectl + " --model 'bad name' --rate 10 --duration 1").exitCode == 2);
}

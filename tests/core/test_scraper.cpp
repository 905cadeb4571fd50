// httpRequest and the Scraper against a real HTTP server on a loopback port, storing into a real
// Registry in a temporary workspace.
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "lathe/core/error.h"
#include "lathe/core/http_client.h"
#include "lathe/core/monitor.h"
#include "lathe/core/registry.h"
#include "lathe/core/scraper.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::test::TempDir;

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// A synchronous one-request-per-connection server on 127.0.0.1 with an OS-chosen port.
class TestServer {
public:
    explicit TestServer(std::function<Response(const Request&)> handler)
        : m_handler(std::move(handler)), m_acceptor(m_ioc, {asio::ip::address_v4::loopback(), 0}) {
        m_port = m_acceptor.local_endpoint().port();
        m_thread = std::thread([this] { loop(); });
    }
    ~TestServer() {
        m_stopping = true;
        // accept() blocks; a connection of our own wakes it to see the flag.
        try {
            asio::io_context ioc;
            tcp::socket s(ioc);
            s.connect({asio::ip::address_v4::loopback(), m_port});
        } catch (...) {
        }
        m_thread.join();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(m_port); }

private:
    void loop() {
        while (!m_stopping) {
            tcp::socket sock(m_ioc);
            beast::error_code ec;
            m_acceptor.accept(sock, ec);
            if (ec || m_stopping) continue;
            beast::flat_buffer buf;
            http::request_parser<http::string_body> parser;
            parser.body_limit(64u << 20);
            http::read(sock, buf, parser, ec);
            if (ec) continue;
            Response res = m_handler(parser.get());
            res.version(11);
            res.prepare_payload();
            http::write(sock, res, ec);
            sock.shutdown(tcp::socket::shutdown_both, ec);
        }
    }

    std::function<Response(const Request&)> m_handler;
    asio::io_context m_ioc;
    tcp::acceptor m_acceptor;
    unsigned short m_port = 0;
    std::atomic<bool> m_stopping{false};
    std::thread m_thread;
};

Response text(http::status status, std::string body, const std::string& type = "text/plain") {
    Response r{status, 11};
    r.set(http::field::content_type, type);
    r.body() = std::move(body);
    return r;
}

std::string errorOf(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// A port nothing listens on: bound, read, released.
unsigned short closedPort() {
    asio::io_context ioc;
    tcp::acceptor a(ioc, {asio::ip::address_v4::loopback(), 0});
    const auto port = a.local_endpoint().port();
    a.close();
    return port;
}

template <typename Pred>
bool waitFor(Pred pred, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pred();
}

}  // namespace

TEST_CASE("httpRequest: status, body, lower-case headers, methods and bodies", "[monitor][http]") {
    TestServer server([](const Request& req) {
        if (req.target() == "/missing") return text(http::status::not_found, "no such thing");
        Response r =
            text(http::status::ok, std::string(req.method_string()) + " " + std::string(req.target()) + " [" +
                                       std::string(req[http::field::content_type]) + "] " + req.body());
        r.set("X-Custom-Header", "Yes");
        r.insert("Set-Cookie", "a=1");
        r.insert("Set-Cookie", "b=2");
        return r;
    });
    auto r = httpRequest("GET", server.url() + "/hello?x=1");
    CHECK(r.status == 200);
    CHECK(r.body == "GET /hello?x=1 [] ");
    CHECK(r.headers.at("x-custom-header") == "Yes");
    CHECK(r.headers.at("content-type") == "text/plain");
    CHECK(r.headers.at("set-cookie") == "a=1, b=2");
    CHECK(r.headers.count("X-Custom-Header") == 0);

    r = httpRequest("POST", server.url() + "/v2/models/m/infer", R"({"inputs":[]})");
    CHECK(r.body == R"(POST /v2/models/m/infer [application/json] {"inputs":[]})");
    r = httpRequest("PUT", server.url() + "/admin", "w=1", 5.0, "text/plain");
    CHECK(r.body == "PUT /admin [text/plain] w=1");
    r = httpRequest("DELETE", server.url() + "/admin");
    CHECK(r.body == "DELETE /admin [] ");
    r = httpRequest("GET", server.url());  // no path: "/"
    CHECK(r.body == "GET / [] ");

    r = httpRequest("GET", server.url() + "/missing");  // an HTTP error is a result, not an exception
    CHECK(r.status == 404);
    CHECK(r.body == "no such thing");

    // A large body arrives whole.
    const std::string big(3 << 20, 'x');
    r = httpRequest("POST", server.url() + "/big", big, 10.0, "application/octet-stream");
    CHECK(r.body.size() == big.size() + std::string("POST /big [application/octet-stream] ").size());
}

TEST_CASE("httpRequest: refused connections, silent servers and bad URLs are clear errors",
          "[monitor][http]") {
    const auto port = closedPort();
    CHECK(errorOf([&] { httpRequest("GET", "http://127.0.0.1:" + std::to_string(port) + "/metrics"); }) ==
          "cannot connect to 127.0.0.1:" + std::to_string(port) + ": Connection refused");

    // Listening but never accepting: the kernel completes the handshake, nobody ever answers.
    asio::io_context ioc;
    tcp::acceptor silent(ioc, {asio::ip::address_v4::loopback(), 0});
    const auto url = "http://127.0.0.1:" + std::to_string(silent.local_endpoint().port()) + "/metrics";
    const auto t0 = std::chrono::steady_clock::now();
    const auto msg = errorOf([&] { httpRequest("GET", url, {}, 0.3); });
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(msg.find("timed out after 0.3 s") == 0);
    CHECK(msg.find("127.0.0.1:" + std::to_string(silent.local_endpoint().port())) != std::string::npos);
    CHECK(took >= 0.25);
    CHECK(took < 2.0);

    for (const char* bad : {"https://127.0.0.1:8500/", "ftp://x/", "127.0.0.1:8500", "http://:8500/",
                            "http://h:0/", "http://h:99999/", "http://h:80x/", "http://[::1/"}) {
        INFO(bad);
        CHECK_THROWS_AS(httpRequest("GET", bad), Error);
    }
    CHECK(errorOf([] { httpRequest("GET", "https://h/"); }).find("https is not supported") !=
          std::string::npos);
}

namespace {

// What the fake server exposes on its n-th scrape (n from 1): 10 requests per scrape, all slow
// (in the 0.1..1 s bucket) until scrape 5, fast afterwards; 5xx answers from scrape 3 on.
struct FakeMetrics {
    std::mutex mutex;
    int scrapes = 0;
    int failAt = 4;  // this scrape answers 500: the scraper must store up = 0 and carry on
    double requests = 0, errors = 0, slow = 0, fast = 0;

    Response next() {
        std::lock_guard<std::mutex> lock(mutex);
        const int n = ++scrapes;
        if (n == failAt) return text(http::status::internal_server_error, "boom");
        requests += 100;  // enough for an error rate of its own (error_rate_min_requests 20)
        if (n >= 3) errors += 20;
        (n <= 5 ? slow : fast) += 10;
        const auto series = [](const char* name, const char* extra, double v) {
            return std::string(name) + "{model=\"m\",version=\"7\"" + extra + "} " + std::to_string(v) + "\n";
        };
        std::string t = "# TYPE lathe_model_info gauge\n";
        t += series("lathe_model_info", "", 1);
        t += series("lathe_requests_total", ",code=\"200\"", requests - errors);
        if (errors > 0) t += series("lathe_requests_total", ",code=\"503\"", errors);
        t += series("lathe_request_duration_seconds_bucket", ",le=\"0.01\"", fast);
        t += series("lathe_request_duration_seconds_bucket", ",le=\"0.1\"", fast);
        t += series("lathe_request_duration_seconds_bucket", ",le=\"1\"", fast + slow);
        t += series("lathe_request_duration_seconds_bucket", ",le=\"+Inf\"", fast + slow);
        t += series("lathe_request_duration_seconds_count", "", fast + slow);
        t += "lathe_queue_depth{model=\"m\"} " + std::to_string(n) + "\n";
        t += "process_resident_memory_bytes 52428800\n";
        return text(http::status::ok, t, "text/plain; version=0.0.4");
    }
};

}  // namespace

TEST_CASE("the scraper stores interval figures and alerts in the registry", "[monitor][scraper]") {
    TempDir dir;
    Registry reg(dir.file("ws.db"));
    FakeMetrics fake;
    TestServer server([&](const Request& req) {
        if (req.target() != "/metrics") return text(http::status::not_found, "");
        return fake.next();
    });
    AlertRules rules;
    rules.p99Samples = 2;  // slow from the 2nd interval, fast from the 6th scrape on
    Scraper scraper(reg, "m", server.url() + "/", rules, 0.05);
    scraper.start();
    REQUIRE(waitFor([&] { return reg.servingMetrics("m", "up").size() >= 9; }, 20));
    scraper.stop();

    const auto up = reg.servingMetrics("m", "up");
    int downs = 0;
    for (const auto& p : up) downs += p.value == 0;
    CHECK(downs == 1);  // the 4th scrape failed and scraping went on
    CHECK(up.front().value == 1);
    for (const auto& p : up) CHECK(p.version == 7);

    // Gauges from every good scrape, rates from the second on.
    CHECK(reg.servingMetrics("m", "rss_mb").size() == up.size() - 1);
    CHECK(reg.servingMetrics("m", "rss_mb")[0].value == Approx(50));
    const auto depth = reg.servingMetrics("m", "queue_depth");
    REQUIRE(depth.size() >= 2);
    CHECK(depth[0].value == 1);
    CHECK(depth[1].value == 2);
    const auto qps = reg.servingMetrics("m", "qps");
    REQUIRE(qps.size() == up.size() - 2);
    for (const auto& p : qps) CHECK(p.value > 0);
    // error_rate per interval: scrape 2: 0/100; 3: 20/100; 5 (against 3, the 4th failed): 20/100; 6: 20/100.
    const auto errors = reg.servingMetrics("m", "error_rate");
    REQUIRE(errors.size() >= 4);
    CHECK(errors[0].value == 0);
    CHECK(errors[1].value == Approx(0.2));
    CHECK(errors[2].value == Approx(0.2));
    CHECK(errors[3].value == Approx(0.2));
    // P99: 0.1 + 0.9 * 0.99 s while slow; 10 ms * 0.99 once fast.
    const auto p99 = reg.servingMetrics("m", "p99_ms");
    REQUIRE(p99.size() >= 4);
    CHECK(p99[0].value == Approx(991));
    CHECK(p99[3].value == Approx(9.9));

    // The P99 alert fired after two slow intervals and resolved when latency dropped; the error
    // rate jumped from 0% to 20% and stayed there, so that alert fired until the scraper
    // stopped: then nobody evaluates it any more, and it is resolved at the stop.
    const auto alerts = reg.alerts("m");
    REQUIRE(alerts.size() == 2);
    const auto& latency = alerts[0].rule == "p99_latency" ? alerts[0] : alerts[1];
    const auto& rate = alerts[0].rule == "p99_latency" ? alerts[1] : alerts[0];
    CHECK(latency.rule == "p99_latency");
    CHECK(latency.message == "P99 latency 991 ms above 100 ms for 2 samples");
    CHECK(latency.value == Approx(991));
    CHECK(latency.firedAt == Approx(p99[1].t));
    CHECK(latency.resolvedAt == Approx(p99[3].t));
    CHECK(rate.rule == "error_rate");
    CHECK(rate.message == "Error rate 20.0% up 20.0 points from 0.0% within 300 s");
    CHECK(rate.firedAt == Approx(errors[1].t));
    CHECK(rate.resolvedAt > errors.back().t);  // open through the last scrape, closed by stop()
}

TEST_CASE("a scraper of a dead server records up = 0 and stops at once", "[monitor][scraper]") {
    TempDir dir;
    Registry reg(dir.file("ws.db"));
    {
        Scraper scraper(reg, "gone", "http://127.0.0.1:" + std::to_string(closedPort()), {}, 0.02);
        scraper.start();
        REQUIRE(waitFor([&] { return reg.servingMetrics("gone", "up").size() >= 3; }, 10));
    }  // the destructor stops it
    for (const auto& p : reg.servingMetrics("gone", "up")) CHECK(p.value == 0);
    CHECK(reg.servingKeys("gone") == std::vector<std::string>{"up"});

    // A long interval does not delay stop(): the wait is woken, not slept out.
    TestServer server(
        [](const Request&) { return text(http::status::ok, "process_resident_memory_bytes 1\n"); });
    Scraper slow(reg, "slow", server.url(), {}, 30.0);
    slow.start();
    REQUIRE(waitFor([&] { return !reg.servingMetrics("slow", "up").empty(); }, 10));
    const auto t0 = std::chrono::steady_clock::now();
    slow.stop();
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
    slow.stop();  // twice is harmless
    CHECK(reg.servingMetrics("slow", "up").size() == 1);
}

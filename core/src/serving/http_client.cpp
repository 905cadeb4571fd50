// A small blocking HTTP/1.1 client for talking to Lathe's own servers (scraping /metrics, the
// admin API, tests). Plain HTTP only: servers are on loopback or reached through an SSH tunnel.
//
// Beast's tcp_stream only enforces expires_after() on asynchronous operations, so each step runs
// asynchronously on a private io_context and the caller blocks until it completes. One deadline
// covers the whole exchange: a server that accepts and then never answers cannot hang the caller.
#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "lathe/core/error.h"
#include "lathe/core/http_client.h"

namespace lathe::core {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string secondsText(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
}

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

HttpUrl parseHttpUrl(const std::string& url) {
    const std::string scheme = "http://";
    if (url.compare(0, scheme.size(), scheme) != 0) {
        if (url.compare(0, 8, "https://") == 0)
            throw ConfigError("https is not supported (use http:// or an SSH tunnel)");
        throw ConfigError("a URL must look like http://HOST:PORT/PATH");
    }
    HttpUrl u;
    const size_t hostStart = scheme.size();
    const size_t slash = url.find('/', hostStart);
    u.authority = url.substr(hostStart, slash == std::string::npos ? std::string::npos : slash - hostStart);
    if (slash != std::string::npos) u.target = url.substr(slash);
    const std::string& authority = u.authority;
    size_t colon = std::string::npos;
    if (!authority.empty() && authority.front() == '[') {  // [::1]:8500
        const size_t close = authority.find(']');
        if (close == std::string::npos) throw ConfigError("unterminated '[' in the host");
        u.host = authority.substr(1, close - 1);
        if (close + 1 < authority.size()) {
            if (authority[close + 1] != ':') throw ConfigError("junk after ']' in the host");
            colon = close + 1;
        }
    } else {
        colon = authority.rfind(':');
        u.host = authority.substr(0, colon);
    }
    if (colon != std::string::npos) {
        u.port = authority.substr(colon + 1);
        int port = 0;
        const auto* end = u.port.data() + u.port.size();
        const auto res = std::from_chars(u.port.data(), end, port);
        if (u.port.empty() || res.ec != std::errc() || res.ptr != end || port < 1 || port > 65535)
            throw ConfigError("bad port '" + u.port + "' (1-65535)");
    }
    if (u.host.empty()) throw ConfigError("no host");
    return u;
}

HttpExchange httpExchange(const std::string& method, const HttpUrl& u, const std::string& body,
                          double timeoutS, const std::string& contentType, const std::string& userAgent,
                          const std::map<std::string, std::string>& headers) {
    const std::string where =
        (u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host) + ":" + u.port;
    if (!(timeoutS > 0)) timeoutS = 5.0;
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(std::min(timeoutS, 86400.0)));
    HttpExchange x;
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    beast::error_code ec;

    // Runs one asynchronous step to completion under what is left of the deadline (Beast's
    // deadlines apply to asynchronous operations only). False when it failed: x says why.
    auto step = [&](const char* what, auto&& start) {
        const auto left = deadline - Clock::now();
        if (left > Clock::duration::zero()) {
            stream.expires_after(left);
            bool done = false;
            start([&](beast::error_code e, auto&&...) {
                ec = e;
                done = true;
            });
            ioc.restart();
            ioc.run();
            if (!done) ec = asio::error::operation_aborted;
            if (ec != beast::error::timeout) return !ec;
        }
        x.timedOut = true;
        x.reason = "no answer within " + secondsText(timeoutS) + " s";
        x.error = "timed out after " + secondsText(timeoutS) + " s " + what + " " + where;
        return false;
    };

    // Name resolution is synchronous: hosts are loopback or names from the host inventory, and
    // getaddrinfo cannot be cancelled anyway.
    tcp::resolver resolver(ioc);
    const auto endpoints = resolver.resolve(u.host, u.port, ec);
    if (ec) {
        x.reason = "cannot resolve '" + u.host + "': " + ec.message();
        x.error = "cannot resolve host '" + u.host + "': " + ec.message();
        return x;
    }
    if (!step("connecting to", [&](auto handler) { stream.async_connect(endpoints, handler); })) {
        if (!x.timedOut) {
            x.reason = ec.message();
            x.error = "cannot connect to " + where + ": " + ec.message();
        }
        return x;
    }
    x.connected = true;

    http::request<http::string_body> req;
    const http::verb verb = http::string_to_verb(method);
    if (verb == http::verb::unknown)
        req.method_string(method);
    else
        req.method(verb);
    req.target(u.target);
    req.version(11);
    req.set(http::field::host, u.authority.empty() ? where : u.authority);
    req.set(http::field::user_agent, userAgent);
    req.set(http::field::connection, "close");
    if (!body.empty() || verb == http::verb::post || verb == http::verb::put) {
        req.set(http::field::content_type, contentType);
        req.body() = body;
    }
    for (const auto& [name, value] : headers) req.set(name, value);
    req.prepare_payload();
    const std::string request = method + " http://" + where + u.target;

    if (!step("sending the request to", [&](auto handler) { http::async_write(stream, req, handler); })) {
        if (!x.timedOut) {
            x.reason = ec.message();
            x.error = request + ": sending the request failed: " + ec.message();
        }
        return x;
    }
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(256u << 20);  // /metrics of a busy server is well under this
    if (!step("waiting for the response from",
              [&](auto handler) { http::async_read(stream, buffer, parser, handler); })) {
        if (!x.timedOut) {
            x.reason = ec.message();
            x.error = request + ": reading the response failed: " + ec.message();
        }
        return x;
    }
    auto& res = parser.get();
    x.response.status = static_cast<int>(res.result_int());
    for (const auto& field : res) {
        std::string name = lower(std::string(field.name_string()));
        std::string value(field.value());
        auto it = x.response.headers.find(name);
        if (it == x.response.headers.end())
            x.response.headers.emplace(std::move(name), std::move(value));
        else
            it->second += ", " + value;  // repeated headers combine as RFC 9110 allows
    }
    x.response.body = std::move(res.body());
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    return x;
}

HttpResult httpRequest(const std::string& method, const std::string& url, const std::string& body,
                       double timeoutS, const std::string& contentType,
                       const std::map<std::string, std::string>& headers) {
    HttpUrl u;
    try {
        u = parseHttpUrl(url);
    } catch (const ConfigError& ex) {
        throw Error("cannot fetch '" + url + "': " + ex.what());
    }
    auto x = httpExchange(method, u, body, timeoutS, contentType, "lathe", headers);
    if (!x.error.empty()) throw Error(x.error);
    return std::move(x.response);
}

}  // namespace lathe::core

#pragma once
// The one blocking HTTP/1.1 client of Lathe (serving/http_client.cpp): the scraper, deploy's
// readiness checks and hot swaps, the load generator's checks before a run, and tests. One URL
// parser and one exchange with a deadline over connect, write and read.
#include <map>
#include <string>

namespace lathe::core {

struct HttpUrl {
    std::string host;  // without the brackets of an IPv6 literal
    std::string port = "80";
    std::string target = "/";  // path (and query); "/" when the URL has none
    std::string authority;     // host[:port] as written: the Host header
};

/// Parses http://HOST[:PORT][/PATH] ([::1]:8500 for IPv6). Throws ConfigError saying what is wrong
/// ("https is not supported (use http:// or an SSH tunnel)", "bad port '0'", "no host").
HttpUrl parseHttpUrl(const std::string& url);

struct HttpResult {
    int status = 0;
    std::string body;
    std::map<std::string, std::string> headers;  // lower-case names
};

/// One request on a fresh connection; connect, write and read share one deadline of `timeoutS`.
/// Transport problems are reported, not thrown: callers phrase them for their users.
struct HttpExchange {
    bool connected = false;  // the TCP connection was made
    bool timedOut = false;
    std::string error;   // a sentence naming the stage and the server; empty when `response` is whole
    std::string reason;  // the transport's own words ("Connection refused")
    HttpResult response;
};
/// `headers`: more request headers (name -> value), e.g. {{"Authorization", "Bearer ..."}}; they
/// replace the exchange's own of the same name. Never part of an error sentence.
HttpExchange httpExchange(const std::string& method, const HttpUrl& url, const std::string& body = {},
                          double timeoutS = 5.0, const std::string& contentType = "application/json",
                          const std::string& userAgent = "lathe",
                          const std::map<std::string, std::string>& headers = {});

/// `method` on `url` with a timeout (seconds); returns status, headers and body. Throws Error on a
/// bad URL or a transport failure (the exchange's sentence).
HttpResult httpRequest(const std::string& method, const std::string& url, const std::string& body = {},
                       double timeoutS = 5.0, const std::string& contentType = "application/json",
                       const std::map<std::string, std::string>& headers = {});

}  // namespace lathe::core

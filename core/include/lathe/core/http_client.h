#pragma once
// A small blocking HTTP/1.1 client (serving/http_client.cpp).
#include <map>
#include <string>

namespace lathe::core {

/// GET http://host:port/path with a timeout (seconds); returns status and body. Throws Error on
/// transport failure. Small blocking client shared by scraper, deploy and tests.
struct HttpResult {
    int status = 0;
    std::string body;
    std::map<std::string, std::string> headers;  // lower-case names
};
HttpResult httpRequest(const std::string& method, const std::string& url, const std::string& body = {},
                       double timeoutS = 5.0, const std::string& contentType = "application/json");

}  // namespace lathe::core

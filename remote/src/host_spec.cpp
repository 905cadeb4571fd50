#include "lathe/remote/host_spec.h"

#include <stdexcept>

namespace lathe::remote {

namespace {

[[noreturn]] void bad(std::string_view text, const std::string& why) {
    throw std::invalid_argument("host spec '" + std::string(text) + "': " + why);
}

int parsePort(std::string_view text, std::string_view port) {
    if (port.empty() || port.size() > 5) bad(text, "port must be a number from 1 to 65535");
    int value = 0;
    for (char c : port) {
        if (c < '0' || c > '9') bad(text, "port must be a number from 1 to 65535");
        value = value * 10 + (c - '0');
    }
    if (value < 1 || value > 65535) bad(text, "port must be a number from 1 to 65535");
    return value;
}

bool isIpv6Literal(const std::string& host) { return host.find(':') != std::string::npos; }

}  // namespace

std::string HostSpec::label() const {
    const std::string h = isIpv6Literal(host) ? "[" + host + "]" : host;
    return port == 22 || port == 0 ? host : h + ":" + std::to_string(port);
}

std::string HostSpec::toString() const {
    std::string out = user.empty() ? std::string() : user + "@";
    if (port == 22 || port == 0) return out + (isIpv6Literal(host) ? "[" + host + "]" : host);
    return out + label();
}

HostSpec parseHostSpec(std::string_view text) {
    HostSpec spec;
    std::string_view rest = text;
    // The last '@' separates the user, so user names that contain '@' (directory accounts) work.
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
        spec.user = std::string(rest.substr(0, at));
        if (spec.user.empty()) bad(text, "user name before '@' is empty");
        rest = rest.substr(at + 1);
    }
    if (!rest.empty() && rest.front() == '[') {
        const auto close = rest.find(']');
        if (close == std::string_view::npos) bad(text, "missing ']' after IPv6 address");
        spec.host = std::string(rest.substr(1, close - 1));
        std::string_view after = rest.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':') bad(text, "expected ':port' after ']'");
            spec.port = parsePort(text, after.substr(1));
        }
    } else if (const auto colon = rest.find(':');
               colon != std::string_view::npos && rest.find(':', colon + 1) == std::string_view::npos) {
        spec.host = std::string(rest.substr(0, colon));
        spec.port = parsePort(text, rest.substr(colon + 1));
    } else {
        spec.host = std::string(rest);  // a plain name, or an IPv6 address without port
    }
    if (spec.host.empty()) bad(text, "host name is empty");
    for (char c : spec.host)
        if (c == ' ' || c == '\t' || c == '/' || c == '@')
            bad(text, std::string("host name contains '") + c + "'");
    return spec;
}

}  // namespace lathe::remote

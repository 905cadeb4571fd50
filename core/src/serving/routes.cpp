// Path splitting and pattern matching for the server's route table (routes.h).
#include "routes.h"

#include <stdexcept>

namespace lathe::core::serving {

void splitPathInto(std::string_view target, std::vector<std::string>& seg) {
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    size_t n = 0;
    for (size_t pos = 1; pos <= target.size();) {
        auto next = target.find('/', pos);
        if (next == std::string_view::npos) next = target.size();
        if (next > pos) {
            if (n == seg.size()) seg.emplace_back();
            seg[n++].assign(target.substr(pos, next - pos));
        }
        pos = next + 1;
    }
    seg.resize(n);
}

std::vector<std::string> splitPath(std::string_view target) {
    std::vector<std::string> seg;
    splitPathInto(target, seg);
    return seg;
}

std::string methodList(const std::vector<boost::beast::http::verb>& methods) {
    std::string s;
    for (size_t i = 0; i < methods.size(); ++i) {
        if (i > 0) s += " or ";
        s += std::string(boost::beast::http::to_string(methods[i]));
    }
    return s;
}

const std::string& RouteParams::get(std::string_view name) const {
    static const std::string kNone;
    for (const auto& [n, v] : m_values)
        if (*n == name) return *v;
    return kNone;
}

PathPattern::PathPattern(std::string_view pattern) : m_text(pattern) {
    if (pattern.empty() || pattern[0] != '/')
        throw std::invalid_argument("route pattern '" + m_text + "' must start with '/'");
    for (auto& s : splitPath(pattern)) {
        Segment seg;
        if (s.size() > 2 && s.front() == '{' && s.back() == '}' && s.find_first_of("{}", 1) == s.size() - 1) {
            seg.text = s.substr(1, s.size() - 2);
            seg.capture = true;
        } else if (s.find_first_of("{}") != std::string::npos) {
            throw std::invalid_argument("route pattern '" + m_text +
                                        "': a capture is a whole segment, {name}");
        } else {
            seg.text = std::move(s);
        }
        m_segments.push_back(std::move(seg));
    }
}

bool PathPattern::match(const std::vector<std::string>& segments, RouteParams& params, bool prefix) const {
    if (prefix ? segments.size() < m_segments.size() : segments.size() != m_segments.size()) return false;
    for (size_t i = 0; i < m_segments.size(); ++i) {
        const auto& p = m_segments[i];
        if (p.capture)
            params.add(p.text, segments[i]);
        else if (p.text != segments[i])
            return false;
    }
    return true;
}

}  // namespace lathe::core::serving

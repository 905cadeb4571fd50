// Parsing of the Prometheus text exposition format (0.0.4) and histogram_quantile, as used by the
// scraper. The input comes over the network from a process that may be anything listening on
// the port, so the parser checks every byte and never reads past the line it is on.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "lathe/core/error.h"
#include "lathe/core/prometheus.h"

namespace lathe::core {

namespace {

bool isNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
bool isNameChar(char c) { return isNameStart(c) || (c >= '0' && c <= '9'); }
bool isLabelStart(char c) { return c != ':' && isNameStart(c); }
bool isLabelChar(char c) { return c != ':' && isNameChar(c); }
bool isBlank(char c) { return c == ' ' || c == '\t'; }

// A short, printable excerpt of a bad line for the error message.
std::string excerpt(std::string_view line) {
    std::string out;
    for (char c : line.substr(0, 80)) {
        const auto u = static_cast<unsigned char>(c);
        out += (u >= 0x20 && u < 0x7f) ? c : '?';
    }
    if (line.size() > 80) out += "...";
    return out;
}

class LineParser {
public:
    LineParser(std::string_view line, size_t lineNo) : m_line(line), m_lineNo(lineNo) {}

    PromSample parse() {
        PromSample s;
        s.name = readName(isNameStart, isNameChar, "metric name");
        const size_t afterName = m_pos;
        skipBlanks();
        if (peek() == '{') {
            ++m_pos;
            readLabels(s.labels);
            if (!atBlank()) fail("expected a space before the value");
            skipBlanks();
        } else if (m_pos == afterName) {
            fail("expected a space before the value");
        }
        s.value = readValue();
        skipBlanks();
        if (!atEnd()) {
            readTimestamp();  // validated, then dropped: the scraper stamps samples itself
            skipBlanks();
            if (!atEnd()) fail("unexpected text after the timestamp");
        }
        return s;
    }

private:
    [[noreturn]] void fail(const std::string& why) const {
        throw Error("metrics line " + std::to_string(m_lineNo) + ": " + why + " (at column " +
                    std::to_string(m_pos + 1) + ": '" + excerpt(m_line) + "')");
    }
    bool atEnd() const { return m_pos >= m_line.size(); }
    char peek() const { return atEnd() ? '\0' : m_line[m_pos]; }
    bool atBlank() const { return !atEnd() && isBlank(m_line[m_pos]); }
    void skipBlanks() {
        while (atBlank()) ++m_pos;
    }

    std::string readName(bool (*start)(char), bool (*rest)(char), const char* what) {
        if (atEnd() || !start(m_line[m_pos])) fail(std::string("expected a ") + what);
        const size_t from = m_pos++;
        while (!atEnd() && rest(m_line[m_pos])) ++m_pos;
        return std::string(m_line.substr(from, m_pos - from));
    }

    void readLabels(std::map<std::string, std::string>& labels) {
        for (;;) {
            skipBlanks();
            if (peek() == '}') {  // empty set or trailing comma
                ++m_pos;
                return;
            }
            std::string name = readName(isLabelStart, isLabelChar, "label name");
            skipBlanks();
            if (peek() != '=') fail("expected '=' after label name '" + name + "'");
            ++m_pos;
            skipBlanks();
            if (peek() != '"') fail("expected '\"' to start the value of label '" + name + "'");
            ++m_pos;
            std::string value = readLabelValue(name);
            if (!labels.emplace(name, std::move(value)).second) fail("label '" + name + "' given twice");
            skipBlanks();
            if (peek() == ',') {
                ++m_pos;
            } else if (peek() == '}') {
                ++m_pos;
                return;
            } else {
                fail("expected ',' or '}' after the value of label '" + name + "'");
            }
        }
    }

    std::string readLabelValue(const std::string& name) {
        std::string value;
        for (;;) {
            if (atEnd()) fail("unterminated value of label '" + name + "'");
            const char c = m_line[m_pos++];
            if (c == '"') return value;
            if (c != '\\') {
                value += c;
                continue;
            }
            if (atEnd()) fail("unterminated value of label '" + name + "'");
            const char e = m_line[m_pos++];
            if (e == '\\')
                value += '\\';
            else if (e == '"')
                value += '"';
            else if (e == 'n')
                value += '\n';
            else {
                --m_pos;
                fail("unknown escape '\\" + excerpt(std::string_view(&e, 1)) + "' in label '" + name + "'");
            }
        }
    }

    std::string_view token() {
        const size_t from = m_pos;
        while (!atEnd() && !isBlank(m_line[m_pos])) ++m_pos;
        return m_line.substr(from, m_pos - from);
    }

    double readValue() {
        const size_t from = m_pos;
        std::string_view t = token();
        if (t.empty()) fail("missing value");
        if (t == "NaN") return std::numeric_limits<double>::quiet_NaN();
        if (t == "+Inf" || t == "Inf") return std::numeric_limits<double>::infinity();
        if (t == "-Inf") return -std::numeric_limits<double>::infinity();
        // from_chars is locale-independent (strtod would read "0,5" under a German locale) but
        // rejects a leading '+', which Go's ParseFloat (and so Prometheus) accepts.
        std::string_view digits = t;
        if (digits.size() > 1 && digits.front() == '+' && digits[1] != '-') digits.remove_prefix(1);
        double v = 0;
        const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), v);
        if (res.ec == std::errc::result_out_of_range) {
            // from_chars leaves v untouched on overflow; Prometheus saturates to ±Inf / 0.
            const bool neg = digits.front() == '-';
            const size_t e = digits.find_first_of("eE");
            const bool tiny = e != std::string_view::npos && e + 1 < digits.size() && digits[e + 1] == '-';
            v = tiny ? 0.0 : (neg ? -1 : 1) * std::numeric_limits<double>::infinity();
        } else if (res.ec != std::errc() || res.ptr != digits.data() + digits.size()) {
            m_pos = from;
            fail("bad value '" + excerpt(t) + "'");
        }
        return v;
    }

    void readTimestamp() {
        const size_t from = m_pos;
        std::string_view t = token();
        int64_t ts = 0;
        const auto res = std::from_chars(t.data(), t.data() + t.size(), ts);
        if (res.ec != std::errc() || res.ptr != t.data() + t.size()) {
            m_pos = from;
            fail("bad timestamp '" + excerpt(t) + "' (expected integer milliseconds)");
        }
    }

    std::string_view m_line;
    size_t m_lineNo;
    size_t m_pos = 0;
};

}  // namespace

std::vector<PromSample> parsePrometheusText(const std::string& text) {
    std::vector<PromSample> out;
    const std::string_view all(text);
    size_t lineNo = 0;
    size_t pos = 0;
    while (pos < all.size()) {
        ++lineNo;
        size_t nl = all.find('\n', pos);
        if (nl == std::string_view::npos) nl = all.size();
        std::string_view line = all.substr(pos, nl - pos);
        pos = nl + 1;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // tolerate CRLF
        size_t first = 0;
        while (first < line.size() && isBlank(line[first])) ++first;
        line.remove_prefix(first);
        if (line.empty() || line.front() == '#') continue;
        out.push_back(LineParser(line, lineNo).parse());
    }
    return out;
}

double histogramQuantile(double q, const std::vector<std::pair<double, double>>& buckets) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (std::isnan(q)) return nan;
    if (q < 0) return -std::numeric_limits<double>::infinity();
    if (q > 1) return std::numeric_limits<double>::infinity();
    std::vector<std::pair<double, double>> b;
    b.reserve(buckets.size());
    for (const auto& p : buckets)
        if (!std::isnan(p.first) && !std::isnan(p.second)) b.push_back(p);
    std::stable_sort(b.begin(), b.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    if (b.size() < 2 || !std::isinf(b.back().first) || b.back().first < 0) return nan;
    // Buckets of one scrape are read non-atomically, so counts may dip by a few; like Prometheus,
    // force them monotonic rather than interpolating with negative bucket sizes.
    for (size_t i = 1; i < b.size(); ++i) b[i].second = std::max(b[i].second, b[i - 1].second);
    const double observations = b.back().second;
    if (!(observations > 0)) return nan;
    double rank = q * observations;
    size_t i = 0;
    while (i < b.size() && b[i].second < rank) ++i;
    if (i >= b.size() - 1) return b[b.size() - 2].first;  // in the +Inf bucket: the highest finite bound
    if (i == 0 && b[0].first <= 0) return b[0].first;
    double start = 0;
    const double end = b[i].first;
    double count = b[i].second;
    if (i > 0) {
        start = b[i - 1].first;
        count -= b[i - 1].second;
        rank -= b[i - 1].second;
    }
    if (!(count > 0)) return end;  // a zero-width step after coalescing: the bound is the answer
    return start + (end - start) * (rank / count);
}

}  // namespace lathe::core

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "data/raw.h"
#include "lathe/core/error.h"

namespace lathe::core::data {
namespace {

// Splits one CSV line on commas; quoted fields ("a,b", with "" as an escaped quote) are kept whole.
std::vector<std::string> splitCsvLine(std::string_view line, const std::string& where) {
    std::vector<std::string> out;
    std::string cur;
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quoted) {
            if (c == '"') {
                if (i + 1 < line.size() && line[i + 1] == '"') {
                    cur += '"';
                    ++i;
                } else {
                    quoted = false;
                }
            } else {
                cur += c;
            }
        } else if (c == '"') {
            quoted = true;
        } else if (c == ',') {
            out.push_back(std::move(cur));
            cur.clear();
        } else if (c != '\r') {
            cur += c;
        }
    }
    if (quoted) throw DataError(where + ": unterminated quoted field");
    out.push_back(std::move(cur));
    for (auto& f : out) {
        const auto b = f.find_first_not_of(" \t");
        const auto e = f.find_last_not_of(" \t");
        f = b == std::string::npos ? std::string() : f.substr(b, e - b + 1);
    }
    return out;
}

bool parseNumber(const std::string& text, double& out) {
    if (text.empty()) return false;
    // A plain decimal (nearly every field) by from_chars, three times quicker than strtod: both
    // round correctly, so the value is the same. Anything else (spaces, '+', hex, another
    // locale's form) goes to strtod as before, and so does a subnormal result, which strtod
    // refuses (ERANGE) where from_chars would not.
    const char* first = text.data();
    const char* last = first + text.size();
    if (const auto [ptr, ec] = std::from_chars(first, last, out);
        ec == std::errc() && ptr == last && std::fpclassify(out) != FP_SUBNORMAL)
        return std::isfinite(out);
    errno = 0;
    char* end = nullptr;
    out = std::strtod(text.c_str(), &end);
    return errno == 0 && end == text.c_str() + text.size() && std::isfinite(out);
}

template <typename Fn>
void forEachLine(const std::string& text, Fn fn) {
    size_t pos = 0;
    int64_t lineNo = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        ++lineNo;
        std::string_view line(text.data() + pos, end - pos);
        if (line.find_first_not_of(" \t\r") != std::string_view::npos) fn(lineNo, line);
        pos = end + 1;
    }
}

}  // namespace

RawSet parseDigits(const std::string& text, const std::string& source) {
    RawSet s;
    s.shape = {1, 8, 8};
    for (int c = 0; c < 10; ++c) s.classNames.push_back(std::to_string(c));
    forEachLine(text, [&](int64_t lineNo, std::string_view line) {
        const std::string where = source + " line " + std::to_string(lineNo);
        const auto fields = splitCsvLine(line, where);
        if (fields.size() != 65)
            throw DataError(where + ": expected 65 columns (64 pixels and a label), found " +
                            std::to_string(fields.size()));
        for (size_t i = 0; i < 65; ++i) {
            double v;
            if (!parseNumber(fields[i], v) || v < 0 || v > 16 || v != std::floor(v))
                throw DataError(where + " column " + std::to_string(i + 1) + ": '" + fields[i] + "' is not " +
                                (i < 64 ? "a pixel count 0..16" : "a digit label 0..9"));
            if (i < 64)
                s.x.push_back(static_cast<float>(v / 16.0));
            else if (v > 9)
                throw DataError(where + ": label " + fields[i] + " is not a digit 0..9");
            else
                s.y.push_back(static_cast<int64_t>(v));
        }
    });
    if (s.y.empty()) throw DataError(source + " holds no samples");
    return s;
}

RawSet parseCsv(const std::string& text, const std::string& labelColumn, const std::string& source) {
    std::vector<std::string> header;
    size_t labelIdx = 0;
    std::vector<std::string> labels;
    RawSet s;
    size_t nFeatures = 0;
    forEachLine(text, [&](int64_t lineNo, std::string_view line) {
        const std::string where = source + " line " + std::to_string(lineNo);
        if (header.empty() && line.substr(0, 3) == "\xEF\xBB\xBF")
            line.remove_prefix(3);  // UTF-8 BOM (Excel)
        auto fields = splitCsvLine(line, where);
        if (header.empty()) {
            header = std::move(fields);
            auto it = std::find(header.begin(), header.end(), labelColumn);
            if (it == header.end()) {
                std::string cols;
                for (const auto& h : header) cols += (cols.empty() ? "" : ", ") + h;
                throw DataError(source + ": no label column '" + labelColumn +
                                "' in the header (columns: " + cols + "); set label_column");
            }
            labelIdx = static_cast<size_t>(it - header.begin());
            nFeatures = header.size() - 1;
            if (nFeatures == 0) throw DataError(source + ": no feature columns besides the label");
            return;
        }
        if (fields.size() != header.size())
            throw DataError(where + ": expected " + std::to_string(header.size()) + " columns, found " +
                            std::to_string(fields.size()));
        for (size_t i = 0; i < fields.size(); ++i) {
            if (i == labelIdx) {
                if (fields[i].empty()) throw DataError(where + ": empty label in column '" + header[i] + "'");
                labels.push_back(fields[i]);
                continue;
            }
            double v;
            if (!parseNumber(fields[i], v))
                throw DataError(where + " column '" + header[i] + "': '" + fields[i] + "' is not a number");
            // Features are float32: a larger value would become inf and turn its column into NaN.
            if (std::fabs(v) > std::numeric_limits<float>::max())
                throw DataError(where + " column '" + header[i] + "': '" + fields[i] +
                                "' is out of the float range (|x| <= 3.4e38)");
            s.x.push_back(static_cast<float>(v));
        }
    });
    if (header.empty()) throw DataError(source + " is empty (expected a header row and samples)");
    if (labels.empty()) throw DataError(source + " has a header but no samples");
    // Numeric labels sort numerically (2 before 10); anything else sorts as text.
    bool numeric = true;
    for (const auto& l : labels) {
        double v;
        if (!parseNumber(l, v)) {
            numeric = false;
            break;
        }
    }
    std::vector<std::string> classes(labels.begin(), labels.end());
    std::sort(classes.begin(), classes.end(), [&](const std::string& a, const std::string& b) {
        return numeric ? std::strtod(a.c_str(), nullptr) < std::strtod(b.c_str(), nullptr) : a < b;
    });
    classes.erase(std::unique(classes.begin(), classes.end(),
                              [&](const std::string& a, const std::string& b) {
                                  return numeric ? std::strtod(a.c_str(), nullptr) ==
                                                       std::strtod(b.c_str(), nullptr)
                                                 : a == b;
                              }),
                  classes.end());
    if (classes.size() < 2)
        throw DataError(source + ": label column '" + labelColumn +
                        "' holds a single class; nothing to learn");
    if (classes.size() > 10000)
        throw DataError(source + ": label column '" + labelColumn + "' holds " +
                        std::to_string(classes.size()) + " distinct values; is it really a class label?");
    std::map<std::string, int64_t> index;
    for (size_t i = 0; i < classes.size(); ++i) index[classes[i]] = static_cast<int64_t>(i);
    for (const auto& l : labels) {
        auto it = index.find(l);
        if (it == index.end()) {  // numerically equal spelling, e.g. "1.0" vs "1"
            const double v = std::strtod(l.c_str(), nullptr);
            for (size_t i = 0; i < classes.size(); ++i)
                if (std::strtod(classes[i].c_str(), nullptr) == v) it = index.find(classes[i]);
        }
        s.y.push_back(it->second);
    }
    s.classNames = std::move(classes);
    s.shape = {static_cast<int64_t>(nFeatures)};
    return s;
}

}  // namespace lathe::core::data

#include "suggest.h"

#include <algorithm>
#include <cctype>

namespace lathe::cli {
namespace {

std::string lower(std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string undashed(const std::string& s) {
    const auto first = s.find_first_not_of('-');
    return first == std::string::npos ? std::string() : lower(s.substr(first));
}

}  // namespace

std::size_t editDistance(const std::string& a0, const std::string& b0) {
    const std::string a = lower(a0), b = lower(b0);
    const std::size_t n = a.size(), m = b.size();
    // d[i][j]: distance between a[0..i) and b[0..j); three rows suffice for the swap case.
    std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
    for (std::size_t j = 0; j <= m; ++j) prev[j] = j;
    for (std::size_t i = 1; i <= n; ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= m; ++j) {
            const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                cur[j] = std::min(cur[j], prev2[j - 2] + 1);
        }
        std::swap(prev2, prev);
        std::swap(prev, cur);
    }
    return prev[m];
}

std::vector<std::string> nearestNames(const std::string& typed, const std::vector<std::string>& candidates) {
    const std::string t = undashed(typed);
    if (t.empty()) return {};
    std::vector<std::string> prefixed;
    for (const auto& c : candidates) {
        const std::string u = undashed(c);
        if (u.size() > t.size() && u.compare(0, t.size(), t) == 0 &&
            std::find(prefixed.begin(), prefixed.end(), c) == prefixed.end())
            prefixed.push_back(c);
    }
    if (!prefixed.empty()) return prefixed;

    const std::size_t limit = std::max<std::size_t>(2, t.size() / 3);
    std::size_t best = limit + 1;
    std::vector<std::string> out;
    for (const auto& c : candidates) {
        const std::string u = undashed(c);
        if (u.empty()) continue;
        const std::size_t d = editDistance(t, u);
        if (d > limit || d >= t.size() || d >= u.size()) continue;
        if (d < best) {
            best = d;
            out.clear();
        }
        if (d == best && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
    return out;
}

std::string similarText(const std::string& what, const std::vector<std::string>& names) {
    if (names.empty()) return {};
    std::string text =
        names.size() == 1 ? "The most similar " + what + " is" : "The most similar " + what + "s are";
    for (const auto& n : names) text += "\n    " + n;
    return text;
}

}  // namespace lathe::cli

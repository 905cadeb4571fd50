// Search spaces, the random and TPE samplers, ASHA's promotion rule (search.h).
#include "tuning/search.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <set>

#include "lathe/core/error.h"
#include "lathe/core/run_spec.h"

namespace lathe::core::tuning {

namespace {

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    const auto e = s.find_last_not_of(" \t");
    return s.substr(b, e - b + 1);
}

std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.10g", v);
    return buf;
}

bool isLog(Param::Kind k) { return k == Param::Kind::LogUniform || k == Param::Kind::LogInt; }
bool isInt(Param::Kind k) { return k == Param::Kind::Int || k == Param::Kind::LogInt; }

// Splits "a, [1,2], b" at top-level commas.
std::vector<std::string> splitArgs(const std::string& s) {
    std::vector<std::string> out;
    int depth = 0;
    std::string cur;
    for (char c : s) {
        if (c == '[') ++depth;
        if (c == ']') --depth;
        if (c == ',' && depth == 0) {
            out.push_back(trim(cur));
            cur.clear();
        } else {
            cur += c;
        }
    }
    out.push_back(trim(cur));
    return out;
}

double number(const std::string& text, const std::string& what) {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(v))
        throw ConfigError(what + ": '" + text + "' is not a number");
    return v;
}

// The encoded (search) scale: log for log kinds.
double encode(const Param& p, double v) { return isLog(p.kind) ? std::log(v) : v; }
double decode(const Param& p, double x) { return isLog(p.kind) ? std::exp(x) : x; }

std::string valueText(const Param& p, double v) {
    v = std::clamp(v, p.lo, p.hi);
    if (isInt(p.kind)) return std::to_string(static_cast<int64_t>(std::llround(v)));
    return fmt(v);
}

// ---- Parzen estimators --------------------------------------------------------------------

double normalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// A mixture of Gaussians truncated to [lo, hi] on the encoded scale.
struct Parzen {
    std::vector<double> mu, sigma, weight;
    double lo = 0, hi = 1;

    double logPdf(double x) const {
        double p = 0;
        for (size_t i = 0; i < mu.size(); ++i) {
            const double z = (x - mu[i]) / sigma[i];
            const double mass = normalCdf((hi - mu[i]) / sigma[i]) - normalCdf((lo - mu[i]) / sigma[i]);
            p +=
                weight[i] * std::exp(-0.5 * z * z) / (sigma[i] * std::sqrt(2 * M_PI) * std::max(mass, 1e-12));
        }
        return std::log(std::max(p, 1e-300));
    }

    double sample(std::mt19937_64& rng) const {
        std::discrete_distribution<size_t> pick(weight.begin(), weight.end());
        const size_t i = pick(rng);
        std::normal_distribution<double> n(mu[i], sigma[i]);
        for (int tries = 0; tries < 100; ++tries) {
            const double x = n(rng);
            if (x >= lo && x <= hi) return x;
        }
        return std::clamp(mu[i], lo, hi);
    }
};

// Observations on the encoded scale plus a prior at the centre of the range with the range's
// width; each observation's bandwidth is the larger distance to its neighbours (Optuna's
// default, clipped between range/min(100, n+1) and the range).
Parzen buildParzen(const std::vector<double>& xs, double lo, double hi, double priorWeight) {
    Parzen pz;
    pz.lo = lo;
    pz.hi = hi;
    const double range = hi - lo;
    std::vector<double> pts = xs;
    const double prior = 0.5 * (lo + hi);
    pts.push_back(prior);
    std::vector<size_t> order(pts.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pts[a] < pts[b]; });
    std::vector<double> sigma(pts.size(), range);
    for (size_t r = 0; r < order.size(); ++r) {
        const double left = r > 0 ? pts[order[r]] - pts[order[r - 1]] : pts[order[r]] - lo;
        const double right = r + 1 < order.size() ? pts[order[r + 1]] - pts[order[r]] : hi - pts[order[r]];
        sigma[order[r]] = std::max(left, right);
    }
    const double minSigma = range / std::min(100.0, static_cast<double>(pts.size()) + 1.0);
    for (size_t i = 0; i < pts.size(); ++i) {
        const bool isPrior = i + 1 == pts.size();
        pz.mu.push_back(pts[i]);
        pz.sigma.push_back(isPrior ? range : std::clamp(sigma[i], minSigma, range));
        pz.weight.push_back(isPrior ? priorWeight : 1.0);
    }
    return pz;
}

}  // namespace

std::string Param::describe() const {
    switch (kind) {
        case Kind::Uniform:
            return "uniform(" + fmt(lo) + ", " + fmt(hi) + ")";
        case Kind::LogUniform:
            return "loguniform(" + fmt(lo) + ", " + fmt(hi) + ")";
        case Kind::Int:
            return "int(" + fmt(lo) + ", " + fmt(hi) + ")";
        case Kind::LogInt:
            return "logint(" + fmt(lo) + ", " + fmt(hi) + ")";
        case Kind::Choice: {
            std::string out = "choice(";
            for (size_t i = 0; i < choices.size(); ++i) out += (i ? ", " : "") + choices[i];
            return out + ")";
        }
    }
    return "?";
}

Param parseParam(const std::string& text) {
    const std::string form =
        "a search space entry is KEY=uniform(A,B), loguniform(A,B), int(A,B), logint(A,B) or "
        "choice(V1,V2,...) (got '" +
        text + "')";
    const auto eq = text.find('=');
    if (eq == std::string::npos) throw ConfigError(form);
    Param p;
    p.key = trim(text.substr(0, eq));
    const std::string dist = trim(text.substr(eq + 1));
    const auto open = dist.find('(');
    if (open == std::string::npos || dist.back() != ')') throw ConfigError(form);
    const std::string name = trim(dist.substr(0, open));
    const auto args = splitArgs(dist.substr(open + 1, dist.size() - open - 2));
    const auto& keys = specKeys();
    const auto key =
        std::find_if(keys.begin(), keys.end(), [&](const SpecKey& k) { return k.name == p.key; });
    if (key == keys.end())
        throw ConfigError("unknown run-spec key `" + p.key + "` in the search space (" + text + ")");
    const std::string what = "`" + p.key + "` in the search space";
    auto checkValue = [&](const std::string& v) {
        const auto problem = checkSpecValue(p.key, v);
        if (!problem.empty()) throw ConfigError(what + ": " + problem);
    };
    if (name == "choice") {
        p.kind = Param::Kind::Choice;
        for (auto a : args) {
            if (a.empty()) throw ConfigError(what + ": an empty choice (" + text + ")");
            if (a.front() == '[' && a.back() == ']') a = trim(a.substr(1, a.size() - 2));
            checkValue(a);
            if (std::find(p.choices.begin(), p.choices.end(), a) != p.choices.end())
                throw ConfigError(what + ": the choice " + a + " is given twice");
            p.choices.push_back(a);
        }
        if (p.choices.size() < 2) throw ConfigError(what + ": a choice needs at least two values");
        return p;
    }
    if (name == "uniform")
        p.kind = Param::Kind::Uniform;
    else if (name == "loguniform")
        p.kind = Param::Kind::LogUniform;
    else if (name == "int")
        p.kind = Param::Kind::Int;
    else if (name == "logint")
        p.kind = Param::Kind::LogInt;
    else
        throw ConfigError(form);
    if (args.size() != 2) throw ConfigError(what + ": " + name + " takes two bounds (" + text + ")");
    if (key->kind != "int" && key->kind != "float")
        throw ConfigError(what + ": `" + p.key + "` is not numeric (a " + key->kind + "); use choice(...)");
    if (key->kind == "int" && !isInt(p.kind))
        throw ConfigError(what + ": `" + p.key + "` takes whole numbers; use int(A,B) or logint(A,B)");
    p.lo = number(args[0], what);
    p.hi = number(args[1], what);
    if (!(p.lo < p.hi)) throw ConfigError(what + ": the lower bound must be below the upper (" + text + ")");
    if (isLog(p.kind) && !(p.lo > 0))
        throw ConfigError(what + ": a log range needs bounds > 0 (" + text + ")");
    if (isInt(p.kind) && (p.lo != std::floor(p.lo) || p.hi != std::floor(p.hi)))
        throw ConfigError(what + ": int bounds are whole numbers (" + text + ")");
    checkValue(valueText(p, p.lo));
    checkValue(valueText(p, p.hi));
    return p;
}

void SearchSpace::check() const {
    if (params.empty())
        throw ConfigError("the search space is empty: give at least one --space KEY=DIST(...)");
    std::set<std::string> seen;
    for (const auto& p : params)
        if (!seen.insert(p.key).second) throw ConfigError("`" + p.key + "` is searched twice in the space");
}

std::string sampleUniform(const Param& p, std::mt19937_64& rng) {
    // Draws from 53 random bits, not std::uniform_real_distribution: the same on every library.
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    if (p.kind == Param::Kind::Choice) {
        const auto i =
            std::min(p.choices.size() - 1, static_cast<size_t>(u * static_cast<double>(p.choices.size())));
        return p.choices[i];
    }
    double lo = encode(p, p.lo), hi = encode(p, p.hi);
    if (isInt(p.kind)) {  // every integer equally likely (on its scale)
        lo = encode(p, p.lo - 0.5);
        hi = encode(p, p.hi + 0.5);
    }
    return valueText(p, decode(p, lo + u * (hi - lo)));
}

Assignment sampleRandom(const SearchSpace& space, std::mt19937_64& rng) {
    Assignment a;
    for (const auto& p : space.params) a[p.key] = sampleUniform(p, rng);
    return a;
}

Assignment sampleTpe(const SearchSpace& space, const std::vector<Observation>& history, Direction direction,
                     std::mt19937_64& rng, const TpeOptions& options) {
    std::vector<const Observation*> done;
    for (const auto& o : history)
        if (o.value && std::isfinite(*o.value)) done.push_back(&o);
    if (static_cast<int>(done.size()) < options.startupTrials) return sampleRandom(space, rng);
    // Best first: complete trials, then pruned ones by the rung they reached (later first), by
    // value within each.
    std::stable_sort(done.begin(), done.end(), [&](const Observation* a, const Observation* b) {
        const double fa = a->prunedAt ? *a->prunedAt : std::numeric_limits<double>::infinity();
        const double fb = b->prunedAt ? *b->prunedAt : std::numeric_limits<double>::infinity();
        if (fa != fb) return fa > fb;
        return direction == Direction::Maximize ? *a->value > *b->value : *a->value < *b->value;
    });
    const size_t n = done.size();
    const size_t nGood = std::min<size_t>(static_cast<size_t>(std::ceil(0.1 * static_cast<double>(n))), 25);
    Assignment out;
    for (const auto& p : space.params) {
        std::vector<const Observation*> good, bad;
        for (size_t i = 0; i < n; ++i) {
            if (!done[i]->params.count(p.key)) continue;  // a trial from before the key was searched
            (i < nGood ? good : bad).push_back(done[i]);
        }
        if (p.kind == Param::Kind::Choice) {
            const size_t k = p.choices.size();
            std::vector<double> lw(k, options.priorWeight), gw(k, options.priorWeight);
            auto count = [&](const std::vector<const Observation*>& set, std::vector<double>& w) {
                for (const auto* o : set) {
                    const auto it = std::find(p.choices.begin(), p.choices.end(), o->params.at(p.key));
                    if (it != p.choices.end()) w[static_cast<size_t>(it - p.choices.begin())] += 1.0;
                }
            };
            count(good, lw);
            count(bad, gw);
            const double lsum = std::accumulate(lw.begin(), lw.end(), 0.0);
            const double gsum = std::accumulate(gw.begin(), gw.end(), 0.0);
            std::discrete_distribution<size_t> pick(lw.begin(), lw.end());
            size_t best = 0;
            double bestScore = -std::numeric_limits<double>::infinity();
            for (int c = 0; c < options.candidates; ++c) {
                const size_t i = pick(rng);
                const double score = std::log(lw[i] / lsum) - std::log(gw[i] / gsum);
                if (score > bestScore) {
                    bestScore = score;
                    best = i;
                }
            }
            out[p.key] = p.choices[best];
            continue;
        }
        const double lo = encode(p, isInt(p.kind) ? p.lo - 0.5 : p.lo);
        const double hi = encode(p, isInt(p.kind) ? p.hi + 0.5 : p.hi);
        auto xs = [&](const std::vector<const Observation*>& set) {
            std::vector<double> v;
            for (const auto* o : set)
                v.push_back(std::clamp(encode(p, std::strtod(o->params.at(p.key).c_str(), nullptr)), lo, hi));
            return v;
        };
        const Parzen l = buildParzen(xs(good), lo, hi, options.priorWeight);
        const Parzen g = buildParzen(xs(bad), lo, hi, options.priorWeight);
        double best = l.sample(rng), bestScore = -std::numeric_limits<double>::infinity();
        for (int c = 0; c < options.candidates; ++c) {
            const double x = l.sample(rng);
            const double score = l.logPdf(x) - g.logPdf(x);
            if (score > bestScore) {
                bestScore = score;
                best = x;
            }
        }
        out[p.key] = valueText(p, decode(p, best));
    }
    return out;
}

std::vector<double> Asha::rungs() const {
    std::vector<double> out;
    for (double b = minBudget; b <= maxBudget * (1 + 1e-9); b *= eta) out.push_back(b);
    return out;
}

bool Asha::promote(double value, const std::vector<double>& atRung, Direction direction, double eta) {
    // As Optuna's SuccessiveHalvingPruner: the trial continues when it is among the top
    // floor(n / eta) at the rung (the best alone while fewer than eta have reached it).
    std::vector<double> v = atRung;
    if (direction == Direction::Maximize)
        std::sort(v.begin(), v.end(), std::greater<double>());
    else
        std::sort(v.begin(), v.end());
    const auto keep = std::max<size_t>(1, static_cast<size_t>(static_cast<double>(v.size()) / eta));
    const double threshold = v[std::min(keep, v.size()) - 1];
    return direction == Direction::Maximize ? value >= threshold : value <= threshold;
}

}  // namespace lathe::core::tuning

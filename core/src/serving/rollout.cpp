// Progressive rollouts: the statistics that judge a window, the commands that start, pause,
// resume and abort a rollout, and the controller that steps it. See rollout.h and the serving
// README's "Progressive rollout" section.
#include "lathe/core/rollout.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "deploy_internal.h"
#include "lathe/core/events.h"
#include "lathe/core/http_client.h"
#include "lathe/core/store.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace lathe::core {

namespace {

std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string percent(double fraction) { return fmt("%.2f%%", 100.0 * fraction); }
std::string ms(double v) { return std::isfinite(v) ? fmt("%.2f ms", v) : std::string("n/a"); }
std::string pval(double p) { return p < 1e-4 ? std::string("p<0.0001") : fmt("p=%.4f", p); }
std::string weightText(int32_t bp) { return fmt("%g%%", bp / 100.0); }

bool parseNumber(const std::string& text, double& out) {
    const char* end = text.data() + text.size();
    const auto r = std::from_chars(text.data(), end, out);
    return !text.empty() && r.ec == std::errc() && r.ptr == end && std::isfinite(out);
}

std::string trim(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
}

double normalUpperTail(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }

}  // namespace

// ---- parsing --------------------------------------------------------------------------------

std::vector<int32_t> parseRolloutSteps(const std::string& text) {
    std::vector<int32_t> out;
    size_t start = 0;
    if (trim(text).empty()) throw ConfigError("--steps is empty: give percentages such as 5,25,50,100");
    while (start <= text.size()) {
        const auto comma = text.find(',', start);
        std::string item =
            trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (!item.empty() && item.back() == '%') item.pop_back();
        double v = 0;
        if (!parseNumber(item, v))
            throw ConfigError("--steps: '" + item.substr(0, 32) +
                              "' is not a percentage (steps are 1 to 100)");
        if (v < 1 || v > 100)
            throw ConfigError("--steps: " + item +
                              " is out of 1..100 (each step is the candidate's share in percent)");
        const auto bp = static_cast<int32_t>(std::lround(v * 100));
        if (!out.empty() && bp <= out.back())
            throw ConfigError("--steps must rise: " + item + " follows " + fmt("%g", out.back() / 100.0));
        out.push_back(bp);
        if (out.size() > 100) throw ConfigError("--steps: at most 100 steps");
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

double parseDurationSeconds(const std::string& raw, const char* what) {
    std::string text = trim(raw);
    double unit = 1;
    if (!text.empty()) {
        switch (text.back()) {
            case 's':
                unit = 1;
                text.pop_back();
                break;
            case 'm':
                unit = 60;
                text.pop_back();
                break;
            case 'h':
                unit = 3600;
                text.pop_back();
                break;
            case 'd':
                unit = 86400;
                text.pop_back();
                break;
            default:
                break;
        }
    }
    double v = 0;
    if (!parseNumber(text, v) || !(v > 0) || v * unit > 366.0 * 86400)
        throw ConfigError(std::string(what) +
                          " must be a duration such as 30s, 10m or 72h (at most a year), got '" +
                          raw.substr(0, 32) + "'");
    return v * unit;
}

double parseRate(const std::string& raw, const char* what) {
    std::string text = trim(raw);
    double scale = 1;
    if (!text.empty() && text.back() == '%') {
        text.pop_back();
        scale = 0.01;
    }
    double v = 0;
    if (!parseNumber(text, v) || !(v * scale > 0) || v * scale > 1)
        throw ConfigError(std::string(what) +
                          " must be a share such as 1% or 0.01 (above 0, at most 100%), got '" +
                          raw.substr(0, 32) + "'");
    return v * scale;
}

// ---- statistics -----------------------------------------------------------------------------

double VariantWindow::p99Ms() const { return histogramQuantile(0.99, latency) * 1000.0; }
double VariantWindow::p50Ms() const { return histogramQuantile(0.50, latency) * 1000.0; }

std::map<int64_t, VariantWindow> variantWindows(const std::string& model,
                                                const std::vector<PromSample>& start,
                                                const std::vector<PromSample>& end) {
    auto wanted = [&](const PromSample& s, int64_t& version) {
        if (s.name != "lathe_requests_total" && s.name != "lathe_request_duration_seconds_bucket")
            return false;
        const auto m = s.labels.find("model");
        const auto v = s.labels.find("version");
        if (m == s.labels.end() || m->second != model || v == s.labels.end()) return false;
        const char* b = v->second.data();
        const auto r = std::from_chars(b, b + v->second.size(), version);
        return r.ec == std::errc() && r.ptr == b + v->second.size() && version > 0 && std::isfinite(s.value);
    };
    auto key = [](const PromSample& s) {
        std::string k = s.name;
        for (const auto& [n, v] : s.labels) k += '\x1f' + n + '=' + v;
        return k;
    };
    std::unordered_map<std::string, double> before;
    for (const auto& s : start) {
        int64_t v = 0;
        if (wanted(s, v)) before.emplace(key(s), s.value);
    }
    std::map<int64_t, VariantWindow> out;
    std::map<int64_t, std::map<double, double>> buckets;
    for (const auto& s : end) {
        int64_t v = 0;
        if (!wanted(s, v)) continue;
        const auto it = before.find(key(s));
        const double was = it == before.end() ? 0.0 : it->second;
        if (s.value < was) return {};  // the server restarted: its counters began again
        const double grew = s.value - was;
        auto& w = out[v];
        w.version = v;
        if (s.name == "lathe_requests_total") {
            w.requests += grew;
            const auto code = s.labels.find("code");
            int c = 0;
            if (code != s.labels.end())
                std::from_chars(code->second.data(), code->second.data() + code->second.size(), c);
            if (c >= 500) w.errors += grew;
        } else {
            const auto le = s.labels.find("le");
            if (le == s.labels.end()) continue;
            double bound = 0;
            if (le->second == "+Inf" || le->second == "Inf")
                bound = std::numeric_limits<double>::infinity();
            else if (!parseNumber(le->second, bound))
                continue;
            buckets[v][bound] += grew;
        }
    }
    for (auto& [v, b] : buckets) {
        auto& lat = out[v].latency;
        for (const auto& [bound, count] : b) lat.emplace_back(bound, count);
        // Buckets are read one by one while requests arrive: keep the cumulative counts monotonic.
        for (size_t i = 1; i < lat.size(); ++i) lat[i].second = std::max(lat[i].second, lat[i - 1].second);
    }
    return out;
}

double twoProportionPValue(double e1, double n1, double e2, double n2) {
    if (!(n1 > 0) || !(n2 > 0)) return 1.0;
    const double p1 = e1 / n1, p2 = e2 / n2;
    const double pooled = (e1 + e2) / (n1 + n2);
    const double se = std::sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2));
    if (!(se > 0)) return 1.0;  // both 0% (or both 100%): nothing tells them apart
    return normalUpperTail((p1 - p2) / se);
}

double rankTestPValue(const VariantWindow& a, const VariantWindow& b) {
    // Per-bucket counts from the cumulative ones, over the union of both bounds.
    std::map<double, std::pair<double, double>> counts;
    auto add = [&](const std::vector<std::pair<double, double>>& cum, bool first) {
        double below = 0;
        for (const auto& [bound, c] : cum) {
            const double n = std::max(0.0, c - below);
            below = std::max(below, c);
            (first ? counts[bound].first : counts[bound].second) += n;
        }
    };
    add(a.latency, true);
    add(b.latency, false);
    double na = 0, nb = 0;
    for (const auto& [bound, c] : counts) {
        na += c.first;
        nb += c.second;
    }
    if (!(na > 0) || !(nb > 0)) return 1.0;
    // U of the first sample: pairs where it is slower, ties (same bucket) counting half.
    double u = 0, belowB = 0, ties = 0;
    for (const auto& [bound, c] : counts) {
        u += c.first * (belowB + 0.5 * c.second);
        belowB += c.second;
        const double t = c.first + c.second;
        ties += t * t * t - t;
    }
    const double n = na + nb;
    const double var = na * nb / 12.0 * ((n + 1) - ties / (n * (n - 1)));
    if (!(var > 0)) return 1.0;  // everything in one bucket: nothing to rank
    const double z = (u - na * nb / 2.0 - 0.5) / std::sqrt(var);
    return normalUpperTail(z);
}

RolloutVerdict judgeRolloutWindow(const Rollout& plan, const VariantWindow& base, const VariantWindow& cand) {
    constexpr double kAlpha = 0.05;
    constexpr double kRelativeP99 = 1.5;
    RolloutVerdict v;
    auto& num = v.numbers;
    const auto minN = static_cast<double>(std::max<int64_t>(1, plan.minRequests));
    num["candidate_requests"] = cand.requests;
    num["baseline_requests"] = base.requests;
    num["min_requests"] = minN;
    if (cand.requests < minN) {
        v.kind = "hold";
        v.extendWindow = true;
        v.reason = cand.requests == 0
                       ? "no traffic reached the candidate yet: holding (no data is never a pass)"
                       : "the candidate has answered " + fmt("%.0f", cand.requests) + " of the " +
                             fmt("%.0f", minN) + " requests needed to judge: holding, the window goes on";
        return v;
    }
    // At 100% the baseline gets only requests sent to its version by name: the candidate is then
    // judged on the limits alone.
    const bool compare = base.requests >= minN;
    if (!compare && plan.weightBp < 10000) {
        v.kind = "hold";
        v.extendWindow = true;
        v.reason = "the baseline has answered " + fmt("%.0f", base.requests) + " of the " +
                   fmt("%.0f", minN) + " requests needed to compare: holding, the window goes on";
        return v;
    }
    const double rC = cand.errors / cand.requests;
    const double rB = base.requests > 0 ? base.errors / base.requests : 0.0;
    const double pErr =
        compare ? twoProportionPValue(cand.errors, cand.requests, base.errors, base.requests) : 0.0;
    num["candidate_error_rate"] = rC;
    num["baseline_error_rate"] = rB;
    num["max_error_rate"] = plan.maxErrorRate;
    if (compare) num["error_p"] = pErr;
    const bool errOver = rC > plan.maxErrorRate;
    const bool errBad = errOver && pErr < kAlpha;

    const double p99C = cand.p99Ms();
    const double p99B = compare ? base.p99Ms() : std::numeric_limits<double>::quiet_NaN();
    const double pLat = compare ? rankTestPValue(cand, base) : 0.0;
    if (std::isfinite(p99C)) num["candidate_p99_ms"] = p99C;
    if (std::isfinite(p99B)) num["baseline_p99_ms"] = p99B;
    if (compare) num["latency_p"] = pLat;
    double limit = std::numeric_limits<double>::infinity();
    std::string limitText;
    if (plan.maxP99Ms > 0) {
        limit = plan.maxP99Ms;
        limitText = "limit " + ms(limit);
    } else if (std::isfinite(p99B)) {
        limit = kRelativeP99 * p99B;
        limitText = "limit 1.5x the baseline's";
    }
    if (std::isfinite(limit)) num["p99_limit_ms"] = limit;
    const bool latOver = std::isfinite(p99C) && p99C > limit;
    const bool latBad = latOver && pLat < kAlpha;

    const std::string errText = "error rate " + percent(rC) +
                                (compare ? " vs " + percent(rB) + " (" + pval(pErr) + ")" : "") + ", limit " +
                                percent(plan.maxErrorRate);
    const std::string latText = "P99 " + ms(p99C) +
                                (compare ? " vs " + ms(p99B) + " (rank test " + pval(pLat) + ")" : "") +
                                (limitText.empty() ? "" : ", " + limitText);
    const std::string sample = " over " + fmt("%.0f", cand.requests) + " candidate and " +
                               fmt("%.0f", base.requests) + " baseline requests";
    if (errBad || latBad) {
        v.kind = "unhealthy";
        v.reason = std::string(errBad ? errText : "") + (errBad && latBad ? "; " : "") +
                   (latBad ? latText : "") + sample;
        return v;
    }
    if (errOver || latOver) {
        v.kind = "hold";
        v.reason = "the candidate breaks a limit but the baseline does as much, so it is not worse (" +
                   (errOver ? errText : latText) + ")" + sample + ": holding";
        return v;
    }
    v.kind = "healthy";
    v.reason = errText + "; " + latText + sample;
    return v;
}

// ---- the commands and the controller ----------------------------------------------------------

namespace {

void say(const RolloutOptions& o, const std::string& text) {
    if (o.progress) o.progress(text);
}

std::string controllerLockPath(const Registry& registry, const std::string& model) {
    return (fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments" /
            ("rollout-" + model + ".lock"))
        .string();
}

std::string errorOf(const HttpResult& r) {
    try {
        return json::parse(r.body).at("error").get<std::string>();
    } catch (...) {
        return r.body.substr(0, 300);
    }
}

// The live server's rollout API.
struct ServerSplit {
    int64_t baseline = 0, candidate = 0;
    int32_t weightBp = 0;
};

ServerSplit serverSplit(const Registry& registry, const Deployment& live, double timeoutS) {
    const auto r = httpRequest("GET", live.url + "/v2/repository/models/" + live.model + "/rollout", {},
                               timeoutS, "application/json",
                               deploy_detail::controlHeaders(registry.deploymentToken(live.instance)));
    if (r.status != 200)
        throw Error("the server at " + live.url + " answered HTTP " + std::to_string(r.status) + ": " +
                    errorOf(r));
    const auto j = json::parse(r.body);
    return {j.value("baseline", int64_t{0}), j.value("candidate", int64_t{0}),
            j.value("weight_bp", int32_t{0})};
}

void postRollout(Registry& registry, const Deployment& live, const json& body, double timeoutS) {
    const auto r = httpRequest("POST", live.url + "/v2/repository/models/" + live.model + "/rollout",
                               body.dump(), timeoutS, "application/json",
                               deploy_detail::controlHeaders(registry.deploymentToken(live.instance)));
    if (r.status != 200)
        throw Error("the server at " + live.url + " refused the rollout request (HTTP " +
                    std::to_string(r.status) + "): " + errorOf(r));
}

json candidateBody(const Rollout& r) {
    json c{{"version", r.candidate}};
    if (!r.candidatePath.empty()) {
        c["path"] = r.candidatePath;
        c["sha256"] = r.candidateSha256;
    }
    json body{{"candidate", c}, {"weight_bp", r.weightBp}};
    if (!r.userParameter.empty()) body["user_parameter"] = r.userParameter;
    return body;
}

std::string numbersJson(const std::map<std::string, double>& numbers) {
    json j = json::object();
    for (const auto& [k, v] : numbers)
        if (std::isfinite(v)) j[k] = v;
    return j.dump();
}

void decide(Registry& registry, const Rollout& r, const std::string& kind, const std::string& reason,
            const std::string& actor, const std::map<std::string, double>& numbers = {}) {
    RolloutDecision d;
    d.rolloutId = r.id;
    d.kind = kind;
    d.step = r.step;
    d.weightBp = r.weightBp;
    d.reason = reason;
    d.numbers = numbersJson(numbers);
    d.actor = actor;
    registry.addRolloutDecision(d);
}

std::string stepText(const Rollout& r) {
    return "step " + std::to_string(r.step + 1) + " of " + std::to_string(r.stepsBp.size()) + " (" +
           weightText(r.weightBp) + ")";
}

void startController(Registry& registry, const Rollout& r, const RolloutOptions& o) {
    if (o.controllerProgram.empty()) {
        say(o, "no lathectl to run the rollout's controller: resume it with `lathectl rollout resume " +
                   r.model + "`");
        return;
    }
    if (rolloutControllerRunning(registry, r.model)) return;
    const auto dir = fs::path(Store::filesDirFor(registry.workspacePath())) / "deployments";
    std::error_code ec;
    fs::create_directories(dir, ec);
    const auto log = (dir / (r.model + "-rollout-" + std::to_string(r.id) + ".log")).string();
    deploy_detail::spawnDetached(
        {o.controllerProgram, "rollout", "run", r.model, "--db", registry.workspacePath()}, log);
    // Until it holds its lock (a moment), so that what is printed next says it runs.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!rolloutControllerRunning(registry, r.model) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    say(o, "the rollout's controller runs detached (log " + log + ")");
}

Rollout activeOrThrow(const Registry& registry, const std::string& model) {
    auto r = registry.activeRollout(model);
    if (!r)
        throw ConfigError("no rollout of " + model + " is under way (see `lathectl rollout status " + model +
                          "`)");
    return *r;
}

// Ends a rollout in the workspace (its decision first, then the record).
void endRecord(Registry& registry, Rollout& r, const std::string& state, const std::string& kind,
               const std::string& reason, const std::string& actor,
               const std::map<std::string, double>& numbers = {}) {
    decide(registry, r, kind, reason, actor, numbers);
    r.state = state;
    r.endedAt = nowSeconds();
    r.endReason = reason;
    registry.updateRollout(r);
}

// The baseline serves everything again (the candidate is unloaded). A server that does not answer
// keeps no split over a restart, so that is reported, not thrown.
std::string abortAtServer(Registry& registry, const Deployment& live) {
    try {
        const auto split = serverSplit(registry, live, 5);
        if (split.candidate == 0) return {};
        postRollout(registry, live, json{{"end", "abort"}}, 30);
        return {};
    } catch (const std::exception& ex) {
        if (!deploymentUp(live, 2.0)) return std::string(" (the server does not answer: ") + ex.what() + ")";
        throw;
    }
}

}  // namespace

bool rolloutControllerRunning(const Registry& registry, const std::string& model) {
    checkModelName(model);
    FileLock probe(controllerLockPath(registry, model), false);
    return !probe.held();
}

bool ensureRolloutController(Registry& registry, const std::string& model, const RolloutOptions& o) {
    const auto r = registry.activeRollout(model);
    if (!r || rolloutControllerRunning(registry, model)) return false;
    say(o, "the rollout of " + model + " v" + std::to_string(r->candidate) + " (" + stepText(*r) + ", " +
               r->state + ") had no controller: starting it again");
    startController(registry, *r, o);
    return rolloutControllerRunning(registry, model);
}

Rollout startRollout(Registry& registry, Rollout plan, const RolloutOptions& o) {
    checkModelName(plan.model);
    if (plan.stepsBp.empty()) throw ConfigError("a rollout needs at least one step");
    for (size_t i = 0; i < plan.stepsBp.size(); ++i)
        if (plan.stepsBp[i] < 100 || plan.stepsBp[i] > 10000 ||
            (i > 0 && plan.stepsBp[i] <= plan.stepsBp[i - 1]))
            throw ConfigError("steps must rise within 1..100%");
    if (!(plan.intervalS > 0) || !std::isfinite(plan.intervalS)) throw ConfigError("--interval must be > 0");
    if (!(plan.maxErrorRate > 0) || plan.maxErrorRate > 1)
        throw ConfigError("--max-error-rate must be in (0, 100%]");
    if (!(plan.maxP99Ms >= 0) || !std::isfinite(plan.maxP99Ms))
        throw ConfigError("--max-p99-ms must be >= 0");
    if (plan.minRequests < 1) throw ConfigError("--min-requests must be at least 1");
    if (plan.threshold < 1) throw ConfigError("--threshold must be at least 1");
    if (plan.userParameter.size() > 64) throw ConfigError("--user-parameter must be a parameter's name");
    const auto lock = deploy_detail::lockModel(registry, plan.model);
    const auto cand = registry.resolve({plan.model, plan.candidate, {}});  // NotFoundError: unknown version
    const auto live = registry.liveDeployment(plan.model);
    if (!live)
        throw ConfigError(
            plan.model +
            " is not deployed: a rollout serves a candidate beside a live version (lathectl deploy " +
            plan.model + " first)");
    if (live->version == plan.candidate)
        throw ConfigError(plan.model + " v" + std::to_string(plan.candidate) +
                          " is the live version; a rollout's candidate must be another version");
    if (const auto running = registry.activeRollout(plan.model))
        throw ConfigError("a rollout of " + plan.model + " (v" + std::to_string(running->candidate) + ", " +
                          running->state + ") is under way; abort it first (lathectl rollout abort " +
                          plan.model + ")");
    if (!deploymentUp(*live, 2.0))
        throw Error(plan.model + "'s server at " + live->url + " does not answer; nothing was changed");
    plan.baseline = live->version;
    plan.state = "running";
    plan.step = 0;
    plan.weightBp = plan.stepsBp.front();
    plan.badInRow = 0;
    plan.actor = o.actor;
    if (deploy_detail::remoteTarget(live->target)) {
        if (!o.hostFor)
            throw ConfigError(plan.model + " runs on " + deploy_detail::placeOf(live->target) +
                              ", which this program cannot reach");
        say(o, "copying " + plan.model + " v" + std::to_string(plan.candidate) + " to " +
                   deploy_detail::placeOf(live->target));
        plan.candidatePath = o.hostFor(live->target)->stageArtifact(cand.path, cand.sha256);
        plan.candidateSha256 = cand.sha256;
    }
    plan.id = registry.createRollout(plan);  // ConfigError when another start won the race
    try {
        say(o, "loading " + plan.model + " v" + std::to_string(plan.candidate) + " beside v" +
                   std::to_string(plan.baseline) + " at " + live->url + " at " + weightText(plan.weightBp));
        postRollout(registry, *live, candidateBody(plan), 120);
    } catch (...) {
        registry.deleteRollout(plan.id);  // nothing changed
        throw;
    }
    decide(registry, plan, "start",
           "v" + std::to_string(plan.candidate) + " beside v" + std::to_string(plan.baseline) + " at " +
               weightText(plan.weightBp) + "; each step judged over " + fmt("%g s", plan.intervalS),
           o.actor);
    startController(registry, plan, o);
    return *registry.rollout(plan.id);
}

Rollout pauseRollout(Registry& registry, const std::string& model, const RolloutOptions& o) {
    const auto lock = deploy_detail::lockModel(registry, model);
    auto r = activeOrThrow(registry, model);
    if (r.state == "paused") throw ConfigError("the rollout of " + model + " is paused already");
    r.state = "paused";
    registry.updateRollout(r);
    decide(registry, r, "pause", "paused at " + stepText(r) + ": the split stays, nothing is judged",
           o.actor);
    return r;
}

Rollout resumeRollout(Registry& registry, const std::string& model, const RolloutOptions& o) {
    Rollout r;
    {
        const auto lock = deploy_detail::lockModel(registry, model);
        r = activeOrThrow(registry, model);
        if (r.state == "paused") {
            r.state = "running";
            registry.updateRollout(r);
            decide(registry, r, "resume", "resumed at " + stepText(r) + " with a fresh window", o.actor);
        } else if (rolloutControllerRunning(registry, model)) {
            throw ConfigError("the rollout of " + model + " is running (its controller too)");
        } else {
            decide(registry, r, "resume", "its controller was not running: started again at " + stepText(r),
                   o.actor);
        }
    }
    startController(registry, r, o);
    return r;
}

Rollout abortRollout(Registry& registry, const std::string& model, const std::string& reason,
                     const RolloutOptions& o) {
    const auto lock = deploy_detail::lockModel(registry, model);
    auto r = activeOrThrow(registry, model);
    std::string note;
    if (const auto live = registry.liveDeployment(model)) note = abortAtServer(registry, *live);
    r.weightBp = 0;
    endRecord(registry, r, "aborted", "abort",
              (reason.empty() ? std::string("aborted") : reason) + ": v" + std::to_string(r.baseline) +
                  " serves everything" + note,
              o.actor);
    return r;
}

// ---- the controller ---------------------------------------------------------------------------

namespace {

struct Snapshot {
    double t = 0;
    std::vector<PromSample> samples;
};

std::optional<Snapshot> scrape(const Deployment& live) {
    try {
        const auto r = httpRequest("GET", live.url + "/metrics", {}, 5);
        if (r.status != 200) return std::nullopt;
        return Snapshot{nowSeconds(), parsePrometheusText(r.body)};
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

class Controller {
public:
    Controller(Registry& registry, std::string model, std::function<void(const std::string&)> log)
        : m_registry(registry), m_model(std::move(model)), m_log(std::move(log)) {}

    // One look: false when the rollout is over.
    bool tick();
    double tickSeconds() const { return m_tickS; }

private:
    void note(const std::string& text) {
        if (m_log) m_log(text);
    }
    void noteOnce(const std::string& text) {
        if (text == m_lastNote) return;
        m_lastNote = text;
        note(text);
    }
    bool ensureSplit(const Rollout& r, const Deployment& live);
    void judge(Rollout r, const Deployment& live, const Snapshot& end);
    void promote(Rollout& r, const Deployment& live, const RolloutVerdict& v);
    void rollBack(Rollout& r, const Deployment& live, const RolloutVerdict& v);

    Registry& m_registry;
    std::string m_model;
    std::function<void(const std::string&)> m_log;
    std::string m_lastNote;
    int64_t m_rolloutId = 0;
    std::string m_instance;
    std::optional<Snapshot> m_window;
    double m_nextJudge = 0;   // when the window (or its extension) is judged next
    double m_splitCheck = 0;  // when the server's split was last compared with the record
    int m_seenStep = -1;
    double m_tickS = 0.25;
};

bool Controller::ensureSplit(const Rollout& r, const Deployment& live) {
    ServerSplit split;
    try {
        split = serverSplit(m_registry, live, 5);
    } catch (const std::exception& ex) {
        noteOnce(std::string("cannot read the server's split (") + ex.what() + "): holding until it answers");
        return false;
    }
    if (split.candidate == r.candidate && split.weightBp == r.weightBp) return true;
    // A restarted server, or a split changed by hand: the workspace's record is the truth.
    note("the server at " + live.url + " had " +
         (split.candidate ? "v" + std::to_string(split.candidate) + " at " + weightText(split.weightBp)
                          : std::string("no candidate")) +
         ": setting v" + std::to_string(r.candidate) + " at " + weightText(r.weightBp) + " again");
    try {
        postRollout(m_registry, live, candidateBody(r), 120);
    } catch (const std::exception& ex) {
        noteOnce(std::string("could not set the split: ") + ex.what());
        return false;
    }
    return false;  // a new window starts at the next look
}

bool Controller::tick() {
    std::optional<Rollout> r;
    std::optional<Deployment> live;
    try {
        r = m_registry.activeRollout(m_model);
        if (!r) return false;
        live = m_registry.liveDeployment(m_model);
    } catch (const std::exception& ex) {  // a busy workspace: look again
        noteOnce(std::string("reading the workspace failed: ") + ex.what());
        return true;
    }
    m_tickS = std::clamp(r->intervalS / 20, 0.1, 5.0);
    if (r->id != m_rolloutId || r->step != m_seenStep || !live || live->instance != m_instance) {
        m_window.reset();
        m_rolloutId = r->id;
        m_seenStep = r->step;
        m_instance = live ? live->instance : std::string();
    }
    if (!live || live->version != r->baseline) {
        const auto lock = deploy_detail::lockModel(m_registry, m_model);
        auto again = m_registry.activeRollout(m_model);
        if (!again || again->id != r->id) return true;
        live = m_registry.liveDeployment(m_model);
        if (live && live->version == r->baseline) return true;
        std::string why;
        if (!live) {
            why = m_model + " is not deployed any more";
        } else if (live->version == r->candidate) {
            why = "v" + std::to_string(r->candidate) + " was deployed by hand: the rollout is over";
        } else {
            why = "v" + std::to_string(live->version) + " was deployed meanwhile: the rollout of v" +
                  std::to_string(r->candidate) + " against v" + std::to_string(r->baseline) + " is over";
            why += abortAtServer(m_registry, *live);
        }
        again->weightBp = 0;
        endRecord(m_registry, *again, "ended", "ended", why, "auto");
        note(why);
        return false;
    }
    if (r->state != "running") {
        m_window.reset();
        noteOnce("paused at " + stepText(*r));
        return true;
    }
    // The server's split against the record: at most once a second (and before a window starts).
    if (!m_window || nowSeconds() - m_splitCheck >= 1.0) {
        m_splitCheck = nowSeconds();
        if (!ensureSplit(*r, *live)) {
            m_window.reset();
            return true;
        }
    }
    if (!m_window) {
        m_window = scrape(*live);
        if (m_window) {
            m_nextJudge = m_window->t + r->intervalS;
            noteOnce("judging " + stepText(*r) + ": window from now, " + fmt("%g s", r->intervalS));
        }
        return true;
    }
    if (nowSeconds() < m_nextJudge) return true;
    const auto end = scrape(*live);
    if (!end) {
        noteOnce("scraping " + live->url + "/metrics failed: holding");
        return true;
    }
    m_nextJudge = end->t + r->intervalS;  // a window that goes on is judged again an interval later
    judge(*r, *live, *end);
    return true;
}

void Controller::judge(Rollout r, const Deployment& live, const Snapshot& end) {
    const auto windows = variantWindows(m_model, m_window->samples, end.samples);
    if (windows.empty() && !end.samples.empty()) {
        bool anyBefore = false;
        for (const auto& s : m_window->samples)
            if (s.name == "lathe_requests_total") anyBefore = true;
        if (anyBefore) {
            note("the server's counters began again (a restart): a fresh window");
            m_window = end;
            return;
        }
    }
    const auto find = [&](int64_t v) {
        const auto it = windows.find(v);
        VariantWindow w;
        w.version = v;
        return it == windows.end() ? w : it->second;
    };
    const VariantWindow base = find(r.baseline), cand = find(r.candidate);
    auto verdict = judgeRolloutWindow(r, base, cand);
    verdict.numbers["window_s"] = end.t - m_window->t;
    const auto lock = deploy_detail::lockModel(m_registry, m_model);
    // Under the lock, what the workspace says now decides: an abort or pause meanwhile wins.
    const auto now = m_registry.activeRollout(m_model);
    if (!now || now->id != r.id || now->state != "running" || now->step != r.step) {
        m_window.reset();
        return;
    }
    r = *now;
    if (verdict.kind == "hold") {
        decide(m_registry, r, "hold", verdict.reason, "auto", verdict.numbers);
        noteOnce("hold at " + stepText(r) + ": " + verdict.reason);
        if (!verdict.extendWindow) m_window = end;
        return;
    }
    m_window = end;
    if (verdict.kind == "unhealthy") {
        ++r.badInRow;
        verdict.numbers["bad_in_row"] = r.badInRow;
        decide(
            m_registry, r, "unhealthy",
            verdict.reason + " (" + std::to_string(r.badInRow) + " of " + std::to_string(r.threshold) + ")",
            "auto", verdict.numbers);
        note("unhealthy at " + stepText(r) + " (" + std::to_string(r.badInRow) + "/" +
             std::to_string(r.threshold) + "): " + verdict.reason);
        if (r.badInRow >= r.threshold) return rollBack(r, live, verdict);
        m_registry.updateRollout(r);
        return;
    }
    r.badInRow = 0;
    decide(m_registry, r, "healthy", verdict.reason, "auto", verdict.numbers);
    note("healthy at " + stepText(r) + ": " + verdict.reason);
    if (static_cast<size_t>(r.step) + 1 >= r.stepsBp.size()) return promote(r, live, verdict);
    const int32_t next = r.stepsBp[static_cast<size_t>(r.step) + 1];
    try {
        postRollout(m_registry, live, json{{"weight_bp", next}}, 30);
    } catch (const std::exception& ex) {
        note(std::string("could not raise the weight: ") + ex.what() + "; the next window tries again");
        m_registry.updateRollout(r);
        return;
    }
    r.step += 1;
    r.weightBp = next;
    m_registry.updateRollout(r);
    decide(m_registry, r, "advance", "to " + stepText(r) + " after a healthy window", "auto");
    note("advanced to " + stepText(r));
    m_seenStep = r.step;
    m_window.reset();
}

void Controller::promote(Rollout& r, const Deployment& live, const RolloutVerdict& v) {
    try {
        postRollout(m_registry, live, json{{"end", "promote"}}, 120);
    } catch (const std::exception& ex) {
        note(std::string("could not promote: ") + ex.what() + "; the next window tries again");
        return;
    }
    // The server serves the candidate now; the workspace follows (a busy one gets a few tries).
    const std::string why = "rollout " + std::to_string(r.id) + " promoted v" + std::to_string(r.candidate) +
                            " after " + std::to_string(r.stepsBp.size()) + " healthy steps";
    for (int attempt = 0;; ++attempt) {
        try {
            Deployment d = live;
            d.id = 0;
            d.version = r.candidate;
            d.actor = "auto";
            d.action = "promote";
            d.reason = why;
            d.startedAt = d.endedAt = 0;
            d.endReason.clear();
            m_registry.recordDeployment(d);
            m_registry.setAlias(r.model, "production", r.candidate);
            endRecord(m_registry, r, "promoted", "promote", why + ": it is production and serves everything",
                      "auto", v.numbers);
            break;
        } catch (const std::exception& ex) {
            if (attempt >= 5) {
                note(std::string("recording the promotion failed: ") + ex.what());
                throw;
            }
            std::this_thread::sleep_for(std::chrono::seconds(1));
        }
    }
    note(why);
}

void Controller::rollBack(Rollout& r, const Deployment& live, const RolloutVerdict& v) {
    const std::string why = "v" + std::to_string(r.candidate) + " rolled back after " +
                            std::to_string(r.badInRow) + " unhealthy windows in a row: " + v.reason;
    std::string note;
    try {
        note = abortAtServer(m_registry, live);
    } catch (const std::exception& ex) {
        this->note(std::string("could not take the candidate out: ") + ex.what() +
                   "; the next window tries again");
        m_registry.updateRollout(r);
        return;
    }
    r.weightBp = 0;
    Deployment d = live;
    d.id = 0;
    d.actor = "auto";
    d.action = "rollback";
    d.reason = why;
    d.startedAt = d.endedAt = 0;
    d.endReason.clear();
    m_registry.recordDeployment(d);
    endRecord(m_registry, r, "rolled_back", "rollback", why + note, "auto", v.numbers);
    this->note(why + note);
}

}  // namespace

bool runRolloutController(Registry& registry, const std::string& model, const std::atomic<bool>& stop,
                          const std::function<void(const std::string&)>& log) {
    checkModelName(model);
    // A status probe (rolloutControllerRunning) holds the lock for an instant: try a few times.
    std::unique_ptr<FileLock> lock;
    for (int attempt = 0; attempt < 20; ++attempt) {
        lock = std::make_unique<FileLock>(controllerLockPath(registry, model), false);
        if (lock->held()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!lock->held()) return false;
    Controller c(registry, model, log);
    if (log) {
        if (const auto r = registry.activeRollout(model))
            log("controller of rollout " + std::to_string(r->id) + " (" + model + " v" +
                std::to_string(r->candidate) + " beside v" + std::to_string(r->baseline) + ") at " +
                stepText(*r) + ", " + r->state);
    }
    while (!stop.load()) {
        bool more = true;
        try {
            more = c.tick();
        } catch (const std::exception& ex) {
            if (log) log(std::string("error: ") + ex.what() + " (looking again)");
        }
        if (!more) break;
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.tickSeconds());
        while (!stop.load() && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (log) log("controller of " + model + " ends");
    return true;
}

}  // namespace lathe::core

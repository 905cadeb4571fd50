// The scraper: a long-lived thread per watched deployment that fetches /metrics on a fixed
// cadence, stores one IntervalStats row set per scrape and turns alert events into registry
// alerts. Stop wakes it at once; only an in-flight request (bounded by its timeout) can delay it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "lathe/core/deploy.h"
#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/http_client.h"
#include "lathe/core/monitor.h"
#include "lathe/core/scraper.h"

namespace lathe::core {

namespace {}  // namespace

struct Scraper::Impl {
    Registry& registry;
    std::string model;
    std::string url;
    AlertRules rules;
    double intervalS;
    ServerHostFor hostFor;

    std::thread thread;
    std::mutex mutex;
    std::condition_variable wake;
    std::atomic<bool> stopping{false};
    std::string lastError;  // reported once per outage, not once per second

    Impl(Registry& r, std::string m, std::string u, AlertRules ru, double i)
        : registry(r), model(std::move(m)), url(std::move(u)), rules(ru), intervalS(i) {}

    void run();
};

void Scraper::Impl::run() {
    AlertEvaluator evaluator(rules);
    std::map<std::string, int64_t> openAlerts;          // rule -> registry alert id
    std::deque<std::pair<AlertEvent, double>> pending;  // events (and their time) not yet recorded
    std::vector<PromSample> prev;
    double prevT = 0;
    int64_t lastVersion = 0;
    // Long enough that a server busy with load still answers; short enough that stop() stays
    // prompt when the server hangs.
    const double timeoutS = std::clamp(2 * intervalS, 1.0, 5.0);
    const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(intervalS));
    auto next = std::chrono::steady_clock::now();

    while (!stopping.load()) {
        const double t = nowSeconds();
        IntervalStats stats;
        try {
            const HttpResult r = httpRequest("GET", url + "/metrics", {}, timeoutS);
            if (r.status != 200)
                throw Error("GET " + url + "/metrics answered HTTP " + std::to_string(r.status));
            std::vector<PromSample> cur = parsePrometheusText(r.body);
            stats = intervalStats(model, prev, cur, t - prevT, t);
            prev = std::move(cur);
            prevT = t;
            lastVersion = stats.version;
            if (!lastError.empty()) std::fprintf(stderr, "lathe: scraping %s works again\n", url.c_str());
            lastError.clear();
        } catch (const std::exception& ex) {
            // Keep `prev`: if the server comes back without restarting, the next interval's rates
            // are still right (averaged over the gap); a restart is caught as a counter reset.
            stats = IntervalStats{t, lastVersion, {{"up", 0.0}}};
            if (lastError != ex.what()) {
                lastError = ex.what();
                std::fprintf(stderr, "lathe: scraping %s failed: %s\n", url.c_str(), ex.what());
            }
        }
        if (stopping.load()) break;  // do not record a scrape that stop() cut short
        // The rules see every scrape even when the workspace is busy; alert writes that fail are
        // kept in order and retried with the next scrape, so no fire or resolve is lost.
        for (auto& e : evaluator.add(stats)) pending.push_back({std::move(e), stats.t});
        // A workspace that stays unwritable must not grow this without bound (a flapping rule
        // adds two events a few seconds): the oldest go first, said once.
        constexpr size_t kMaxPending = 200;
        if (pending.size() > kMaxPending) {
            std::fprintf(stderr, "lathe: %zu alert events of %s could not be recorded and are dropped\n",
                         pending.size() - kMaxPending, model.c_str());
            pending.erase(pending.begin(), pending.end() - kMaxPending);
        }
        try {
            registry.appendServingMetrics(model, stats.version, stats.t, stats.values);
            for (const auto& [version, values] : stats.variants)
                registry.appendServingMetrics(model, version, stats.t, values);
        } catch (const std::exception& ex) {
            // A busy or full workspace must not end monitoring; the next scrape tries again.
            std::fprintf(stderr, "lathe: storing serving metrics of %s failed: %s\n", model.c_str(),
                         ex.what());
        }
        while (!pending.empty()) {
            const auto& [e, at] = pending.front();
            try {
                if (e.fired) {
                    openAlerts[e.rule] = registry.fireAlert(model, e.rule, e.message, e.value, at);
                    if (rules.action == "rollback" && (e.rule == "p99_latency" || e.rule == "error_rate")) {
                        const std::string did =
                            rollbackOnAlert(registry, model, e.message, rules.rollbackWithinS, hostFor);
                        if (!did.empty()) std::fprintf(stderr, "lathe: %s\n", did.c_str());
                    }
                } else if (const auto it = openAlerts.find(e.rule); it != openAlerts.end()) {
                    registry.resolveAlert(it->second, at);
                    openAlerts.erase(it);
                }
            } catch (const std::exception& ex) {
                std::fprintf(
                    stderr, "lathe: recording the %s alert of %s failed (retried with the next scrape): %s\n",
                    e.rule.c_str(), model.c_str(), ex.what());
                break;
            }
            pending.pop_front();
        }

        // Fixed cadence, but never a burst of catch-up scrapes after a slow one.
        next = std::max(next + period, std::chrono::steady_clock::now());
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait_until(lock, next, [&] { return stopping.load(); });
    }
    // Nobody evaluates these rules once watching ends (the server was undeployed or stopped):
    // an alert left open would stay "firing" in the workspace forever.
    for (const auto& [rule, id] : openAlerts) {
        try {
            registry.resolveAlert(id, nowSeconds());
        } catch (const std::exception&) {
        }
    }
}

Scraper::Scraper(Registry& registry, std::string model, std::string url, AlertRules rules, double intervalS) {
    while (!url.empty() && url.back() == '/') url.pop_back();
    if (!(intervalS > 0)) throw ConfigError("scrape interval must be > 0 seconds");
    d = std::make_unique<Impl>(registry, std::move(model), std::move(url), rules, intervalS);
}

Scraper::~Scraper() { stop(); }

void Scraper::setServerHosts(ServerHostFor hostFor) { d->hostFor = std::move(hostFor); }

void Scraper::start() {
    if (d->thread.joinable()) return;
    d->stopping = false;
    d->thread = std::thread([this] { d->run(); });
}

void Scraper::stop() {
    {
        // Set under the mutex so the thread cannot check the flag and then miss the notify.
        std::lock_guard<std::mutex> lock(d->mutex);
        d->stopping = true;
    }
    d->wake.notify_all();
    if (d->thread.joinable()) d->thread.join();
}

}  // namespace lathe::core

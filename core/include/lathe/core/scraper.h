#pragma once
// The scraper behind a deployment's dashboard and alerts (serving/scraper.cpp).
#include <memory>
#include <string>

#include "lathe/core/deploy.h"
#include "lathe/core/monitor.h"
#include "lathe/core/registry.h"

namespace lathe::core {

/// Scrapes `url`/metrics every `intervalS` until `stop`, storing IntervalStats of `model` into the
/// registry and firing/resolving alerts there. A failed scrape stores up = 0 and carries on.
class Scraper {
public:
    Scraper(Registry& registry, std::string model, std::string url, AlertRules rules = {},
            double intervalS = 1.0);
    ~Scraper();  // stops and joins
    /// How an alert rule's automatic rollback reaches a server on another host (before start()).
    void setServerHosts(ServerHostFor hostFor);
    void start();
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> d;
};

}  // namespace lathe::core

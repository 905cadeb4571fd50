#pragma once
// A workspace whose registry looks like a model that has been served for a while: `digits` with
// three versions (v2 `production`), deployed as v2, replaced by v3, automatically rolled back to
// v2; a minute of scraped serving metrics across those changes; a P99 alert that fired under v3
// and resolved after the rollback. `spirals` has one version registered from a file and was
// never deployed.
#include <QDateTime>
#include <QTemporaryDir>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lathe/core/registry.h"
#include "lathe/core/store.h"

namespace lathe::test {

struct RegistryFixture {
    static constexpr int kSeconds = 60;  // one point per key per second
    static constexpr const char* kUrl = "http://127.0.0.1:8500";

    QTemporaryDir dir;
    std::string path;
    std::unique_ptr<core::Store> store;
    std::shared_ptr<core::Registry> registry;
    int64_t runId = 0;
    double t0 = 0;  // first deployment; metrics run from t0 + 20 to t0 + 79
    int64_t alertId = 0;

    // Per-second values; v3 is slow from its 10th second on, which is what fired the alert.
    static double p50(int64_t version, int i) {
        return version == 3 ? 9.0 + 0.1 * (i % 5) : 4.0 + 0.1 * (i % 5);
    }
    static double p90(int64_t version, int i) { return p50(version, i) * 1.8; }
    static double p99(int64_t version, int i) {
        return version == 3 && i >= 20 ? 150.0 : p50(version, i) * 3.0;
    }
    // Batches per second by bucket bound: sizes 1, 2, 3-4, 5-8 and above 8.
    static std::map<std::string, double> batchHist() {
        return {{"1", 2}, {"2", 3}, {"4", 5}, {"8", 4}, {"+Inf", 0}};
    }

    static double now() { return double(QDateTime::currentMSecsSinceEpoch()) / 1000.0; }

    core::ModelVersion version(const std::string& model, int64_t parent, double accuracy,
                               bool fromRun) const {
        core::ModelVersion v;
        v.name = model;
        v.path = dir.path().toStdString() + "/models/" + model + "/v.pt";
        v.sha256 = std::string(64, 'a');
        v.sha256.replace(0, 12, "3f9c0d2e71b4");
        v.sizeBytes = 207360;
        v.metrics = {{"val/accuracy", accuracy}, {"val/loss", 1.0 - accuracy}};
        if (fromRun) {
            v.runId = runId;
            v.data = "digits";
            v.source = "run " + std::to_string(runId);
        } else {
            v.source = "file /tmp/" + model + ".pt";
        }
        v.parentVersion = parent;
        return v;
    }

    RegistryFixture() {
        path = dir.path().toStdString() + "/workspace.db";
        store = std::make_unique<core::Store>(path);
        runId = store->createRun("default", "digits-mlp", "mlp", "digits", "", {}, "localhost");
        store->flush();
        registry = std::make_shared<core::Registry>(path);

        registry->addVersion(version("digits", 0, 0.912, true));
        registry->addVersion(version("digits", 1, 0.951, true));
        registry->addVersion(version("digits", 2, 0.963, true));
        registry->setAlias("digits", "production", 2);
        registry->addVersion(version("spirals", 0, 0.88, false));

        t0 = now() - 90;
        auto deployment = [&](int64_t v, const char* action, const char* actor, const char* reason,
                              double at) {
            core::Deployment d;
            d.model = "digits";
            d.version = v;
            d.url = kUrl;
            d.action = action;
            d.actor = actor;
            d.reason = reason;
            d.startedAt = at;
            return registry->recordDeployment(d);
        };
        deployment(2, "deploy", "user", "", t0);
        deployment(3, "deploy", "user", "new weights", t0 + 30);
        deployment(2, "rollback", "auto-rollback", "p99_latency above 100 ms for 3 samples", t0 + 60);

        for (int i = 0; i < kSeconds; ++i) {
            const double t = t0 + 20 + i;
            const int64_t v = t < t0 + 30 || t >= t0 + 60 ? 2 : 3;
            const int k = int(t - t0 - 30);  // seconds since v3 went live
            std::map<std::string, double> values = {
                {"up", 1},
                {"qps", 40.0 + (i % 3)},
                {"error_rate", v == 3 ? 0.02 : 0.001},
                {"p50_ms", p50(v, k)},
                {"p90_ms", p90(v, k)},
                {"p99_ms", p99(v, k)},
                {"queue_ms_p99", 2.0},
                {"compute_ms_p99", 6.0},
                {"batch_mean", 3.5},
                {"queue_depth", double(i % 4)},
                {"cpu_percent", 35},
                {"rss_mb", 210},
                {"gpu_util", 40},
                {"gpu_mem_mb", 900},
            };
            for (const auto& [le, n] : batchHist()) values["batch_hist/" + le] = n;
            registry->appendServingMetrics("digits", v, t, values);
        }
        alertId = registry->fireAlert("digits", "p99_latency", "P99 150 ms above 100 ms for 3 samples", 150,
                                      t0 + 52);
        registry->resolveAlert(alertId, t0 + 63);
    }

    /// Appends `n` more seconds of v2 metrics after the first minute.
    void appendSeconds(int from, int n) {
        for (int i = from; i < from + n; ++i) {
            std::map<std::string, double> values = {
                {"up", 1},       {"qps", 41},      {"error_rate", 0.001}, {"p50_ms", 4.2},
                {"p90_ms", 7.5}, {"p99_ms", 12.5}, {"batch_mean", 3.5},   {"queue_depth", 1}};
            registry->appendServingMetrics("digits", 2, t0 + 20 + i, values);
        }
    }
};

}  // namespace lathe::test

#include <catch2/catch.hpp>

#include <QFileInfo>
#include <QPushButton>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTemporaryDir>

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "deploy_session.h"
#include "lathe/core/deploy.h"
#include "lathe/core/http_client.h"
#include "lathe/core/model_artifact.h"
#include "lathe/core/monitor.h"
#include "lathe/core/record.h"
#include "lathe/core/registry.h"
#include "lathe/core/scraper.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "lathe/widgets/model_list_model.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/serving_chart.h"
#include "lathe/widgets/serving_dashboard.h"
#include "lathe/widgets/serving_tables.h"
#include "main_window.h"
#include "skip.h"
#include "sshd_fixture.h"
#include "test_helpers.h"

using lathe::app::DeployOutcome;
using lathe::app::DeploySession;
using lathe::app::MainWindow;
using lathe::remote::test::SshdServer;
using lathe::test::outputPath;
using lathe::test::waitUntil;
using Series = lathe::widgets::ServingChart::Series;

namespace {

constexpr int kDeployTimeoutMs = 120000;

// Servers outlive the program that deployed them: stop this test's one whatever happens.
struct Undeploy {
    std::string path;
    ~Undeploy() {
        try {
            lathe::core::Registry registry(path);
            if (registry.liveDeployment("digits")) lathe::core::undeploy(registry, "digits");
        } catch (...) {
        }
    }
};

DeployOutcome clickAndWait(MainWindow& window, QPushButton* button) {
    QSignalSpy finished(window.deploySession(), &DeploySession::finished);
    QTest::mouseClick(button, Qt::LeftButton);
    REQUIRE(window.deploySession()->isBusy());
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, kDeployTimeoutMs));
    const auto outcome = finished.at(0).at(0).value<DeployOutcome>();
    INFO("error: " << outcome.error.toStdString());
    REQUIRE(outcome.ok());
    return outcome;
}

}  // namespace

TEST_CASE("End to end: deploy, hot-swap and roll back a trained model from the Models page",
          "[widgets][e2e][models][deploy]") {
    const QString lathectl = QStringLiteral(LATHE_BIN_DIR "/lathectl");
    if (!QFileInfo(lathectl).isExecutable())
        LATHE_SKIP(lathectl.toStdString() + " is not built (ninja lathectl)");
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const std::string path = (dir.path() + "/workspace.db").toStdString();
    lathe::core::ModelVersion v1;
    {
        // A real model: one epoch of the digits MLP, registered twice (v2's parent is v1).
        lathe::core::Store store(path);
        lathe::core::RunSpec spec;
        spec.epochs = 1;
        const auto rec = lathe::core::trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
        store.flush();
        lathe::core::Registry registry(path);
        v1 = lathe::core::registerModel(registry, &store, "digits", rec.runId, "", {});
        lathe::core::registerModel(registry, &store, "digits", rec.runId, "", {}, v1.version);
    }
    Undeploy cleanup{path};

    auto window = std::make_unique<MainWindow>(std::make_unique<lathe::core::Store>(path));
    window->resize(1400, 900);
    window->show();
    window->pageTabs()->setCurrentIndex(1);
    window->deploySession()->setServerProgram(lathectl.toStdString());
    auto* models = window->modelsView();
    QStringList asked;
    models->setConfirmHook([&](const QString&, const QString& question) {
        asked << question;
        return true;
    });
    REQUIRE(waitUntil([&] { return models->listModel()->modelCount() == 1; }, 5000));

    // 1. Deploy v1: a new server.
    models->selectModel("digits", 1);
    const auto first = clickAndWait(*window, models->deployButton());
    CHECK(asked.back().startsWith("Deploy digits v1 to a new local server at http://127.0.0.1:"));
    CHECK(first.version == 1);
    CHECK(first.started);
    const auto live1 = window->registry()->liveDeployment("digits");
    REQUIRE(live1);
    CHECK(live1->version == 1);
    CHECK(first.url == QString::fromStdString(live1->url));
    CHECK(lathe::core::deploymentUp(*live1, 5.0));
    CHECK(models->statusText().contains("digits v1 live at " + first.url));

    // Some traffic, so the server's own scraper (--watch) records latency.
    const auto& input = v1.signature.inputs.at(0);
    std::string shape, data;
    int64_t count = 1;
    for (size_t i = 0; i < input.shape.size(); ++i) {
        const int64_t d = input.shape[i] < 0 ? 1 : input.shape[i];  // one row
        shape += (i ? "," : "") + std::to_string(d);
        count *= d;
    }
    for (int64_t i = 0; i < count; ++i) data += i ? ",0.5" : "0.5";
    const std::string body = R"({"inputs":[{"name":")" + input.name + R"(","datatype":")" + input.datatype +
                             R"(","shape":[)" + shape + "],\"data\":[" + data + "]}]}";
    for (int i = 0; i < 20; ++i) {
        const auto r = lathe::core::httpRequest("POST", live1->url + "/v2/models/digits/infer", body, 5.0);
        INFO("answer: " << r.body);
        REQUIRE(r.status == 200);
    }

    // 2. Deploy v2 over it: the same server swaps versions. The page's list shows v1 live first
    // (it refreshes from the workspace; on a loaded machine that can take a moment).
    REQUIRE(waitUntil([&] { return models->deployButton()->isEnabled(); }, 5000));
    REQUIRE(waitUntil(
        [&] {
            const auto* e = models->listModel()->entry(QStringLiteral("digits"));
            return e && e->live() && e->live()->version == 1;
        },
        15000));
    models->selectModel("digits", 2);
    const auto second = clickAndWait(*window, models->deployButton());
    CHECK(asked.back() == QStringLiteral("Deploy digits v2 to %1, replacing v1?").arg(first.url));
    CHECK(second.version == 2);
    CHECK(second.previousVersion == 1);
    CHECK_FALSE(second.started);
    CHECK(window->registry()->liveDeployment("digits")->version == 2);

    // 3. Roll back: the question names both versions; v1 serves again.
    REQUIRE(waitUntil([&] { return models->rollbackButton()->isEnabled(); }, 10000));
    REQUIRE(waitUntil(
        [&] {
            const auto* e = models->listModel()->entry(QStringLiteral("digits"));
            return e && e->live() && e->live()->version == 2;
        },
        15000));
    const auto back = clickAndWait(*window, models->rollbackButton());
    CHECK(asked.back() == "Roll back digits from v2 to v1?");
    CHECK(back.action == "rollback");
    CHECK(back.version == 1);
    const auto live = window->registry()->liveDeployment("digits");
    REQUIRE(live);
    CHECK(live->version == 1);
    CHECK(live->action == "rollback");

    // The dashboard shows the three actions and what the server's scraper records of live
    // traffic: latency, QPS and batch sizes.
    auto* dash = models->dashboard();
    auto* chart = dash->chart();
    auto batches = [&] {
        double n = 0;
        for (const auto& [label, count] : dash->batchHistogram()) n += count;
        return n;
    };
    REQUIRE(waitUntil(
        [&] {
            for (int i = 0; i < 5; ++i)
                lathe::core::httpRequest("POST", live->url + "/v2/models/digits/infer", body, 5.0);
            dash->pollNow();
            QTest::qWait(100);
            return chart->markerCount() == 3 && chart->pointCount(Series::Qps) >= 3 &&
                   chart->pointCount(Series::P99) >= 2 && batches() > 0;
        },
        30000));
    CHECK(chart->markerLabels() == QStringList{"v1 deploy", "v2 deploy", "v1 rollback"});
    CHECK(dash->deploymentModel()->rowCount() == 3);
    CHECK(dash->lastValue("up") == 1);
    chart->flushStaged();
    chart->plot()->replot(QCustomPlot::rpImmediateRefresh);
    dash->batchPlot()->replot(QCustomPlot::rpImmediateRefresh);
    window->grab().save(outputPath("gui_models_deployed.png"));
}

TEST_CASE(
    "End to end: the Models page deploys to a host of the workspace over SSH, hot-swaps and undeploys there",
    "[widgets][e2e][models][deploy][remote]") {
    const QString lathectl = QStringLiteral(LATHE_BIN_DIR "/lathectl");
    if (!QFileInfo(lathectl).isExecutable())
        LATHE_SKIP(lathectl.toStdString() + " is not built (ninja lathectl)");
    if (const std::string why = SshdServer::unavailableReason(); !why.empty()) LATHE_SKIP(why);
    SshdServer sshd{"127.0.0.2"};
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    // The workbench reads ~/.ssh from $HOME: a private one, with the host's key known.
    const std::string home = (dir.path() + "/home").toStdString();
    std::filesystem::create_directories(home + "/.ssh");
    lathe::remote::test::writeFile(home + "/.ssh/known_hosts", "[127.0.0.2]:" + std::to_string(sshd.port()) +
                                                                   " " + sshd.hostPublicKey() + "\n");
    const std::string oldHome = std::getenv("HOME") ? std::getenv("HOME") : "";
    ::setenv("HOME", home.c_str(), 1);
    struct RestoreHome {
        std::string home;
        ~RestoreHome() { ::setenv("HOME", home.c_str(), 1); }
    } restoreHome{oldHome};

    const std::string path = (dir.path() + "/workspace.db").toStdString();
    lathe::core::ModelVersion v1, v2;
    {
        lathe::core::Store store(path);
        lathe::core::RunSpec spec;
        spec.epochs = 1;
        const auto rec = lathe::core::trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
        store.flush();
        lathe::core::Registry registry(path);
        v1 = lathe::core::registerModel(registry, &store, "digits", rec.runId, "", {});
        v2 = lathe::core::registerModel(registry, &store, "digits", rec.runId, "", {}, v1.version);
        lathe::core::HostRecord h;
        h.name = "gpu-a";
        h.address = "127.0.0.2";
        h.port = sshd.port();
        h.user = lathe::remote::test::currentUser();
        h.identity = sshd.clientKey();
        h.lathectl = lathectl.toStdString();
        store.addHost(h);
    }

    auto window = std::make_unique<MainWindow>(std::make_unique<lathe::core::Store>(path));
    // Undeploys through the window's own host lookup, whatever happens below.
    struct UndeployThere {
        MainWindow* window;
        ~UndeployThere() {
            try {
                if (window->registry()->liveDeployment("digits"))
                    lathe::core::undeploy(*window->registry(), "digits",
                                          window->deploySession()->serverHosts());
            } catch (...) {
            }
        }
    } cleanup{window.get()};
    window->resize(1400, 900);
    window->show();
    window->pageTabs()->setCurrentIndex(1);
    window->deploySession()->setServerProgram(lathectl.toStdString());
    auto* models = window->modelsView();
    QStringList asked;
    models->setConfirmHook([&](const QString&, const QString& question) {
        asked << question;
        return true;
    });
    REQUIRE(waitUntil([&] { return models->listModel()->modelCount() == 1; }, 5000));
    // The Hosts page's list reaches the box beside Deploy.
    REQUIRE(waitUntil([&] { return models->targetBox()->findData(QStringLiteral("gpu-a")) > 0; }, 10000));
    models->selectModel("digits", 1);
    models->targetBox()->setCurrentIndex(models->targetBox()->findData(QStringLiteral("gpu-a")));

    const auto first = clickAndWait(*window, models->deployButton());
    CHECK(asked.back() ==
          "Deploy digits v1 to host gpu-a? The model is copied there and a new server started on it.");
    CHECK(first.started);
    CHECK(first.target == "ssh:gpu-a");
    CHECK(first.url.startsWith("http://127.0.0.2:"));
    CHECK(models->statusText().contains(" on gpu-a"));
    const auto live1 = window->registry()->liveDeployment("digits");
    REQUIRE(live1);
    CHECK(live1->target == "ssh:gpu-a");
    CHECK(lathe::core::deploymentUp(*live1, 5.0));

    // v2 over it: hot-swapped on the host, through the inventory; the box shows where it runs.
    REQUIRE(waitUntil(
        [&] {
            const auto* e = models->listModel()->entry(QStringLiteral("digits"));
            return e && e->live() && e->live()->version == 1;
        },
        15000));
    models->selectModel("digits", 2);
    CHECK_FALSE(models->targetBox()->isEnabled());
    CHECK(models->targetBox()->currentText() == "host gpu-a");
    const auto second = clickAndWait(*window, models->deployButton());
    CHECK_FALSE(second.started);
    CHECK(second.version == 2);
    CHECK(second.url == first.url);
    CHECK(window->registry()->liveDeployment("digits")->pid == live1->pid);
    window->grab().save(outputPath("gui_deploy_remote.png"));

    // Undeploy through the window's own way to its hosts (the inventory).
    lathe::core::undeploy(*window->registry(), "digits", window->deploySession()->serverHosts());
    CHECK_FALSE(window->registry()->liveDeployment("digits"));
    CHECK(waitUntil([&] { return ::kill(static_cast<pid_t>(live1->pid), 0) != 0; }, 10000));
    const char* realHome = oldHome.c_str();
    std::error_code ec;
    for (const auto* v : {&v1, &v2})
        std::filesystem::remove(std::string(realHome) + "/.cache/lathe/models/" + v->sha256 +
                                    std::filesystem::path(v->path).extension().string(),
                                ec);
    std::filesystem::remove(std::string(realHome) + "/.cache/lathe/deploy/" + live1->instance + ".log", ec);
}

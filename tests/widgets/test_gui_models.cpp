#include <catch2/catch.hpp>

#include <QFileInfo>
#include <QPushButton>
#include <QSignalSpy>
#include <QTabWidget>

#include <memory>

#include "deploy_session.h"
#include "lathe/core/store.h"
#include "lathe/widgets/data_sets_view.h"
#include "lathe/widgets/graph_view.h"
#include "lathe/widgets/model_list_model.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/serving_chart.h"
#include "lathe/widgets/serving_dashboard.h"
#include "lathe/widgets/studies_view.h"
#include "main_window.h"
#include "registry_fixture.h"
#include "test_helpers.h"

using lathe::app::DeployOutcome;
using lathe::app::DeploySession;
using lathe::app::MainWindow;
using lathe::test::outputPath;
using lathe::test::RegistryFixture;
using lathe::test::waitUntil;

namespace {

std::unique_ptr<MainWindow> openWindow(RegistryFixture& fx) {
    // The window opens its own store and registry on the fixture's file.
    fx.store.reset();
    auto window = std::make_unique<MainWindow>(std::make_unique<lathe::core::Store>(fx.path));
    window->resize(1400, 900);
    window->show();
    return window;
}

}  // namespace

TEST_CASE("The window's Models page shows the workspace registry and asks before deploying",
          "[widgets][models][window]") {
    RegistryFixture fx;
    auto window = openWindow(fx);

    QTabWidget* pages = window->pageTabs();
    REQUIRE(pages->count() == 6);
    CHECK(pages->tabText(0) == "Runs");
    CHECK(pages->tabText(1) == "Models");
    CHECK(pages->tabText(2) == "Hosts");
    CHECK(pages->tabText(3) == "Data sets");
    CHECK(pages->widget(3) == static_cast<QWidget*>(window->dataSetsView()));
    CHECK(pages->tabText(4) == "Studies");
    CHECK(pages->widget(4) == static_cast<QWidget*>(window->studiesView()));
    CHECK(pages->tabText(5) == "Graph");
    CHECK(pages->widget(5) == static_cast<QWidget*>(window->graphPage()));
    // The Data sets page reads the workspace when shown: this one has none.
    pages->setCurrentIndex(3);
    REQUIRE(waitUntil([&] { return window->dataSetsView()->refreshCount() >= 1; }, 10000));
    CHECK(window->dataSetsView()->isEmptyShown());
    CHECK(pages->widget(1) == window->modelsView());
    REQUIRE(window->registry());
    REQUIRE(window->deploySession());
    CHECK(window->deploySession()->serverProgram() ==
          (QCoreApplication::applicationDirPath() + "/lathectl").toStdString());
    pages->setCurrentIndex(1);

    auto* models = window->modelsView();
    REQUIRE(waitUntil([&] { return models->listModel()->modelCount() == 2; }, 5000));
    REQUIRE(waitUntil([&] { return models->dashboard()->pollCount() >= 1; }, 5000));
    CHECK(models->selectedModel() == "digits");
    CHECK(models->dashboard()->chart()->markerCount() == 3);
    CHECK(models->dashboard()->chart()->pointCount(lathe::widgets::ServingChart::Series::P99) ==
          RegistryFixture::kSeconds);

    QStringList asked;
    models->setConfirmHook([&](const QString&, const QString& question) {
        asked << question;
        return false;
    });
    QSignalSpy started(window->deploySession(), &DeploySession::started);
    models->selectModel("digits", 3);
    QTest::mouseClick(models->deployButton(), Qt::LeftButton);
    QTest::mouseClick(models->rollbackButton(), Qt::LeftButton);
    CHECK(asked ==
          QStringList{QStringLiteral("Deploy digits v3 to %1, replacing v2?").arg(RegistryFixture::kUrl),
                      "Roll back digits from v2 to v3?"});
    QTest::qWait(50);
    CHECK(started.count() == 0);
    CHECK_FALSE(window->deploySession()->isBusy());
    CHECK(fx.registry->deployments("digits").size() == 3);
    CHECK(fx.registry->liveDeployment("digits")->version == 2);
    CHECK(window->lastError().isEmpty());

    window->grab().save(outputPath("gui_models_page.png"));
}

TEST_CASE("A deployment that fails is shown, and the registry keeps what was live",
          "[widgets][models][window]") {
    RegistryFixture fx;
    auto window = openWindow(fx);
    window->pageTabs()->setCurrentIndex(1);
    auto* models = window->modelsView();
    REQUIRE(waitUntil([&] { return models->listModel()->modelCount() == 2; }, 5000));
    models->setConfirmHook([](const QString&, const QString&) { return true; });
    // The fixture's artifacts are not on disk, so no server can load them.
    window->deploySession()->setServerProgram(LATHE_BIN_DIR "/lathectl");
    window->deploySession()->setReadyTimeout(20);

    QSignalSpy started(window->deploySession(), &DeploySession::started);
    QSignalSpy finished(window->deploySession(), &DeploySession::finished);
    models->selectModel("spirals", 1);
    QTest::mouseClick(models->deployButton(), Qt::LeftButton);
    REQUIRE(started.count() == 1);
    CHECK(models->isBusy());
    CHECK_FALSE(models->deployButton()->isEnabled());
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, 60000));
    const auto outcome = finished.at(0).at(0).value<DeployOutcome>();
    INFO("error: " << outcome.error.toStdString());
    CHECK_FALSE(outcome.ok());
    CHECK(outcome.action == "deploy");
    CHECK(outcome.model == "spirals");
    CHECK_FALSE(models->isBusy());
    // Shown, never swallowed: the dialog/status bar text and the line beside the buttons.
    CHECK(window->lastError() == outcome.error);
    CHECK(models->statusText().contains("Deployment of spirals v1 failed"));
    CHECK(models->statusText().contains(outcome.error));
    CHECK_FALSE(fx.registry->liveDeployment("spirals"));
    CHECK(fx.registry->liveDeployment("digits")->version == 2);
    window->grab().save(outputPath("gui_models_deploy_failed.png"));
}

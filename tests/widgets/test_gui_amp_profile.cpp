#include <catch2/catch.hpp>

#include <QCheckBox>
#include <QPushButton>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTemporaryDir>
#include <QToolButton>

#include <memory>

#include "lathe/core/model_artifact.h"
#include "lathe/core/store.h"
#include "lathe/widgets/data_view.h"
#include "lathe/widgets/graph_view.h"
#include "lathe/widgets/loss_scale_view.h"
#include "lathe/widgets/model_list_model.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/profile_view.h"
#include "lathe/widgets/run_form.h"
#include "lathe/widgets/top_ops_model.h"
#include "main_window.h"
#include "test_helpers.h"
#include "training_session.h"

using lathe::app::MainWindow;
using lathe::app::TrainingSession;
using lathe::test::outputPath;
using lathe::test::waitUntil;

namespace {
constexpr int kRunTimeoutMs = 180000;

// Starts a run from the form and waits until it has finished; returns its id.
int64_t trainFromForm(MainWindow& window) {
    QSignalSpy started(window.session(), &TrainingSession::started);
    QSignalSpy finished(window.session(), &TrainingSession::finished);
    QTest::mouseClick(window.runForm()->startButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, kRunTimeoutMs));
    INFO("error: " << finished.at(0).at(2).toString().toStdString());
    REQUIRE(finished.at(0).at(1).toString() == "completed");
    REQUIRE(started.count() == 1);
    return started.at(0).at(0).toLongLong();
}
}  // namespace

TEST_CASE("End to end: a bf16 run with injected overflows and the profiler, seen in both tabs",
          "[widgets][e2e][amp][profile]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    auto window = std::make_unique<MainWindow>(
        std::make_unique<lathe::core::Store>((dir.path() + "/workspace.db").toStdString()));
    window->resize(1400, 900);
    window->show();
    auto* form = window->runForm();
    auto* tabs = window->viewTabs();
    REQUIRE(tabs->count() == 7);
    CHECK(tabs->tabText(0) == "Curves");
    CHECK(tabs->tabText(1) == "Loss scale");
    CHECK(tabs->tabText(2) == "Profile");
    CHECK(tabs->tabText(3) == "Communication");
    CHECK(tabs->tabText(4) == "Data");
    CHECK(tabs->tabText(5) == "Log");
    CHECK(tabs->tabText(6) == "Graph");
    CHECK(tabs->widget(4) == window->runView<lathe::widgets::DataView>());

    form->setFieldText("name", "amp-profile");
    form->setFieldText("epochs", "2");
    form->setFieldText("precision", "bf16");
    form->setFieldText("loss_scale", "dynamic");
    form->setFieldText("inject_nonfinite", "5,9");
    QTest::mouseClick(qobject_cast<QCheckBox*>(form->fieldWidget("profile")), Qt::LeftButton, {},
                      QPoint(8, form->fieldWidget("profile")->height() / 2));
    REQUIRE(form->fieldText("profile") == "true");
    REQUIRE(form->isValid());
    // Watch the loss scale live.
    auto* scale = window->runView<lathe::widgets::LossScaleView>();
    REQUIRE(scale != nullptr);
    tabs->setCurrentWidget(scale);
    const int64_t run = trainFromForm(*window);

    REQUIRE(waitUntil([&] { return scale->stagedCount() == 0 && scale->scalePointCount() > 0; }, 2000));
    CHECK(scale->runId() == run);
    CHECK(scale->flushCount() >= 1);  // points came through the live path
    const auto stored = window->store().metrics(run, "amp/loss_scale");
    CHECK(scale->scalePointCount() == int(stored.size()));
    CHECK(scale->skippedCount() == 2);
    // The injected steps back the scale off: the last scale is below the first.
    REQUIRE(stored.size() > 10);
    CHECK(stored.back().value < stored.front().value);
    QTest::qWait(80);
    REQUIRE(window->grab().save(outputPath("gui_loss_scale_tab.png")));

    auto* profile = window->runView<lathe::widgets::ProfileView>();
    REQUIRE(profile != nullptr);
    QSignalSpy loaded(profile, &lathe::widgets::ProfileView::loaded);
    tabs->setCurrentWidget(profile);
    REQUIRE(waitUntil([&] { return loaded.count() >= 1 && !profile->isLoading(); }, 20000));
    const int64_t spans = window->store().profileSpanCount(run);
    REQUIRE(spans > 0);
    CHECK(profile->runId() == run);
    CHECK_FALSE(profile->isPlaceholderShown());
    CHECK(profile->spanCount() == int(spans));
    CHECK(profile->opsModel()->rowCount() ==
          int(lathe::core::topOps(window->store().profileSpans(run)).size()));
    CHECK(profile->phaseChart() != nullptr);
    QTest::qWait(80);
    REQUIRE(window->grab().save(outputPath("gui_profile_tab.png")));

    // The Graph tab: the run's model, its ops coloured by the profile's measured times.
    auto* graphTab = window->runView<lathe::widgets::RunGraphView>();
    REQUIRE(graphTab != nullptr);
    auto* gv = graphTab->graphView();
    QSignalSpy graphReady(gv, &lathe::widgets::GraphView::layoutReady);
    tabs->setCurrentWidget(graphTab);
    REQUIRE(waitUntil([&] { return graphReady.count() >= 1; }, 60000));
    CHECK(graphTab->runShown() == run);
    REQUIRE(gv->graph() != nullptr);
    CHECK(gv->graph()->parameters > 0);
    REQUIRE(gv->nodeTimes().size() == gv->graph()->nodes.size());
    int linear = 0, timed = 0;
    std::string ops;
    for (const auto& n : gv->graph()->nodes) ops += n.op + " ";
    INFO("ops: " << ops);
    for (const auto& n : gv->graph()->nodes)
        if (n.op == "aten::addmm") {  // the exported MLP's layers, inside the trainer's aten::linear
            ++linear;
            timed += gv->nodeTimes()[static_cast<size_t>(n.id)] > 0;
        }
    CHECK(linear > 0);
    CHECK(timed == linear);  // every linear layer matched to its measured op
    auto* heat = gv->findChild<QToolButton*>(QStringLiteral("graphHeatMap"));
    REQUIRE(heat != nullptr);
    CHECK(heat->isEnabled());
    heat->click();
    CHECK(gv->heatMap());
    REQUIRE(gv->findNext(QStringLiteral("aten::addmm")));
    CHECK(gv->propertiesText().contains(QStringLiteral("time (profile)")));
    // A measured time in its unit: µs, or ms when the machine is busy enough for the op to take
    // a millisecond (the graph view switches at 1 ms).
    CHECK(gv->propertiesText().contains(QRegularExpression(QStringLiteral("[0-9]+\\.[0-9]+ (µs|ms)"))));
    QTest::qWait(80);
    REQUIRE(window->grab().save(outputPath("gui_graph_tab_heat.png")));

    // Registered, the same model opens on the Graph page from the Models page's Graph… button.
    lathe::core::registerModel(*window->registry(), &window->store(), "amp-profile", run, "", {});
    auto* models = window->modelsView();
    models->refresh();
    REQUIRE(waitUntil([&] { return models->listModel()->modelCount() == 1; }, 10000));
    models->selectModel("amp-profile", 1);
    auto* graphButton = models->findChild<QPushButton*>(QStringLiteral("graphButton"));
    REQUIRE(graphButton != nullptr);
    REQUIRE(graphButton->isEnabled());
    QSignalSpy pageReady(window->graphPage(), &lathe::widgets::GraphView::layoutReady);
    graphButton->click();
    REQUIRE(waitUntil([&] { return pageReady.count() >= 1; }, 60000));
    CHECK(window->pageTabs()->currentWidget() == window->graphPage());
    REQUIRE(window->graphPage()->graph() != nullptr);
    CHECK(window->graphPage()->graph()->name == "amp-profile:1");
    CHECK(window->graphPage()->graph()->nodes.size() == gv->graph()->nodes.size());
    QTest::qWait(80);
    REQUIRE(window->grab().save(outputPath("gui_graph_page.png")));
    window->pageTabs()->setCurrentIndex(0);
    tabs->setCurrentWidget(profile);

    // A run without the profiler: the Profile tab says so.
    form->setFieldText("name", "plain");
    form->setFieldText("precision", "fp32");
    form->setFieldText("loss_scale", "auto");
    form->setFieldText("inject_nonfinite", "");
    form->setFieldText("profile", "false");
    form->setFieldText("epochs", "1");
    REQUIRE(form->isValid());
    loaded.clear();
    const int64_t plain = trainFromForm(*window);
    REQUIRE(waitUntil([&] { return profile->runId() == plain && !profile->isLoading(); }, 20000));
    CHECK(profile->isPlaceholderShown());
    CHECK(profile->placeholderText().contains(QStringLiteral("run %1 was not profiled").arg(plain)));
    window->grab().save(outputPath("gui_profile_placeholder.png"));
}

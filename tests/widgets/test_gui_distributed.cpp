#include <catch2/catch.hpp>

#include <QFileInfo>
#include <QPushButton>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTemporaryDir>

#include <memory>

#include "lathe/core/store.h"
#include "lathe/widgets/comm_view.h"
#include "lathe/widgets/run_form.h"
#include "main_window.h"
#include "skip.h"
#include "test_helpers.h"
#include "training_session.h"

using lathe::app::MainWindow;
using lathe::app::TrainingSession;
using lathe::test::outputPath;
using lathe::test::waitUntil;
using Metric = lathe::widgets::CommView::Metric;

TEST_CASE("End to end: a 2-process run from the form fills the Communication tab",
          "[widgets][e2e][distributed]") {
    const QString lathectl = QStringLiteral(LATHE_BIN_DIR "/lathectl");
    if (!QFileInfo(lathectl).isExecutable())
        LATHE_SKIP(lathectl.toStdString() + " is not built (ninja lathectl)");
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    auto window = std::make_unique<MainWindow>(
        std::make_unique<lathe::core::Store>((dir.path() + "/workspace.db").toStdString()));
    window->resize(1400, 900);
    window->show();
    // The workers are the lathectl of this build, wherever the test binary runs from.
    window->session()->setWorkerProgram(lathectl.toStdString());

    auto* tabs = window->viewTabs();
    int commTab = -1;
    for (int i = 0; i < tabs->count(); ++i)
        if (tabs->tabText(i) == "Communication") commTab = i;
    REQUIRE(commTab >= 0);
    auto* comm = window->runView<lathe::widgets::CommView>();
    REQUIRE(comm != nullptr);
    CHECK(tabs->widget(commTab) == comm);
    tabs->setCurrentIndex(commTab);

    auto* form = window->runForm();
    form->setFieldText("name", "gui-dp");
    form->setFieldText("data", "synthetic:spirals");
    form->setFieldText("epochs", "2");
    form->setFieldText("nproc", "2");
    REQUIRE(form->isValid());

    QSignalSpy started(window->session(), &TrainingSession::started);
    QSignalSpy finished(window->session(), &TrainingSession::finished);
    QTest::mouseClick(form->startButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, 240000));
    REQUIRE(started.count() == 1);
    const int64_t run = started.at(0).at(0).toLongLong();
    INFO("error: " << finished.at(0).at(2).toString().toStdString());
    REQUIRE(finished.at(0).at(1).toString() == "completed");

    REQUIRE(waitUntil([&] { return comm->stagedCount() == 0 && comm->rankCount() == 2; }, 3000));
    CHECK(comm->runId() == run);
    const auto stored0 = window->store().metrics(run, "comm/ms");
    const auto stored1 = window->store().metrics(run, "rank1/comm/ms");
    REQUIRE_FALSE(stored0.empty());
    REQUIRE_FALSE(stored1.empty());
    // Live points arrived before the run was committed: the view holds every stored step.
    CHECK(comm->pointCount(0, Metric::Ms) == int(stored0.size()));
    CHECK(comm->pointCount(1, Metric::Ms) == int(stored1.size()));
    CHECK(comm->pointCount(0, Metric::BytesSent) > 0);
    CHECK(comm->pointCount(1, Metric::Overlap) > 0);
    CHECK(comm->placeholderText().isEmpty());

    // Reselecting loads the same from the store alone.
    window->selectRuns({});
    window->selectRuns({run});
    CHECK(comm->pointCount(0, Metric::Ms) == int(stored0.size()));
    CHECK(comm->pointCount(1, Metric::Ms) == int(stored1.size()));
    window->grab().save(outputPath("gui_communication_tab.png"));
}

#include <catch2/catch.hpp>

#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QTableView>
#include <QTemporaryDir>
#include <QTimer>

#include <memory>

#include "lathe/core/store.h"
#include "lathe/widgets/dashboard.h"
#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/run_form.h"
#include "lathe/widgets/run_list_model.h"
#include "lathe/widgets/run_overlay.h"
#include "main_window.h"
#include "test_helpers.h"
#include "training_session.h"

using lathe::app::MainWindow;
using lathe::app::TrainingSession;
using lathe::test::outputPath;
using lathe::test::waitUntil;

namespace {

std::unique_ptr<MainWindow> openWindow(const QString& db) {
    auto w = std::make_unique<MainWindow>(std::make_unique<lathe::core::Store>(db.toStdString()));
    w->resize(1400, 900);
    w->show();
    return w;
}

constexpr int kRunTimeoutMs = 180000;

// The runs list is read on a worker thread and lands in runModel() with runsRefreshed(): waits
// (at most 10 s a read) until every refresh asked of the window so far has landed.
bool waitForRuns(MainWindow& window) {
    QSignalSpy refreshed(&window, &MainWindow::runsRefreshed);
    while (window.isRefreshingRuns())
        if (!refreshed.wait(10000)) return false;
    return true;
}

}  // namespace

TEST_CASE("End to end: train from the window, watch live curves, stop, reopen", "[widgets][e2e]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const QString db = dir.path() + "/workspace.db";
    int64_t completedRun = 0, stoppedRun = 0;

    {
        auto window = openWindow(db);
        auto* form = window->runForm();
        auto* loss = window->dashboard()->lossChart();
        REQUIRE(waitForRuns(*window));
        CHECK(window->runModel()->rowCount() == 0);

        // ---- a short run that completes --------------------------------------------------
        form->setFieldText("name", "gui-e2e");
        form->setFieldText("data", "synthetic:spirals");
        form->setFieldText("epochs", "4");
        form->setFieldText("lr", "0.01");
        REQUIRE(form->isValid());

        QSignalSpy started(window->session(), &TrainingSession::started);
        QSignalSpy finished(window->session(), &TrainingSession::finished);
        QTest::mouseClick(form->startButton(), Qt::LeftButton);
        CHECK(form->stopButton()->isEnabled());
        CHECK_FALSE(form->startButton()->isEnabled());

        REQUIRE(waitUntil([&] { return finished.count() == 1; }, kRunTimeoutMs));
        REQUIRE(started.count() == 1);
        completedRun = started.at(0).at(0).toLongLong();
        REQUIRE(completedRun > 0);
        CHECK(finished.at(0).at(0).toLongLong() == completedRun);
        INFO("error: " << finished.at(0).at(2).toString().toStdString());
        CHECK(finished.at(0).at(1).toString() == "completed");
        CHECK(form->startButton()->isEnabled());
        // The run's row (and with it the selection of the run) and its final status.
        REQUIRE(waitForRuns(*window));

        // Live points arrive through the coalescing timer; then the chart matches the store.
        auto* accuracy = window->dashboard()->accuracyChart();
        REQUIRE(waitUntil(
            [&] {
                return loss->stagedCount() == 0 && accuracy->stagedCount() == 0 &&
                       loss->pointCount(completedRun, "train/loss") > 0;
            },
            2000));
        const auto stored = window->store().metrics(completedRun, "train/loss");
        CHECK(loss->pointCount(completedRun, "train/loss") == int(stored.size()));
        CHECK(loss->pointCount(completedRun, "val/loss") == 4);
        CHECK(accuracy->pointCount(completedRun, "val/accuracy") == 4);
        CHECK(window->selectedRuns() == std::vector<int64_t>{completedRun});
        REQUIRE(window->runModel()->rowCount() == 1);
        CHECK(window->runModel()->runById(completedRun)->status == lathe::core::RunStatus::Completed);
        CHECK_FALSE(window->runModel()
                        ->index(0, lathe::widgets::RunListModel::ColValAccuracy)
                        .data()
                        .toString()
                        .isEmpty());

        QTest::qWait(100);
        REQUIRE(window->grab().save(outputPath("gui_training.png")));

        // ---- a long run: points must appear while it trains; Stop ends it cleanly ---------
        form->setFieldText("name", "gui-stop");
        form->setFieldText("epochs", "5000");
        form->setFieldText("log_every", "1");
        REQUIRE(form->isValid());
        started.clear();
        finished.clear();
        QTest::mouseClick(form->startButton(), Qt::LeftButton);
        REQUIRE(waitUntil([&] { return started.count() == 1; }, kRunTimeoutMs));
        stoppedRun = started.at(0).at(0).toLongLong();
        CHECK(stoppedRun != completedRun);
        REQUIRE(waitUntil([&] { return loss->pointCount(stoppedRun, "train/loss") >= 20; }, kRunTimeoutMs));
        CHECK(window->session()->isRunning());  // curves update while training, not at the end
        CHECK(window->runModel()->runById(stoppedRun) != nullptr);
        // Coalescing: many points per flush, far fewer flushes than points.
        CHECK(loss->flushCount() < loss->pointCount(stoppedRun, "train/loss"));
        QTest::qWait(300);
        window->grab().save(outputPath("gui_training_live.png"));
        QTest::mouseClick(form->stopButton(), Qt::LeftButton);
        REQUIRE(waitUntil([&] { return finished.count() == 1; }, 60000));
        CHECK(finished.at(0).at(1).toString() == "stopped");
        REQUIRE(waitForRuns(*window));
        CHECK(window->runModel()->runById(stoppedRun)->status == lathe::core::RunStatus::Stopped);

        // ---- a spec the form would reject, sent anyway: the error is shown ---------------
        lathe::core::RunSpec bad;
        bad.lr = -1;
        finished.clear();
        Q_EMIT form->startRequested(bad);
        REQUIRE(waitUntil([&] { return finished.count() == 1; }, 10000));
        CHECK(finished.at(0).at(0).toLongLong() == 0);
        CHECK(finished.at(0).at(1).toString() == "failed");
        CHECK(window->lastError().contains("lr"));
        REQUIRE(waitForRuns(*window));
        CHECK(window->runModel()->rowCount() == 2);
    }

    // ---- reopening shows every earlier run and its curves --------------------------------
    {
        auto window = openWindow(db);
        REQUIRE(waitForRuns(*window));
        REQUIRE(window->runModel()->rowCount() == 2);
        CHECK(window->selectedRuns() == std::vector<int64_t>{stoppedRun});  // the newest
        window->selectRuns({completedRun, stoppedRun});
        auto* loss = window->dashboard()->lossChart();
        CHECK(loss->pointCount(completedRun, "train/loss") > 0);
        CHECK(loss->pointCount(stoppedRun, "train/loss") >= 20);
        CHECK(window->dashboard()->shownRuns().size() == 2);
        QTest::qWait(100);
        window->grab().save(outputPath("gui_reopened.png"));
    }
}

TEST_CASE("The runs list is read on a worker thread, and refreshes asked for meanwhile are one more read",
          "[widgets]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const QString db = dir.path() + "/workspace.db";
    auto window = openWindow(db);
    REQUIRE(waitForRuns(*window));  // the first read, asked for by the constructor
    CHECK(window->runModel()->rowCount() == 0);
    CHECK(window->selectedRuns().empty());

    const int64_t a = window->store().createRun("gui", "a", "mlp", "synthetic:spirals", "", {}, "local");
    REQUIRE(waitForRuns(*window));   // the reads the window started on its own
    window->refreshTimer()->stop();  // so that every read below is one this test asked for
    QSignalSpy refreshed(window.get(), &MainWindow::runsRefreshed);
    for (int i = 0; i < 5; ++i) window->refreshRuns();
    // Nothing is read on the GUI thread: the rows land only from the event loop.
    CHECK(window->isRefreshingRuns());
    CHECK(window->runModel()->rowCount() == 0);
    REQUIRE(waitForRuns(*window));
    CHECK(window->runModel()->runById(a) != nullptr);
    // The first call started a read; the four made while it was in flight got one more read,
    // not four.
    CHECK(refreshed.count() == 2);

    // A selection asked for with a refresh waits for the run's row.
    const int64_t b = window->store().createRun("gui", "b", "mlp", "synthetic:spirals", "", {}, "local");
    window->refreshRuns();
    window->selectRunsWhenRefreshed({b});
    CHECK(window->selectedRuns().empty());
    REQUIRE(waitForRuns(*window));
    CHECK(window->selectedRuns() == std::vector<int64_t>{b});
    CHECK(window->dashboard()->shownRuns() == std::vector<int64_t>{b});
    // With no refresh pending it selects at once.
    window->selectRunsWhenRefreshed({a});
    CHECK(window->selectedRuns() == std::vector<int64_t>{a});

    // On start the newest run is selected, unless a selection was asked for (lathe --select).
    window.reset();
    window = openWindow(db);
    REQUIRE(waitForRuns(*window));
    CHECK(window->selectedRuns() == std::vector<int64_t>{b});
    window.reset();
    window = openWindow(db);
    window->selectRunsWhenRefreshed({a});
    REQUIRE(waitForRuns(*window));
    CHECK(window->selectedRuns() == std::vector<int64_t>{a});
}

TEST_CASE("The runs list filters as one types, and Ctrl+A overlays every run shown", "[widgets][overlay]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const QString db = dir.path() + "/workspace.db";
    std::vector<int64_t> ids;
    {
        lathe::core::Store store(db.toStdString());
        for (int i = 0; i < 20; ++i) {
            const int64_t id =
                store.createRun(i < 15 ? "sweep" : "baseline", "r" + std::to_string(i), "mlp",
                                "synthetic:spirals", "", {{"lr", std::to_string(0.001 * (i + 1))}}, "local");
            ids.push_back(id);
            for (int s = 0; s < 50; ++s) store.appendMetric(id, "train/loss", s, 0, 1.0 / (1 + s + i));
            if (i < 10) {
                // Ended, then given a point: its pack is dropped, as for a run recorded before packs.
                store.setRunStatus(id, lathe::core::RunStatus::Completed);
                store.appendMetric(id, "train/loss", 50, 0, 0.01);
            }
        }
        store.flush();
    }
    auto unpackedRuns = [&] {
        std::vector<int64_t> unpacked;
        lathe::core::Store::readSeries(
            db.toStdString(), ids, {}, [](lathe::core::Store::Series&&) { return true; }, {}, &unpacked);
        return unpacked;
    };
    REQUIRE(unpackedRuns().size() == 20);
    auto window = openWindow(db);
    REQUIRE(waitForRuns(*window));
    auto* table = window->runTable();
    REQUIRE(table->model()->rowCount() == 20);

    // Typing filters after a pause, over every column (here the experiment), ignoring case.
    QTest::keyClicks(window->runFilter(), QStringLiteral("SWEEP"));
    CHECK(table->model()->rowCount() == 20);  // not per key: once typing pauses
    REQUIRE(waitUntil([&] { return table->model()->rowCount() == 15; }, 2000));

    // Select all that is shown: 15 runs, more than a dozen, so the Curves tab overlays them.
    table->setFocus();
    QTest::keyClick(table, Qt::Key_A, Qt::ControlModifier);
    CHECK(window->selectedRuns().size() == 15);
    auto* dash = window->dashboard();
    REQUIRE(waitUntil([&] { return !dash->overlayLoading() && dash->lossChart()->hasOverlay(); }, 10000));
    CHECK(dash->lossChart()->overlayData()->curves.size() == 15);
    CHECK(dash->lossChart()->graphCount() == 0);
    // The overlay read the ended runs' rows: the window has them packed for the next overlay,
    // and leaves the runs that never ended (5 of them overlaid) as they are.
    REQUIRE(waitUntil([&] { return unpackedRuns().size() == 10; }, 10000));
    CHECK(unpackedRuns() == std::vector<int64_t>(ids.begin() + 10, ids.end()));

    window->runFilter()->clear();
    REQUIRE(waitUntil([&] { return table->model()->rowCount() == 20; }, 2000));
}

TEST_CASE("Closing the window while training stops and joins", "[widgets][e2e]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    const QString db = dir.path() + "/workspace.db";
    auto window = openWindow(db);
    auto* form = window->runForm();
    form->setFieldText("data", "synthetic:spirals");
    form->setFieldText("epochs", "5000");
    QSignalSpy started(window->session(), &TrainingSession::started);
    QTest::mouseClick(form->startButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return started.count() == 1; }, kRunTimeoutMs));
    const int64_t id = started.at(0).at(0).toLongLong();
    QElapsedTimer t;
    t.start();
    window->close();
    CHECK(window->session()->stopRequested());
    window.reset();  // joins the training thread
    CHECK(t.elapsed() < 30000);
    lathe::core::Store store(db.toStdString());
    const auto run = store.run(id);
    REQUIRE(run);
    CHECK(run->status == lathe::core::RunStatus::Stopped);
}

// The Log tab: a run's log from the store merged with its live lines, and for a run across
// hosts the ranks table built from the launcher's own lines (no sshd: the lines are written as
// the remote launcher writes them).
#include <catch2/catch.hpp>

#include <QPlainTextEdit>
#include <QTableWidget>
#include <QTemporaryDir>

#include <memory>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "lathe/widgets/log_view.h"
#include "test_helpers.h"

using lathe::core::Event;
using lathe::core::RunStatus;
using lathe::core::Store;
using lathe::test::outputPath;
using lathe::widgets::LogView;

TEST_CASE("LogView reads the launcher's placement, host and rank lines", "[widgets][log]") {
    CHECK(LogView::parsePlacement("starting 4 ranks on gpu-a:2,gpu-b:2") == "gpu-a:2,gpu-b:2");
    CHECK(LogView::parsePlacement("starting 2 worker processes").isEmpty());

    const auto h = LogView::parseHostLine(
        "host gpu-b (127.0.0.3): Linux x86_64, 2 cores, lathectl 0.1.0 at /usr/bin/lathectl; ranks 2..3");
    REQUIRE(h);
    CHECK(h->host == "gpu-b");
    CHECK(h->address == "127.0.0.3");
    CHECK(h->machine == "Linux x86_64, 2 cores, lathectl 0.1.0 at /usr/bin/lathectl");
    CHECK(h->firstRank == 2);
    CHECK(h->lastRank == 3);
    CHECK_FALSE(LogView::parseHostLine("host gpu-b: could not remove the run's files"));

    const auto x = LogView::parseRankExit(
        "rank 3 (on gpu-b) was killed by signal Killed: boom | bang; the other ranks were stopped");
    REQUIRE(x);
    CHECK(x->rank == 3);
    CHECK(x->host == "gpu-b");
    CHECK(x->description == "was killed by signal Killed");
    CHECK_FALSE(LogView::parseRankExit("rank 2: epoch 1 done"));
}

TEST_CASE("LogView shows a run across hosts with each rank's host and state", "[widgets][log]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    Store store((dir.path() + "/workspace.db").toStdString());
    const int64_t run = store.createRun("default", "remote", "mlp", "digits", "", {}, "localhost");
    double t = 1.7e9;
    store.appendLog(run, t += 1, "info", "starting 4 ranks on gpu-a:2,gpu-b:2");
    store.appendLog(
        run, t += 1, "info",
        "host gpu-a (127.0.0.2): Linux x86_64, 2 cores, lathectl 0.1.0 at /usr/bin/lathectl; ranks 0..1");
    store.appendLog(
        run, t += 1, "info",
        "host gpu-b (127.0.0.3): Linux x86_64, 2 cores, lathectl 0.1.0 at /usr/bin/lathectl; ranks 2..3");
    store.appendLog(run, t += 1, "info", "epoch 1/3 done");
    store.flush();

    LogView view;
    view.resize(900, 500);
    view.show();
    // The run is live in this window (the store alone would call it interrupted: no process
    // holds its lock here).
    view.onEvents(run, {Event::status(RunStatus::Running)});
    view.showRuns(store, {run});
    CHECK(view.runId() == run);
    CHECK(view.lineCount() == 4);
    CHECK(view.placement() == "gpu-a:2,gpu-b:2");
    REQUIRE(view.rankCount() == 4);
    CHECK(view.rankHost(0) == "gpu-a");
    CHECK(view.rankHost(3) == "gpu-b");
    CHECK(view.rankState(2) == "running");
    CHECK(view.ranksTable()->isVisibleTo(&view));
    CHECK(view.ranksTable()->item(2, 1)->text() == "gpu-b");
    CHECK(view.ranksTable()->item(2, 2)->text() == "127.0.0.3");
    CHECK(view.logText().contains("host gpu-b (127.0.0.3)"));

    // Live lines: a rank fails; its host is named, the others were stopped with it.
    Event warn = Event::log("warn", "rank 1 (on gpu-a) exited with status 143; its last lines: terminated");
    warn.wallTime = t += 1;
    Event error = Event::error("rank 3 (on gpu-b) was killed by signal Killed; the other ranks were stopped");
    error.wallTime = t += 1;
    view.onEvents(run, {warn, error, Event::status(RunStatus::Failed)});
    CHECK(view.lineCount() == 6);
    CHECK(view.rankState(3) == "failed: was killed by signal Killed");
    CHECK(view.rankState(1) == "exited with status 143");
    CHECK(view.rankState(0) == "stopped");
    CHECK(view.logText().contains("rank 3 (on gpu-b)"));
    view.grab().save(outputPath("log_view_remote.png"));

    // The store has the same lines once recorded: selecting the run again shows each once.
    store.appendLog(run, warn.wallTime, "warn", warn.text);
    store.appendLog(run, error.wallTime, "error", error.text);
    store.setRunStatus(run, RunStatus::Failed, error.text);
    store.flush();
    view.clear();
    CHECK(view.lineCount() == 0);
    CHECK(view.rankCount() == 0);
    view.showRuns(store, {run});
    CHECK(view.lineCount() == 6);
    CHECK(view.rankState(3) == "failed: was killed by signal Killed");

    // A run on this machine has no ranks table.
    const int64_t local = store.createRun("default", "local", "mlp", "digits", "", {}, "localhost");
    store.appendLog(local, t += 1, "info", "starting 2 worker processes");
    store.flush();
    view.showRuns(store, {local});
    CHECK(view.rankCount() == 0);
    CHECK(view.placement().isEmpty());
    CHECK_FALSE(view.ranksTable()->isVisibleTo(&view));
    CHECK(view.lineCount() == 1);
}

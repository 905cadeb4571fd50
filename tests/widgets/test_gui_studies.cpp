// Starting studies from the workbench: the New Study dialog's checks (core::checkStudy, as
// lathectl tune makes them) and the arguments it hands on, then the window's whole path on a real
// workspace — New study… on the Studies page, a real `lathectl tune` process whose trials appear
// on the page, Stop (the trials stop, the study is resumable) and Resume until it completes.
#include <catch2/catch.hpp>

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>
#include <QTabWidget>
#include <QTableView>
#include <QTemporaryDir>
#include <QTreeWidget>

#include <memory>

#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "lathe/widgets/run_form.h"
#include "lathe/widgets/studies_view.h"
#include "lathe/widgets/study_dialog.h"
#include "main_window.h"
#include "study_processes.h"
#include "test_helpers.h"

using lathe::app::MainWindow;
using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::StudyDialog;
namespace core = lathe::core;

TEST_CASE("The New Study dialog checks a study as lathectl tune does and hands on its arguments",
          "[widgets][studies]") {
    core::RunSpec base;
    base.epochs = 9;
    StudyDialog d(base, {"taken"});
    // The start it offers: lr on a log scale and the batch size, TPE, maximising val/accuracy.
    CHECK(d.problem().isEmpty());
    CHECK(d.startButton()->isEnabled());
    CHECK(d.spaceEntries() == QStringList{"lr=loguniform(1e-4,1e-1)", "batch=choice(32,64,128)"});
    CHECK(d.objectiveBox()->currentText() == "val/accuracy");
    CHECK(d.directionBox()->currentData().toString() == "max");

    d.nameEdit()->setText("taken");
    CHECK_FALSE(d.startButton()->isEnabled());
    CHECK(d.problem().contains("taken"));
    d.nameEdit()->setText("bad name");
    CHECK_FALSE(d.startButton()->isEnabled());
    CHECK(d.problemLabel()->isVisibleTo(&d));
    d.nameEdit()->setText("s1");
    CHECK(d.startButton()->isEnabled());

    d.clearSpace();
    CHECK(d.problem().contains("search space is empty"));
    d.addSpaceRow("lr", "uniform", "-1, 0.1");  // lr must be > 0
    CHECK(d.problem().contains("lr"));
    CHECK_FALSE(d.startButton()->isEnabled());
    d.clearSpace();
    d.addSpaceRow("hidden", "choice", "[16], [64, 64]");
    d.addSpaceRow("momentum", "uniform", "0, 0.9");
    CHECK(d.problem().isEmpty());
    CHECK(d.spaceEntries() == QStringList{"hidden=choice([16],[64,64])", "momentum=uniform(0,0.9)"});

    // A loss is minimised.
    d.objectiveBox()->setCurrentText("val/loss");
    CHECK(d.directionBox()->currentData().toString() == "min");
    d.objectiveBox()->setCurrentText("val/accuracy");

    // ASHA: random search with early stopping; the budget key cannot be searched under it.
    d.algorithmBox()->setCurrentIndex(d.algorithmBox()->findData("asha"));
    CHECK(d.ashaBox()->isChecked());
    CHECK_FALSE(d.ashaBox()->isEnabled());
    CHECK(d.minBudgetBox()->value() == 1);  // 9 epochs / 9
    d.trialsBox()->setValue(12);
    d.parallelBox()->setValue(2);
    const auto study = d.study();
    CHECK(study.sampler == "random");
    CHECK(study.pruner == "asha");
    CHECK(d.tuneArguments() == QStringList{"--study",      "s1",
                                           "--space",      "hidden=choice([16],[64,64])",
                                           "--space",      "momentum=uniform(0,0.9)",
                                           "--objective",  "val/accuracy",
                                           "--direction",  "max",
                                           "--trials",     "12",
                                           "--parallel",   "2",
                                           "--algo",       "asha",
                                           "--study-seed", "0",
                                           "--pruner",     "asha",
                                           "--min-budget", "1",
                                           "--eta",        "3"});
    d.minBudgetBox()->setValue(9);  // not below the runs' 9 epochs
    CHECK(d.problem().contains("min-budget"));
    d.minBudgetBox()->setValue(3);
    d.addSpaceRow("epochs", "int", "3, 9");
    CHECK(d.problem().contains("budget"));
}

TEST_CASE("A study started from the Studies page runs its trials, stops and resumes to the end",
          "[widgets][studies][window]") {
    QTemporaryDir dir;
    const QString path = dir.filePath("ws.db");
    auto window = std::make_unique<MainWindow>(std::make_unique<core::Store>(path.toStdString()));
    window->resize(1400, 900);
    window->show();
    // Long enough to still be running when the page (which polls every 5 s) shows it: forked
    // trials of 3 epochs took about 0.15 s each, and 8 of them ended before Stop could be pressed.
    window->runForm()->setFieldText("epochs", "30");
    window->runForm()->setFieldText("threads", "1");
    auto* page = window->studiesView();
    window->pageTabs()->setCurrentWidget(page);
    REQUIRE(waitUntil([&] { return page->newStudyButton()->isEnabled() && page->isEmptyShown(); }, 10000));
    CHECK_FALSE(page->stopButton()->isEnabled());

    // A run form with an error: no dialog, the reason shown.
    window->runForm()->setFieldText("lr", "-1");
    CHECK(window->openStudyDialog() == nullptr);
    CHECK(window->lastError().contains("run form"));
    window->runForm()->setFieldText("lr", "0.05");

    page->newStudyButton()->click();
    auto* dialog = window->studyDialog();
    REQUIRE(dialog);
    dialog->nameEdit()->setText("gui-study");
    dialog->clearSpace();
    dialog->addSpaceRow("lr", "loguniform", "1e-3, 0.1");
    dialog->trialsBox()->setValue(40);
    dialog->parallelBox()->setValue(1);
    REQUIRE(dialog->problem().isEmpty());
    dialog->grab().save(outputPath("gui-study-dialog.png"));
    dialog->startButton()->click();
    REQUIRE(window->studyProcesses()->isRunning("gui-study"));
    CHECK(window->pageTabs()->currentWidget() == page);

    // Its trials land on the page as they finish; Stop is offered for a study run from here.
    core::Studies studies(path.toStdString());
    const auto finishedTrials = [&] {
        const auto s = studies.study("gui-study");
        return s ? s->complete + s->failed + s->pruned : 0;
    };
    REQUIRE(waitUntil([&] { return finishedTrials() >= 2; }, 120000));
    REQUIRE(waitUntil([&] { return page->selectedStudy() == "gui-study" && page->stopButton()->isEnabled(); },
                      10000));
    CHECK_FALSE(page->resumeButton()->isEnabled());
    page->grab().save(outputPath("gui-study-running.png"));
    const QString errorBefore = window->lastError();  // the run form's, above
    page->stopButton()->click();
    REQUIRE(waitUntil([&] { return !window->studyProcesses()->isRunning("gui-study"); }, 60000));
    const auto stopped = studies.study("gui-study");
    REQUIRE(stopped);
    CHECK(stopped->status == "stopped");
    CHECK(window->lastError() == errorBefore);  // a stop is not an error
    const auto doneBefore = finishedTrials();
    CHECK(doneBefore < 40);

    // Resume: finished trials are kept, the rest run, and the study completes.
    REQUIRE(waitUntil([&] { return page->resumeButton()->isEnabled(); }, 10000));
    page->resumeButton()->click();
    REQUIRE(window->studyProcesses()->isRunning("gui-study"));
    REQUIRE(waitUntil([&] { return !window->studyProcesses()->isRunning("gui-study"); }, 180000));
    // The list still says "running" until it is read again: Resume must not flash on meanwhile.
    CHECK_FALSE(page->resumeButton()->isEnabled());
    const auto done = studies.study("gui-study");
    REQUIRE(done);
    CHECK(done->status == "completed");
    const auto trials = studies.trials(done->id);
    CHECK(trials.size() == 40);
    for (const auto& t : trials) {
        INFO("trial " << t.number << ": " << t.error);
        CHECK(t.state == core::TrialState::Complete);
    }
    REQUIRE(waitUntil([&] { return page->trialsTable()->model()->rowCount() == 40; }, 20000));
    CHECK_FALSE(page->resumeButton()->isEnabled());
    CHECK_FALSE(page->stopButton()->isEnabled());
    page->grab().save(outputPath("gui-study-done.png"));
}

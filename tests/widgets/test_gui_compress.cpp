// The Compress dialog and the compression report on the window's Models page, on a real workspace:
// a trained and registered digits MLP quantized through the dialog (the real core::quantizeModel),
// cancel, and the report of the registered version shown from the page.
#include <catch2/catch.hpp>

#include <QComboBox>
#include <QDialog>
#include <QPointer>
#include <QProgressBar>
#include <QPushButton>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTableWidget>
#include <QTemporaryDir>

#include <memory>

#include "lathe/core/model_artifact.h"
#include "lathe/core/record.h"
#include "lathe/core/registry.h"
#include "lathe/core/store.h"
#include "lathe/widgets/compress_dialog.h"
#include "lathe/widgets/compress_report_view.h"
#include "lathe/widgets/model_list_model.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "main_window.h"
#include "test_helpers.h"

using lathe::app::MainWindow;
using lathe::test::outputPath;
using lathe::test::waitUntil;
namespace core = lathe::core;

TEST_CASE("Compress a registered version from the Models page, cancel one, and read the report",
          "[widgets][compress][window]") {
    QTemporaryDir dir;
    const std::string path = dir.filePath("ws.db").toStdString();
    {
        core::Store store(path);
        core::RunSpec spec;
        spec.epochs = 5;
        const auto rec = core::trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == core::RunStatus::Completed);
        store.flush();
        core::Registry registry(path);
        core::registerModel(registry, &store, "digits", rec.runId, "", {});
    }
    auto window = std::make_unique<MainWindow>(std::make_unique<core::Store>(path));
    window->resize(1400, 900);
    window->show();
    window->pageTabs()->setCurrentIndex(1);
    auto* models = window->modelsView();
    REQUIRE(waitUntil([&] { return models->listModel()->modelCount() == 1; }, 5000));
    models->selectModel("digits");
    CHECK_FALSE(models->compressButton()->isEnabled());  // a model row: no version chosen
    models->selectModel("digits", 1);
    REQUIRE(models->compressButton()->isEnabled());
    CHECK_FALSE(models->reportButton()->isEnabled());  // v1 was not compressed from anything
    QTest::mouseClick(models->compressButton(), Qt::LeftButton);
    auto* dialog = window->compressDialog();
    REQUIRE(dialog);
    CHECK(dialog->windowTitle() == "Compress digits v1");
    CHECK_FALSE(dialog->observerBox()->isEnabled());  // dynamic: nothing to calibrate

    // Cancelled at once: nothing registered.
    QSignalSpy finished(dialog, &lathe::widgets::CompressDialog::finishedRun);
    dialog->start();
    CHECK(dialog->isRunning());
    CHECK_FALSE(dialog->startButton()->isEnabled());
    QTest::mouseClick(dialog->cancelButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, 60000));
    CHECK(finished.at(0).at(0).toBool() == false);
    CHECK(dialog->statusText() == "Stopped: nothing was registered.");
    CHECK(window->registry()->versions("digits").size() == 1);

    // Static int8 with the min/max observer.
    dialog->methodBox()->setCurrentIndex(dialog->methodBox()->findData("static"));
    CHECK(dialog->observerBox()->isEnabled());
    dialog->observerBox()->setCurrentIndex(dialog->observerBox()->findData("minmax"));
    dialog->calibBatchesBox()->setValue(4);
    QSignalSpy compressed(dialog, &lathe::widgets::CompressDialog::compressed);
    QTest::mouseClick(dialog->startButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return finished.count() == 2; }, 120000));
    INFO(dialog->statusText().toStdString());
    REQUIRE(finished.at(1).at(0).toBool());
    REQUIRE(compressed.count() == 1);
    CHECK(compressed.at(0).at(1).toLongLong() == 2);
    CHECK(dialog->statusText() == "Registered digits v2.");
    CHECK(dialog->progressBar()->value() == 1000);
    auto* report = dialog->reportView();
    CHECK(report->isVisible());
    CHECK(report->headline().contains("digits v2"));
    CHECK(report->summaryPlot()->plottableCount() == 2);
    CHECK(report->classPlot()->plottableCount() == 2);
    CHECK(report->layerTable()->rowCount() >= 2);
    CHECK(report->layerTable()->item(0, 3)->text().contains("per tensor from minmax"));
    dialog->grab().save(outputPath("gui_compress_dialog.png"));
    const auto v2 = window->registry()->resolve({"digits", 2, {}});
    CHECK(v2.parentVersion == 1);
    CHECK(core::CompressReport::fromJson(v2.report).settings.at("observer") == "minmax");

    // The page lists v2; its report opens from the page.
    dialog->close();
    REQUIRE(waitUntil(
        [&] {
            return models->listModel()->entry("digits") &&
                   models->listModel()->entry("digits")->versions.size() == 2;
        },
        10000));
    models->selectModel("digits", 2);
    REQUIRE(models->reportButton()->isEnabled());
    QDialog* shown = models->showReport();
    REQUIRE(shown);
    auto* view = shown->findChild<lathe::widgets::CompressReportView*>();
    REQUIRE(view);
    CHECK(view->layerTable()->rowCount() >= 2);
    shown->grab().save(outputPath("gui_compress_report.png"));
    shown->close();

    // Closing the dialog while it runs stops the run first, then closes; nothing is registered.
    auto* again = window->openCompressDialog("digits", 1);
    REQUIRE(again);
    QPointer<lathe::widgets::CompressDialog> watch(again);
    again->start();
    again->close();             // as the window's close button: QDialog turns it into reject()
    CHECK(again->isVisible());  // still stopping
    REQUIRE(waitUntil([&] { return watch.isNull(); }, 60000));  // WA_DeleteOnClose after it stopped
    CHECK(window->registry()->versions("digits").size() == 2);
}

TEST_CASE("Prune a CNN through the Compress dialog: recorded rounds and the channels kept per layer",
          "[widgets][compress][window]") {
    QTemporaryDir dir;
    const std::string path = dir.filePath("ws.db").toStdString();
    {
        core::Store store(path);
        core::RunSpec spec;
        spec.model = "cnn";
        spec.epochs = 6;
        const auto rec = core::trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == core::RunStatus::Completed);
        store.flush();
        core::Registry registry(path);
        core::registerModel(registry, &store, "cnn", rec.runId, "", {});
    }
    auto window = std::make_unique<MainWindow>(std::make_unique<core::Store>(path));
    window->resize(1400, 900);
    window->show();
    auto* dialog = window->openCompressDialog("cnn", 1);
    REQUIRE(dialog);
    dialog->methodBox()->setCurrentIndex(dialog->methodBox()->findData("prune"));
    CHECK(dialog->sparsityBox()->isEnabled());
    CHECK(dialog->epochsBox()->isEnabled());
    CHECK_FALSE(dialog->studentEdit()->isEnabled());
    CHECK_FALSE(dialog->observerBox()->isEnabled());
    dialog->epochsBox()->setValue(1);
    const auto request = dialog->request();
    CHECK(request.method == "prune");
    CHECK(request.prune.targetSparsity == Approx(0.5));
    CHECK(request.prune.finetuneEpochs == 1);
    QSignalSpy finished(dialog, &lathe::widgets::CompressDialog::finishedRun);
    QTest::mouseClick(dialog->startButton(), Qt::LeftButton);
    REQUIRE(waitUntil([&] { return finished.count() == 1; }, 180000));
    INFO(dialog->statusText().toStdString());
    REQUIRE(finished.at(0).at(0).toBool());
    auto* report = dialog->reportView();
    CHECK(report->keptPlot()->isVisible());
    CHECK(report->keptPlot()->plottableCount() == 2);
    REQUIRE(report->layerTable()->rowCount() == 3);
    CHECK(report->layerTable()->item(0, 2)->text() == "16 → 8");
    CHECK(report->layerTable()->item(0, 3)->text().contains("kept 8 of 16 channels"));
    CHECK(report->headline().contains("prune"));
    CHECK(report->headline().contains("round 3 (run 4): 50.00% kept"));
    dialog->grab().save(outputPath("gui_compress_prune.png"));
    // The rounds are ordinary runs of the workspace.
    CHECK(window->store().listRuns().size() == 4);
    dialog->close();
}

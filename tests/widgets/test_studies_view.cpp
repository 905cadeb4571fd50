// The Studies page on a real workspace: a PPO study with ASHA of six trials — four complete, one
// pruned at its first rung, one failed — each an ordinary run with its curves and the agent's
// ppo/lr and ppo/batch choices. The list, the sortable trials table, the four charts, the runs
// of selected trials, and the window's wiring of them to the runs table; parameterImportance on
// synthetic studies.
#include <catch2/catch.hpp>

#include <QAbstractItemModel>
#include <QItemSelectionModel>
#include <QLabel>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTableView>
#include <QTreeWidget>

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "lathe/widgets/chart_panel.h"
#include "lathe/widgets/data_sets_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/studies_view.h"
#include "main_window.h"
#include "temp_dir.h"
#include "test_helpers.h"

using lathe::app::MainWindow;
using lathe::core::parameterImportance;
using lathe::core::RungRecord;
using lathe::core::Store;
using lathe::core::Studies;
using lathe::core::StudyRecord;
using lathe::core::TrialRecord;
using lathe::core::TrialState;
using lathe::test::outputPath;
using lathe::test::TempDir;
using lathe::test::waitUntil;
using lathe::widgets::ChartPanel;
using lathe::widgets::StudiesView;

namespace {

struct TrialPlan {
    const char* lr;
    const char* batch;
    const char* dropout;
    TrialState state;
    std::optional<double> value;
};

// Trial 1 is the best (0.91); trial 4 was pruned at epoch 1 with 0.41; trial 5 failed.
const TrialPlan kPlan[] = {
    {"0.001", "32", "0.1", TrialState::Complete, 0.82},
    {"0.01", "64", "0.2", TrialState::Complete, 0.91},
    {"0.0003", "128", "0.3", TrialState::Complete, 0.74},
    {"0.05", "32", "0.05", TrialState::Complete, 0.88},
    {"0.0001", "64", "0.4", TrialState::Pruned, 0.41},
    {"0.08", "128", "0.25", TrialState::Failed, std::nullopt},
};
constexpr int kTrials = int(sizeof(kPlan) / sizeof(kPlan[0]));

struct StudyFixture {
    TempDir dir;
    std::string db = dir.file("workspace.db");
    std::vector<int64_t> runs;  // by trial number

    StudyFixture() {
        Store store(db);
        Studies studies(db);
        StudyRecord s;
        s.name = "lr-search";
        s.sampler = "ppo";
        s.pruner = "asha";
        s.objective = "val/accuracy";
        s.direction = "max";
        s.space = {"lr=loguniform(0.0001, 0.1)", "batch=choice(32,64,128)", "dropout=uniform(0, 0.5)"};
        s.settings =
            R"({"trials": 8, "parallel": 1, "budget_key": "epochs", "min_budget": 1, "max_budget": 9, "eta": 3})";
        const int64_t studyId = studies.create(s);
        const double t0 = 1.8e9;
        for (int n = 0; n < kTrials; ++n) {
            const TrialPlan& p = kPlan[n];
            const std::map<std::string, std::string> params{
                {"lr", p.lr}, {"batch", p.batch}, {"dropout", p.dropout}};
            const int64_t run = store.createRun("lr-search", "lr-search-" + std::to_string(n), "mlp",
                                                "synthetic", "", params, "localhost");
            runs.push_back(run);
            // The failed trial stopped after its first steps.
            const int steps = p.state == TrialState::Failed ? 1 : p.state == TrialState::Pruned ? 2 : 3;
            for (int i = 0; i < steps; ++i) {
                const int64_t step = 10 * i;
                const double wall = t0 + 100 * n + i;
                store.appendMetric(run, "train/loss", step, wall, 1.0 / (1 + i + n));
                if (p.value) store.appendMetric(run, "val/accuracy", step, wall, *p.value * (i + 1) / steps);
                store.appendMetric(run, "ppo/lr", step, wall, std::stod(p.lr) * std::pow(0.5, i));
                store.appendMetric(run, "ppo/batch", step, wall, std::stod(p.batch) * (i + 1));
            }
            const int64_t trial = studies.addTrial(studyId, n, params, "localhost");
            studies.attachRun(trial, run, 0);
            switch (p.state) {
                case TrialState::Complete:
                    studies.addRung(trial, RungRecord{0, 1, *p.value - 0.1, true});
                    studies.finishTrial(trial, TrialState::Complete, p.value, "");
                    break;
                case TrialState::Pruned:
                    studies.addRung(trial, RungRecord{0, 1, *p.value, false});
                    studies.finishTrial(trial, TrialState::Pruned, p.value,
                                        "not among the best 1/3 at rung 0", 1);
                    break;
                default:
                    studies.finishTrial(trial, TrialState::Failed, std::nullopt, "loss is NaN at step 10");
                    break;
            }
        }
        store.flush();
    }
};

void waitLoaded(StudiesView& view, QSignalSpy& refreshed, QSignalSpy& loaded) {
    REQUIRE(waitUntil([&] { return refreshed.count() >= 1 && !view.isRefreshing(); }, 10000));
    INFO(view.statusText().toStdString());
    REQUIRE(waitUntil([&] { return loaded.count() >= 1 && !view.isLoadingStudy(); }, 10000));
}

QString cell(const QAbstractItemModel* m, int row, int column) {
    return m->index(row, column).data().toString();
}

int64_t trialAt(const QAbstractItemModel* m, int row) {
    return m->index(row, 0).data(StudiesView::TrialNumberRole).toLongLong();
}

// Selects the table rows of these trials at once.
void selectTrials(StudiesView& view, const std::vector<int64_t>& numbers) {
    QAbstractItemModel* m = view.trialsModel();
    QItemSelection selection;
    for (int r = 0; r < m->rowCount(); ++r)
        for (int64_t n : numbers)
            if (trialAt(m, r) == n) selection.select(m->index(r, 0), m->index(r, m->columnCount() - 1));
    view.trialsTable()->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect);
}

}  // namespace

TEST_CASE("StudiesView lists studies and shows a study's trials, charts and the runs of selected trials",
          "[widgets][studies]") {
    StudyFixture fx;
    StudiesView view;
    view.resize(1400, 800);
    QSignalSpy refreshed(&view, &StudiesView::refreshed);
    QSignalSpy loaded(&view, &StudiesView::studyLoaded);
    view.setWorkspace(QString::fromStdString(fx.db));
    CHECK(view.refreshCount() == 0);  // a hidden page reads when it is shown
    view.show();
    waitLoaded(view, refreshed, loaded);
    CHECK_FALSE(view.isEmptyShown());

    // The list: one study with its algorithm, objective, trials done of those planned, best value.
    CHECK(view.studyNames() == QStringList{"lr-search"});
    QTreeWidget* list = view.studiesList();
    REQUIRE(list->topLevelItemCount() == 1);
    const QTreeWidgetItem* row = list->topLevelItem(0);
    CHECK(row->text(StudiesView::ColStudy) == "lr-search");
    CHECK(row->text(StudiesView::ColAlgorithm) == "ppo + asha");
    CHECK(row->text(StudiesView::ColObjective) == "max val/accuracy");
    CHECK(row->text(StudiesView::ColTrials) == "6/8");
    CHECK(row->text(StudiesView::ColBest).startsWith("0.91"));
    CHECK(row->text(StudiesView::ColBest).contains("trial 1"));
    CHECK(view.selectedStudy() == "lr-search");
    CHECK(view.studyLabel()->text().contains("lr-search"));

    // The trials table: one row per trial, a column per parameter in the space's order.
    QAbstractItemModel* trials = view.trialsModel();
    REQUIRE(trials->rowCount() == kTrials);
    CHECK(view.paramColumn("lr") == StudiesView::ColFirstParam);
    CHECK(view.paramColumn("batch") == StudiesView::ColFirstParam + 1);
    CHECK(view.paramColumn("dropout") == StudiesView::ColFirstParam + 2);
    CHECK(view.paramColumn("momentum") == -1);
    CHECK(trials->columnCount() == view.durationColumn() + 1);
    CHECK(trials->headerData(StudiesView::ColValue, Qt::Horizontal).toString() == "val/accuracy");
    CHECK(trials->headerData(view.prunedAtColumn(), Qt::Horizontal).toString().contains("epochs"));
    for (int r = 0; r < kTrials; ++r) {
        const int64_t n = trialAt(trials, r);
        CHECK(n == r);  // by number at first
        CHECK(trials->index(r, 0).data(StudiesView::RunIdRole).toLongLong() == fx.runs[size_t(n)]);
        CHECK(cell(trials, r, StudiesView::ColRun) == QString::number(fx.runs[size_t(n)]));
        CHECK(cell(trials, r, StudiesView::ColState) == lathe::core::toString(kPlan[n].state));
        CHECK(cell(trials, r, view.paramColumn("lr")) == kPlan[n].lr);
    }
    CHECK(cell(trials, 4, view.prunedAtColumn()) == "1");
    CHECK(cell(trials, 5, StudiesView::ColValue).isEmpty());
    // The fixture's trials last a moment: tenths of a second, not "0 s".
    const QString duration = cell(trials, 0, view.durationColumn());
    INFO(duration.toStdString());
    CHECK(QRegularExpression("^\\d\\.\\d s$").match(duration).hasMatch());

    // Sorting by the objective, best first: the failed trial (no value) stays last.
    QTableView* table = view.trialsTable();
    table->sortByColumn(StudiesView::ColValue, Qt::DescendingOrder);
    CHECK(trialAt(trials, 0) == 1);
    CHECK(cell(trials, 0, StudiesView::ColValue) == "0.91");
    CHECK(trialAt(trials, 1) == 3);
    CHECK(trialAt(trials, 4) == 4);
    CHECK(trialAt(trials, kTrials - 1) == 5);
    table->sortByColumn(StudiesView::ColValue, Qt::AscendingOrder);
    CHECK(trialAt(trials, 0) == 4);
    CHECK(trialAt(trials, kTrials - 1) == 5);
    // Numbers sort as numbers (text would put 128 first).
    table->sortByColumn(view.paramColumn("batch"), Qt::AscendingOrder);
    CHECK(cell(trials, 0, view.paramColumn("batch")) == "32");
    CHECK(cell(trials, kTrials - 1, view.paramColumn("batch")) == "128");
    table->sortByColumn(StudiesView::ColNumber, Qt::AscendingOrder);

    // Best so far: a step at each complete trial that improved, reaching the last trial.
    QCPGraph* best = view.bestSoFarGraph();
    REQUIRE(best);
    REQUIRE(best->data()->size() == 3);
    CHECK(best->data()->at(0)->key == 0);
    CHECK(best->data()->at(0)->value == Approx(0.82));
    CHECK(best->data()->at(1)->key == 1);
    CHECK(best->data()->at(1)->value == Approx(0.91));
    CHECK(best->data()->at(2)->key == kTrials - 1);
    CHECK(best->data()->at(2)->value == Approx(0.91));
    // Dots: complete and pruned trials (the failed one has no value), plus the step line.
    CHECK(view.historyPlot()->graphCount() == 3);

    // Parallel coordinates: a polyline per trial with a value, across 3 parameters + the objective.
    CHECK(view.parallelLineCount() == 5);
    CHECK(view.parallelPlot()->graphCount() == 5);
    for (int g = 0; g < view.parallelPlot()->graphCount(); ++g) {
        const auto* data = view.parallelPlot()->graph(g)->data().data();
        REQUIRE(data->size() == 4);
        for (int i = 0; i < data->size(); ++i) {
            CHECK(data->at(i)->value >= 0.0);
            CHECK(data->at(i)->value <= 1.0);
        }
    }

    // Importance: a bar per parameter, shares summing to 1.
    QCPBars* bars = view.importanceBars();
    REQUIRE(bars);
    REQUIRE(bars->data()->size() == 3);
    double sum = 0;
    for (int i = 0; i < bars->data()->size(); ++i) sum += bars->data()->at(i)->value;
    CHECK(sum == Approx(1.0));

    // PPO: the agent's choices, one line per trial run in each of the two plots.
    CHECK(view.isPpoShown());
    CHECK(view.ppoLineCount(false) == kTrials);
    CHECK(view.ppoLineCount(true) == kTrials);
    CHECK(view.ppoPlot()->graphCount() == 2 * kTrials);

    // Each chart on screen, and its hover naming what is under the pointer.
    const auto showTab = [&](int tab, QCustomPlot* plot) {
        view.chartTabs()->setCurrentIndex(tab);
        QTest::qWait(20);
        plot->replot();  // lays the axes out at the tab's size
        view.grab().save(outputPath(QStringLiteral("studies_view_%1.png").arg(tab)));
        auto* panel = qobject_cast<ChartPanel*>(plot->parentWidget());
        REQUIRE(panel);
        return panel;
    };
    QCustomPlot* plot = view.historyPlot();
    QString hover =
        showTab(0, plot)->hoverAt({plot->xAxis->coordToPixel(1), plot->yAxis->coordToPixel(0.91)});
    CHECK(hover.contains("trial 1"));
    CHECK(hover.contains(QStringLiteral("run %1").arg(fx.runs[1])));
    plot = view.parallelPlot();
    // The objective's axis is the last; the best trial tops it.
    hover = showTab(1, plot)->hoverAt({plot->xAxis->coordToPixel(3), plot->yAxis->coordToPixel(1.0)});
    CHECK(hover.startsWith("trial 1"));
    CHECK(hover.contains("lr = 0.01"));
    plot = view.importancePlot();
    const double topShare = bars->data()->at(bars->data()->size() - 1)->value;
    hover =
        showTab(2, plot)->hoverAt({plot->xAxis->coordToPixel(topShare / 2), plot->yAxis->coordToPixel(3)});
    CHECK_FALSE(hover.isEmpty());
    plot = view.ppoPlot();
    QCPAxisRect* lrRect = plot->axisRect(0);
    hover = showTab(3, plot)->hoverAt({lrRect->axis(QCPAxis::atBottom)->coordToPixel(5),
                                       lrRect->axis(QCPAxis::atLeft)->coordToPixel(0.001)});
    CHECK(hover.startsWith(QStringLiteral("trial 0 (run %1)").arg(fx.runs[0])));
    CHECK(hover.contains("ppo/lr = 0.001"));

    // Selecting two trials reports their two runs, ascending.
    QSignalSpy selected(&view, &StudiesView::runsSelected);
    selectTrials(view, {3, 0});
    REQUIRE(selected.count() == 1);
    const auto ids = selected.at(0).at(0).value<QList<qint64>>();
    CHECK(ids == QList<qint64>{fx.runs[0], fx.runs[3]});
    CHECK(view.selectedRunIds() == ids);
    // Double-click asks for them on the Runs page.
    QSignalSpy opened(&view, &StudiesView::runsOpened);
    Q_EMIT table->doubleClicked(table->selectionModel()->selectedRows().first());
    REQUIRE(opened.count() == 1);
    CHECK(opened.at(0).at(0).value<QList<qint64>>() == ids);

    // A re-read of an unchanged study keeps the selection and emits nothing new.
    const int before = loaded.count();
    view.refresh();
    REQUIRE(waitUntil([&] { return loaded.count() > before && !view.isLoadingStudy(); }, 10000));
    CHECK(view.selectedRunIds() == ids);
    CHECK(selected.count() == 1);
}

TEST_CASE("StudiesView shows how to start a study in a workspace without one", "[widgets][studies]") {
    TempDir dir;
    const std::string db = dir.file("empty.db");
    { Store store(db); }
    StudiesView view;
    QSignalSpy refreshed(&view, &StudiesView::refreshed);
    view.setWorkspace(QString::fromStdString(db));
    view.show();
    REQUIRE(waitUntil([&] { return refreshed.count() >= 1 && !view.isRefreshing(); }, 10000));
    CHECK(view.isEmptyShown());
    CHECK(view.emptyLabel()->text().contains("lathectl tune"));
    CHECK(view.studyNames().isEmpty());
    CHECK(view.trialsModel()->rowCount() == 0);
    CHECK_FALSE(view.isPpoShown());
}

TEST_CASE("The window's Studies page selects the selected trials' runs in the runs table",
          "[widgets][studies][window]") {
    StudyFixture fx;
    auto window = std::make_unique<MainWindow>(std::make_unique<Store>(fx.db));
    window->resize(1400, 900);
    window->show();
    QTabWidget* pages = window->pageTabs();
    REQUIRE(window->studiesView());
    const int index = pages->indexOf(window->studiesView());
    REQUIRE(index == pages->indexOf(window->dataSetsView()) + 1);
    CHECK(pages->tabText(index) == "Studies");

    StudiesView* view = window->studiesView();
    QSignalSpy refreshed(view, &StudiesView::refreshed);
    QSignalSpy loaded(view, &StudiesView::studyLoaded);
    pages->setCurrentIndex(index);
    waitLoaded(*view, refreshed, loaded);
    REQUIRE(view->trialsModel()->rowCount() == kTrials);

    selectTrials(*view, {1, 2});
    const std::vector<int64_t> want{fx.runs[1], fx.runs[2]};
    REQUIRE(waitUntil([&] { return window->selectedRuns() == want; }, 10000));
    CHECK(pages->currentIndex() == index);  // selecting compares; it does not leave the page

    // Double-click: the Runs page, showing those runs.
    Q_EMIT view->trialsTable()->doubleClicked(view->trialsTable()->selectionModel()->selectedRows().first());
    CHECK(pages->currentIndex() == 0);
    REQUIRE(waitUntil([&] { return window->selectedRuns() == want; }, 10000));
}

TEST_CASE("parameterImportance gives the parameter the objective depends on nearly all of it",
          "[studies][importance]") {
    StudyRecord study;
    study.space = {"lr=loguniform(0.0001, 0.1)", "dropout=uniform(0, 0.5)", "batch=choice(32,64)"};
    // A full grid: 8 learning rates x 3 dropouts x 2 batch sizes; the objective peaks at lr 3e-3
    // and ignores the rest.
    std::vector<TrialRecord> trials;
    const char* dropouts[] = {"0", "0.25", "0.5"};
    const char* batches[] = {"32", "64"};
    int64_t n = 0;
    for (int i = 0; i < 8; ++i)
        for (const char* dropout : dropouts)
            for (const char* batch : batches) {
                TrialRecord t;
                t.number = n++;
                t.state = TrialState::Complete;
                const double lr = std::pow(10.0, -4 + 3.0 * i / 7);
                t.params = {{"lr", std::to_string(lr)}, {"dropout", dropout}, {"batch", batch}};
                t.value = 0.9 - 0.05 * std::pow(std::log10(lr) + 2.5, 2);
                trials.push_back(t);
            }
    // Pruned and failed trials are left out (a pruned value is from a smaller budget).
    TrialRecord pruned;
    pruned.number = n++;
    pruned.state = TrialState::Pruned;
    pruned.params = {{"lr", "0.001"}, {"dropout", "0.5"}, {"batch", "32"}};
    pruned.value = -5;
    trials.push_back(pruned);
    TrialRecord failed = pruned;
    failed.number = n++;
    failed.state = TrialState::Failed;
    failed.value.reset();
    trials.push_back(failed);

    const auto importance = parameterImportance(study, trials);
    REQUIRE(importance.size() == 3);
    CHECK(importance[0].key == "lr");
    double sum = 0;
    for (const auto& p : importance) sum += p.importance;
    CHECK(sum == Approx(1.0));
    CHECK(importance[0].importance > 0.8 * sum);
    CHECK(importance[0].importance >= importance[1].importance);
    CHECK(importance[1].importance >= importance[2].importance);

    SECTION("a choice the objective depends on") {
        for (auto& t : trials)
            if (t.state == TrialState::Complete) t.value = t.params["batch"] == "64" ? 0.9 : 0.6;
        const auto byBatch = parameterImportance(study, trials);
        REQUIRE(byBatch.size() == 3);
        CHECK(byBatch[0].key == "batch");
        CHECK(byBatch[0].importance > 0.8);
    }
    SECTION("nothing to explain: every parameter gets 0") {
        for (auto& t : trials)
            if (t.state == TrialState::Complete) t.value = 0.5;
        const auto flat = parameterImportance(study, trials);
        REQUIRE(flat.size() == 3);
        for (const auto& p : flat) CHECK(p.importance == 0);
    }
    SECTION("fewer than 4 complete trials: none") {
        std::vector<TrialRecord> few(trials.begin(), trials.begin() + 3);
        few.push_back(pruned);
        few.push_back(failed);
        CHECK(parameterImportance(study, few).empty());
    }
}

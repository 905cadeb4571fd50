#include <catch2/catch.hpp>

#include <QAbstractItemModelTester>
#include <QItemSelectionModel>
#include <QSignalSpy>

#include "lathe/widgets/run_list_model.h"

using lathe::core::RunRecord;
using lathe::widgets::RunListModel;

namespace {

RunRecord makeRun(int64_t id, const std::string& status) {
    RunRecord r;
    r.id = id;
    r.name = "run-" + std::to_string(id);
    r.experiment = "default";
    r.status = lathe::core::runStatusFromString(status).value();
    r.model = "mlp";
    r.data = "digits";
    r.createdAt = 1700000000.0 + double(id);
    return r;
}

std::vector<int64_t> selectedIds(const QItemSelectionModel& sel) {
    std::vector<int64_t> ids;
    for (const auto& idx : sel.selectedRows()) ids.push_back(idx.data(RunListModel::RunIdRole).toLongLong());
    std::sort(ids.begin(), ids.end());
    return ids;
}

}  // namespace

TEST_CASE("RunListModel passes the model tester and diffs refreshes", "[widgets][model]") {
    RunListModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);

    model.setRuns({makeRun(3, "running"), makeRun(2, "completed"), makeRun(1, "failed")}, {{2, 0.9731}});
    REQUIRE(model.rowCount() == 3);
    REQUIRE(model.columnCount() == RunListModel::ColumnCount);
    CHECK(model.index(0, RunListModel::ColId).data().toString() == "3");
    CHECK(model.index(1, RunListModel::ColValAccuracy).data().toString() == "97.31%");
    CHECK(model.index(2, RunListModel::ColStatus).data().toString() == "failed");
    CHECK(model.index(2, RunListModel::ColStatus).data(Qt::ForegroundRole).isValid());
    CHECK(model.headerData(RunListModel::ColValAccuracy, Qt::Horizontal).toString() == "Val acc.");

    QItemSelectionModel selection(&model);
    selection.select(model.index(1, 0), QItemSelectionModel::Select | QItemSelectionModel::Rows);  // run 2
    selection.select(model.index(0, 0), QItemSelectionModel::Select | QItemSelectionModel::Rows);  // run 3
    REQUIRE(selectedIds(selection) == std::vector<int64_t>{2, 3});

    SECTION("a new run and a status change keep the selection") {
        QSignalSpy inserted(&model, &QAbstractItemModel::rowsInserted);
        QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
        model.setRuns(
            {makeRun(4, "running"), makeRun(3, "completed"), makeRun(2, "completed"), makeRun(1, "failed")},
            {{2, 0.9731}, {3, 0.5}});
        CHECK(model.rowCount() == 4);
        CHECK(inserted.count() == 1);
        CHECK(changed.count() == 1);  // only run 3 changed
        CHECK(model.index(1, RunListModel::ColStatus).data().toString() == "completed");
        CHECK(selectedIds(selection) == std::vector<int64_t>{2, 3});
    }
    SECTION("a removed run and a reorder keep the rest selected") {
        model.setRuns({makeRun(3, "running"), makeRun(1, "failed")});
        CHECK(model.rowCount() == 2);
        CHECK(selectedIds(selection) == std::vector<int64_t>{3});
        model.setRuns({makeRun(1, "failed"), makeRun(5, "created"), makeRun(3, "running")});
        CHECK(model.runIdAt(0) == 1);
        CHECK(model.runIdAt(1) == 5);
        CHECK(model.runIdAt(2) == 3);
        CHECK(model.rowOfRun(3) == 2);
        CHECK(selectedIds(selection) == std::vector<int64_t>{3});
    }
    SECTION("an identical refresh emits nothing") {
        QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
        model.setRuns({makeRun(3, "running"), makeRun(2, "completed"), makeRun(1, "failed")}, {{2, 0.9731}});
        CHECK(changed.count() == 0);
    }
    SECTION("emptying and refilling") {
        model.setRuns({});
        CHECK(model.rowCount() == 0);
        model.setRuns({makeRun(7, "completed")});
        CHECK(model.rowCount() == 1);
        CHECK(model.runById(7) != nullptr);
    }
    CHECK(resets.count() == 0);
}

TEST_CASE("RunListModel shows an interrupted run in its own colour and says how to resume it",
          "[widgets][model]") {
    RunListModel model;
    model.setRuns({makeRun(4, "interrupted"), makeRun(3, "running")});
    const auto status = model.index(0, RunListModel::ColStatus);
    CHECK(status.data().toString() == "interrupted");
    const auto colour = status.data(Qt::ForegroundRole).value<QBrush>().color();
    CHECK(colour.isValid());
    CHECK(colour != model.index(1, RunListModel::ColStatus).data(Qt::ForegroundRole).value<QBrush>().color());
    const auto tip = status.data(Qt::ToolTipRole).toString();
    CHECK(tip.contains("lathectl train --resume 4"));
    CHECK_FALSE(
        model.index(1, RunListModel::ColStatus).data(Qt::ToolTipRole).toString().contains("--resume"));
}

TEST_CASE("RunFilterProxy matches every column at once, ignoring case, and follows changed rows",
          "[widgets][model]") {
    RunListModel model;
    lathe::widgets::RunFilterProxy proxy;
    proxy.setSourceModel(&model);
    QAbstractItemModelTester tester(&proxy, QAbstractItemModelTester::FailureReportingMode::Fatal);
    auto a = makeRun(1, "running"), b = makeRun(2, "completed"), c = makeRun(3, "failed");
    b.experiment = "Sweep-LR";
    c.model = "cnn";
    model.setRuns({c, b, a}, {{2, 0.9731}});
    auto shownIds = [&] {
        std::vector<int64_t> ids;
        for (int r = 0; r < proxy.rowCount(); ++r)
            ids.push_back(proxy.index(r, 0).data(RunListModel::RunIdRole).toLongLong());
        std::sort(ids.begin(), ids.end());
        return ids;
    };
    CHECK(shownIds() == std::vector<int64_t>{1, 2, 3});
    proxy.setFilterText("sweep-lr");  // the experiment, another case
    CHECK(shownIds() == std::vector<int64_t>{2});
    proxy.setFilterText("CNN");  // the model
    CHECK(shownIds() == std::vector<int64_t>{3});
    proxy.setFilterText("97.31%");  // the accuracy as shown
    CHECK(shownIds() == std::vector<int64_t>{2});
    proxy.setFilterText("RUNNING");
    CHECK(shownIds() == std::vector<int64_t>{1});
    // A text across two columns (name, then experiment) matches nothing.
    proxy.setFilterText("run-1default");
    CHECK(shownIds().empty());
    proxy.setFilterText("run-1\tdefault");
    CHECK(shownIds().empty());

    // A row that changes is searched as it is now: run 1 completes, run 3 starts running.
    proxy.setFilterText("running");
    a.status = lathe::core::RunStatus::Completed;
    c.status = lathe::core::RunStatus::Running;
    model.setRuns({c, b, a}, {{2, 0.9731}});
    CHECK(shownIds() == std::vector<int64_t>{3});
    proxy.setFilterText({});
    CHECK(shownIds() == std::vector<int64_t>{1, 2, 3});
}

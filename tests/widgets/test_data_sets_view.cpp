// The Data sets page on a real workspace: a CSV data set with two versions (the current one
// marked), a run recorded on the first and a model version registered and deployed from it; the
// lineage of each version read off the GUI thread; Refresh picking up a version added meanwhile;
// and the empty state of a workspace without data sets.
#include <catch2/catch.hpp>

#include <QDateTime>
#include <QLabel>
#include <QPushButton>
#include <QSignalSpy>
#include <QTreeWidget>

#include <sstream>
#include <string>

#include "lathe/core/data_versions.h"
#include "lathe/core/registry.h"
#include "lathe/core/store.h"
#include "lathe/widgets/data_sets_view.h"
#include "temp_dir.h"
#include "test_helpers.h"

using lathe::core::DataAddOptions;
using lathe::core::DataSets;
using lathe::core::Store;
using lathe::test::outputPath;
using lathe::test::TempDir;
using lathe::test::waitUntil;
using lathe::test::writeFile;
using lathe::widgets::DataSetsView;

namespace {

// A header a,b,label and `rows` rows; another seed gives other values.
std::string csvText(int rows, int seed) {
    std::ostringstream out;
    out << "a,b,label\n";
    for (int i = 0; i < rows; ++i) {
        const double a = ((i * 37 + seed) % 100) / 50.0 - 1.0, b = ((i * 61 + 3 * seed) % 100) / 50.0 - 1.0;
        out << a << "," << b << "," << (a + b > 0 ? "yes" : "no") << "\n";
    }
    return out.str();
}

struct DataSetsFixture {
    TempDir dir;
    std::string db = dir.file("workspace.db");
    std::string csv = dir.file("points.csv");
    lathe::core::DataVersion v1, v2;
    int64_t runId = 0;

    DataSetsFixture() {
        Store store(db);
        DataSets sets(db);
        writeFile(csv, csvText(20, 1));
        const auto r1 = sets.add("points", csv, {});
        REQUIRE(r1.created);
        v1 = r1.version;
        writeFile(csv, csvText(20, 2));
        DataAddOptions o;
        o.message = "relabelled";
        const auto r2 = sets.add("points", csv, o);
        REQUIRE(r2.created);
        v2 = r2.version;
        REQUIRE(v2.version == 2);

        // A run that trained on v1, and a model version registered from it, live.
        runId = store.createRun("default", "points-mlp", "mlp", "dataset:points:1", "", {}, "localhost");
        store.flush();
        sets.recordRunData(runId, v1.id);
        lathe::core::Registry registry(db);
        lathe::core::ModelVersion mv;
        mv.name = "points";
        mv.path = dir.file("points-v1.pt");
        mv.sha256 = std::string(64, 'a');
        mv.runId = runId;
        mv.data = "dataset:points:1";
        mv.source = "run " + std::to_string(runId);
        REQUIRE(registry.addVersion(mv).version == 1);
        registry.setAlias("points", "production", 1);
        lathe::core::Deployment d;
        d.model = "points";
        d.version = 1;
        d.url = "http://127.0.0.1:8500";
        d.startedAt = double(QDateTime::currentMSecsSinceEpoch()) / 1000.0;
        registry.recordDeployment(d);
    }
};

QString kindOf(const QTreeWidgetItem* item) { return item->data(0, DataSetsView::KindRole).toString(); }

// Selects NAME:V and waits for its lineage to land.
void showLineage(DataSetsView& view, QSignalSpy& loaded, const QString& name, int64_t version) {
    const int before = loaded.count();
    view.selectVersion(name, version);
    REQUIRE(view.selectedDataSet() == name);
    if (version > 0) REQUIRE(view.selectedVersion() == version);
    REQUIRE(waitUntil([&] { return loaded.count() > before && !view.isLoadingLineage(); }, 10000));
}

}  // namespace

TEST_CASE("DataSetsView lists data sets with their versions and shows a version's lineage",
          "[widgets][data-sets]") {
    DataSetsFixture fx;
    DataSetsView view;
    view.resize(1300, 600);
    QSignalSpy refreshed(&view, &DataSetsView::refreshed);
    QSignalSpy loaded(&view, &DataSetsView::lineageLoaded);
    // A hidden page reads when it is shown.
    view.setWorkspace(QString::fromStdString(fx.db));
    CHECK(view.refreshCount() == 0);
    view.show();
    REQUIRE(waitUntil([&] { return refreshed.count() >= 1 && !view.isRefreshing(); }, 10000));
    INFO(view.statusText().toStdString());
    CHECK_FALSE(view.isEmptyShown());
    CHECK(view.dataSetNames() == QStringList{"points"});

    QTreeWidget* tree = view.tree();
    CHECK(tree->objectName() == "dataSetsTree");
    REQUIRE(tree->topLevelItemCount() == 1);
    const QTreeWidgetItem* set = tree->topLevelItem(0);
    CHECK(set->text(DataSetsView::ColName) == "points");
    CHECK(set->text(DataSetsView::ColKind) == "csv");
    CHECK(set->text(DataSetsView::ColCurrent) == "v2");
    REQUIRE(set->childCount() == 2);
    // Newest first; the current version marked.
    const QTreeWidgetItem* second = set->child(0);
    const QTreeWidgetItem* first = set->child(1);
    CHECK(second->text(DataSetsView::ColName) == "v2");
    CHECK(second->data(0, DataSetsView::CurrentRole).toBool());
    CHECK(second->text(DataSetsView::ColCurrent).contains("current"));
    CHECK(second->text(DataSetsView::ColRoot) == QString::fromStdString(fx.v2.rootHash.substr(0, 12)));
    CHECK(second->text(DataSetsView::ColFiles) == "1");
    CHECK(second->text(DataSetsView::ColMessage) == "relabelled");
    CHECK_FALSE(second->text(DataSetsView::ColCreated).isEmpty());
    CHECK(first->text(DataSetsView::ColName) == "v1");
    CHECK_FALSE(first->data(0, DataSetsView::CurrentRole).toBool());
    CHECK(first->text(DataSetsView::ColCurrent).isEmpty());
    CHECK(first->text(DataSetsView::ColRoot) == QString::fromStdString(fx.v1.rootHash.substr(0, 12)));
    CHECK(first->text(DataSetsView::ColRoot) != second->text(DataSetsView::ColRoot));

    // The first read selects the current version; nothing trained on it yet.
    REQUIRE(waitUntil([&] { return loaded.count() >= 1 && !view.isLoadingLineage(); }, 10000));
    CHECK(view.selectedDataSet() == "points");
    CHECK(view.selectedVersion() == 2);
    QTreeWidget* lineage = view.lineageTree();
    CHECK(lineage->objectName() == "lineageView");
    REQUIRE(lineage->topLevelItemCount() == 1);
    CHECK(lineage->topLevelItem(0)->text(0) == "dataset:points:2");
    REQUIRE(lineage->topLevelItem(0)->childCount() == 1);
    CHECK(kindOf(lineage->topLevelItem(0)->child(0)) == "none");
    REQUIRE(view.filesList()->topLevelItemCount() == 1);
    CHECK(view.filesList()->topLevelItem(0)->text(0) == "points.csv");
    CHECK(view.versionLabel()->text().contains("points:2"));

    // v1: its run, the model version registered from it, and that version's deployment.
    showLineage(view, loaded, "points", 1);
    REQUIRE(lineage->topLevelItemCount() == 1);
    const QTreeWidgetItem* root = lineage->topLevelItem(0);
    CHECK(root->text(0) == "dataset:points:1");
    REQUIRE(root->childCount() == 1);
    QTreeWidgetItem* run = root->child(0);
    CHECK(kindOf(run) == "run");
    CHECK(run->data(0, DataSetsView::RunIdRole).toLongLong() == fx.runId);
    CHECK(run->text(0).contains("points-mlp"));
    CHECK(run->text(1) == "created");
    REQUIRE(run->childCount() == 1);
    QTreeWidgetItem* model = run->child(0);
    CHECK(kindOf(model) == "model");
    CHECK(model->text(0) == "model points:1");
    CHECK(model->text(1).contains("@production"));
    REQUIRE(model->childCount() == 1);
    CHECK(kindOf(model->child(0)) == "deployment");
    CHECK(model->child(0)->text(0).contains("http://127.0.0.1:8500"));
    CHECK(model->child(0)->text(0).contains("live"));
    view.grab().save(outputPath("data_sets_view.png"));

    // Double-clicks ask the window to show the run or the model version.
    QSignalSpy runAsked(&view, &DataSetsView::runRequested);
    QSignalSpy modelAsked(&view, &DataSetsView::modelRequested);
    Q_EMIT lineage->itemDoubleClicked(run, 0);
    Q_EMIT lineage->itemDoubleClicked(model, 0);
    REQUIRE(runAsked.count() == 1);
    CHECK(runAsked.at(0).at(0).toLongLong() == fx.runId);
    REQUIRE(modelAsked.count() == 1);
    CHECK(modelAsked.at(0).at(0).toString() == "points");
    CHECK(modelAsked.at(0).at(1).toLongLong() == 1);

    // A data set row shows its current version.
    showLineage(view, loaded, "points", 0);
    CHECK(view.selectedVersion() == 2);
    CHECK(lineage->topLevelItem(0)->text(0) == "dataset:points:2");

    // A version added elsewhere (lathectl data add) shows on Refresh; the selection stays.
    showLineage(view, loaded, "points", 1);
    writeFile(fx.csv, csvText(20, 3));
    {
        DataSets sets(fx.db);
        REQUIRE(sets.add("points", fx.csv, {}).version.version == 3);
    }
    const int before = refreshed.count();
    REQUIRE(view.refreshButton()->isEnabled());
    view.refreshButton()->click();
    REQUIRE(waitUntil([&] { return refreshed.count() > before && !view.isRefreshing(); }, 10000));
    REQUIRE(tree->topLevelItemCount() == 1);
    CHECK(tree->topLevelItem(0)->text(DataSetsView::ColCurrent) == "v3");
    REQUIRE(tree->topLevelItem(0)->childCount() == 3);
    CHECK(tree->topLevelItem(0)->child(0)->data(0, DataSetsView::CurrentRole).toBool());
    CHECK_FALSE(tree->topLevelItem(0)->child(1)->data(0, DataSetsView::CurrentRole).toBool());
    CHECK(view.selectedVersion() == 1);
    REQUIRE(waitUntil([&] { return !view.isLoadingLineage(); }, 10000));
    CHECK(lineage->topLevelItem(0)->text(0) == "dataset:points:1");
}

TEST_CASE("DataSetsView on a workspace without data sets says how to add one", "[widgets][data-sets]") {
    TempDir dir;
    const std::string db = dir.file("workspace.db");
    { Store store(db); }
    DataSetsView view;
    view.resize(900, 500);
    view.show();
    CHECK_FALSE(view.refreshButton()->isEnabled());  // no workspace yet
    QSignalSpy refreshed(&view, &DataSetsView::refreshed);
    view.setWorkspace(QString::fromStdString(db));  // shown: read at once
    REQUIRE(waitUntil([&] { return refreshed.count() >= 1 && !view.isRefreshing(); }, 10000));
    CHECK(view.statusText() == "No data sets yet.");
    CHECK(view.isEmptyShown());
    CHECK(view.emptyLabel()->isVisible());
    CHECK(view.emptyLabel()->text().contains("lathectl data add NAME PATH"));
    CHECK(view.emptyLabel()->text().contains("lathectl data example DIR"));
    CHECK(view.tree()->topLevelItemCount() == 0);
    CHECK(view.lineageTree()->topLevelItemCount() == 0);
    CHECK(view.selectedVersion() == 0);
    CHECK(view.dataSetNames().isEmpty());
    view.grab().save(outputPath("data_sets_view_empty.png"));

    view.setWorkspace({});
    CHECK_FALSE(view.refreshButton()->isEnabled());
    CHECK(view.isEmptyShown());
}

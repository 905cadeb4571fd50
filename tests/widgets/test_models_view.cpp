#include <catch2/catch.hpp>

#include <QAbstractItemModelTester>
#include <QComboBox>
#include <QImage>
#include <QPushButton>
#include <QSignalSpy>
#include <QTableView>
#include <QTreeView>

#include <cmath>
#include <vector>

#include "lathe/widgets/model_list_model.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/serving_chart.h"
#include "lathe/widgets/serving_dashboard.h"
#include "lathe/widgets/serving_tables.h"
#include "registry_fixture.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::RegistryFixture;
using lathe::test::waitUntil;
using lathe::widgets::AlertTableModel;
using lathe::widgets::DeploymentTableModel;
using lathe::widgets::ModelListModel;
using lathe::widgets::ModelsView;
using lathe::widgets::ServingChart;
using lathe::widgets::ServingDashboard;
using Series = lathe::widgets::ServingChart::Series;

namespace {

QString cell(const QAbstractItemModel& m, const QModelIndex& idx, int column) {
    return idx.siblingAtColumn(column).data().toString();
}

}  // namespace

TEST_CASE("ModelListModel lists models and versions with lineage and diffs refreshes", "[widgets][models]") {
    RegistryFixture fx;
    ModelListModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);

    model.setModels(lathe::widgets::readModelEntries(*fx.registry));
    REQUIRE(model.rowCount() == 2);
    REQUIRE(model.columnCount() == ModelListModel::ColumnCount);
    const QModelIndex digits = model.index(0, 0);
    const QModelIndex spirals = model.index(1, 0);
    CHECK(digits.data().toString() == "digits");
    CHECK(spirals.data().toString() == "spirals");
    CHECK(cell(model, digits, ModelListModel::ColStatus) == "v2 live");
    CHECK(cell(model, spirals, ModelListModel::ColStatus) == "not deployed");
    CHECK(cell(model, digits, ModelListModel::ColAliases) == "production→v2");
    CHECK(cell(model, digits, ModelListModel::ColSource) == "3 versions");
    CHECK(digits.data(ModelListModel::LiveRole).toBool());
    CHECK_FALSE(spirals.data(ModelListModel::LiveRole).toBool());

    // Versions newest first, with their lineage.
    REQUIRE(model.rowCount(digits) == 3);
    REQUIRE(model.rowCount(spirals) == 1);
    const QModelIndex v3 = model.index(0, 0, digits);
    const QModelIndex v2 = model.index(1, 0, digits);
    const QModelIndex v1 = model.index(2, 0, digits);
    CHECK(v3.data().toString() == "v3");
    CHECK(v1.data().toString() == "v1");
    CHECK(v3.parent() == digits);
    CHECK(v2.data(ModelListModel::VersionRole).toLongLong() == 2);
    CHECK(v2.data(ModelListModel::ModelNameRole).toString() == "digits");
    CHECK(cell(model, v2, ModelListModel::ColStatus) ==
          QStringLiteral("live · %1").arg(RegistryFixture::kUrl));
    CHECK(v2.data(ModelListModel::LiveRole).toBool());
    CHECK(cell(model, v3, ModelListModel::ColStatus).isEmpty());
    CHECK(cell(model, v2, ModelListModel::ColAliases) == "production");
    CHECK(cell(model, v3, ModelListModel::ColSource) == QStringLiteral("run %1").arg(fx.runId));
    CHECK(cell(model, v3, ModelListModel::ColData) == "digits");
    CHECK(cell(model, v3, ModelListModel::ColParent) == "v2");
    CHECK(cell(model, v1, ModelListModel::ColParent).isEmpty());
    CHECK(cell(model, v3, ModelListModel::ColValAccuracy) == "96.30%");
    CHECK(cell(model, v3, ModelListModel::ColSha) == "3f9c0d2e71b4");
    CHECK(cell(model, v3, ModelListModel::ColSize) == "202.5 KiB");
    CHECK_FALSE(cell(model, v3, ModelListModel::ColCreated).isEmpty());
    CHECK(v3.siblingAtColumn(ModelListModel::ColName).data(Qt::ToolTipRole).toString().contains("val/loss"));
    const QModelIndex spiralsV1 = model.index(0, 0, spirals);
    CHECK(cell(model, spiralsV1, ModelListModel::ColSource) == "file /tmp/spirals.pt");
    CHECK(cell(model, spiralsV1, ModelListModel::ColValAccuracy) == "88.00%");
    CHECK(model.headerData(ModelListModel::ColSha, Qt::Horizontal).toString() == "SHA-256");

    const auto* entry = model.entry("digits");
    REQUIRE(entry);
    REQUIRE(entry->live());
    CHECK(entry->live()->version == 2);
    CHECK(entry->rollbackVersion() == 3);  // what served before the automatic rollback
    CHECK(model.entry("spirals")->rollbackVersion() == 0);
    CHECK(model.indexOf("digits", 3) == v3);
    CHECK(model.indexOf("spirals") == spirals);
    CHECK_FALSE(model.indexOf("digits", 9).isValid());

    // A new version, a new model (sorted between the two) and a deployment: inserts and
    // dataChanged, never a reset, and a persistent index still names the same version.
    const QPersistentModelIndex keep(v2);
    QSignalSpy inserted(&model, &QAbstractItemModel::rowsInserted);
    QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
    fx.registry->addVersion(fx.version("digits", 3, 0.97, true));
    fx.registry->addVersion(fx.version("mnist", 0, 0.99, false));
    lathe::core::Deployment d;
    d.model = "digits";
    d.version = 4;
    d.url = RegistryFixture::kUrl;
    fx.registry->recordDeployment(d);
    model.setModels(lathe::widgets::readModelEntries(*fx.registry));
    CHECK(resets.count() == 0);
    CHECK(inserted.count() == 2);
    REQUIRE(model.rowCount() == 3);
    CHECK(model.index(1, 0).data().toString() == "mnist");
    REQUIRE(keep.isValid());
    CHECK(keep.data(ModelListModel::VersionRole).toLongLong() == 2);
    CHECK(keep.parent().data().toString() == "digits");
    CHECK(keep.row() == 2);
    CHECK(changed.count() > 0);
    CHECK(cell(model, model.index(0, 0), ModelListModel::ColStatus) == "v4 live");
    CHECK(cell(model, model.index(0, 0, model.index(0, 0)), ModelListModel::ColName) == "v4");
    CHECK(model.index(0, 0, model.index(0, 0)).data(ModelListModel::LiveRole).toBool());
    CHECK_FALSE(QModelIndex(keep).data(ModelListModel::LiveRole).toBool());

    // An identical read changes nothing.
    QSignalSpy quiet(&model, &QAbstractItemModel::dataChanged);
    model.setModels(lathe::widgets::readModelEntries(*fx.registry));
    CHECK(quiet.count() == 0);

    // A model that disappeared (another workspace) is removed, not reset.
    QSignalSpy removed(&model, &QAbstractItemModel::rowsRemoved);
    auto entries = lathe::widgets::readModelEntries(*fx.registry);
    entries.erase(entries.begin() + 1);  // mnist
    model.setModels(entries);
    CHECK(removed.count() == 1);
    CHECK(model.rowCount() == 2);
    CHECK(resets.count() == 0);
}

TEST_CASE("Batch bucket labels say which batch sizes a bucket counts", "[widgets][models]") {
    using V = std::vector<QString>;
    CHECK(ServingDashboard::batchBucketLabels({"1", "2", "4", "8", "+Inf"}) ==
          V{"1", "2", "3–4", "5–8", ">8"});
    CHECK(ServingDashboard::batchBucketLabels({"16", "+Inf"}) == V{"1–16", ">16"});
    CHECK(ServingDashboard::batchBucketLabels({"0.5"}) == V{"≤0.5"});
}

TEST_CASE("ServingDashboard shows latency, traffic, deployments and alerts of a model", "[widgets][models]") {
    RegistryFixture fx;
    ServingDashboard dash;
    dash.resize(1300, 650);
    dash.show();
    QAbstractItemModelTester deployTester(dash.deploymentModel(),
                                          QAbstractItemModelTester::FailureReportingMode::Fatal);
    QAbstractItemModelTester alertTester(dash.alertModel(),
                                         QAbstractItemModelTester::FailureReportingMode::Fatal);
    ServingChart* chart = dash.chart();
    CHECK(chart->placeholderText().contains("Select a model"));

    QSignalSpy polled(&dash, &ServingDashboard::polled);
    dash.showModel(fx.registry, "digits");
    REQUIRE(waitUntil([&] { return polled.count() >= 1; }, 5000));
    CHECK(dash.errorText().isEmpty());
    const int keys = int(ServingDashboard::polledKeys().size()) + int(RegistryFixture::batchHist().size());
    CHECK(polled.at(0).at(0).toInt() == keys * RegistryFixture::kSeconds);
    chart->flushStaged();

    for (Series s : {Series::P50, Series::P90, Series::P99, Series::Qps, Series::ErrorRate,
                     Series::QueueDepth, Series::BatchMean}) {
        INFO("series " << ServingChart::keyOf(s));
        CHECK(chart->pointCount(s) == RegistryFixture::kSeconds);
    }
    // Stored values, error rate in percent, on a date-time axis in seconds since the epoch.
    auto at = [](QCPGraph* g, double t) { return g->data()->findBegin(t, false)->value; };
    const double tv3 = fx.t0 + 55;  // v3, slow
    CHECK(at(chart->graph(Series::P99), tv3) == Approx(150.0));
    CHECK(at(chart->graph(Series::P50), tv3) == Approx(RegistryFixture::p50(3, 25)));
    CHECK(at(chart->graph(Series::ErrorRate), tv3) == Approx(2.0));
    CHECK(chart->graph(Series::ErrorRate)->valueAxis() == chart->trafficRect()->axis(QCPAxis::atRight));
    CHECK(chart->graph(Series::QueueDepth)->valueAxis()->axisRect() == chart->queueRect());
    QCPAxis* x0 = chart->latencyRect()->axis(QCPAxis::atBottom);
    QCPAxis* x1 = chart->trafficRect()->axis(QCPAxis::atBottom);
    QCPAxis* x2 = chart->queueRect()->axis(QCPAxis::atBottom);
    CHECK(x0->range().lower <= fx.t0 + 20);  // the first point is in view
    CHECK(x0->range().upper >= fx.t0 + 79);
    CHECK(qSharedPointerDynamicCast<QCPAxisTickerDateTime>(x2->ticker()));
    x1->setRange(fx.t0 + 40, fx.t0 + 70);
    CHECK(x0->range().lower == Approx(fx.t0 + 40));
    CHECK(x2->range().upper == Approx(fx.t0 + 70));
    chart->rescale();

    // Deployments are markers across the chart; the alert is one shaded span.
    CHECK(chart->markerCount() == 3);
    CHECK(chart->markerLabels() == QStringList{"v2 deploy", "v3 deploy", "v2 rollback (auto)"});
    CHECK(chart->alertSpanCount() == 1);
    CHECK(chart->placeholderText().isEmpty());

    // Tables: history newest first, the live one marked; the resolved alert.
    auto* deployments = dash.deploymentModel();
    REQUIRE(deployments->rowCount() == 3);
    CHECK(deployments->index(0, DeploymentTableModel::ColVersion).data().toString() == "v2");
    CHECK(deployments->index(0, DeploymentTableModel::ColAction).data().toString() == "rollback");
    CHECK(deployments->index(0, DeploymentTableModel::ColActor).data().toString() == "auto-rollback");
    CHECK(deployments->index(0, DeploymentTableModel::ColReason).data().toString().contains("p99_latency"));
    CHECK(deployments->index(0, DeploymentTableModel::ColState).data().toString() == "live");
    CHECK(deployments->index(0, DeploymentTableModel::ColTo).data().toString().isEmpty());
    CHECK(deployments->index(1, DeploymentTableModel::ColState).data().toString() == "ended: replaced by v2");
    CHECK(deployments->index(2, DeploymentTableModel::ColState).data().toString() == "ended: replaced by v3");
    CHECK_FALSE(deployments->index(2, DeploymentTableModel::ColTo).data().toString().isEmpty());
    auto* alerts = dash.alertModel();
    REQUIRE(alerts->rowCount() == 1);
    CHECK(alerts->index(0, AlertTableModel::ColRule).data().toString() == "p99_latency");
    CHECK(alerts->index(0, AlertTableModel::ColMessage).data().toString().contains("150 ms"));
    CHECK(alerts->index(0, AlertTableModel::ColResolved).data().toString() != "firing");
    CHECK(alerts->firingCount() == 0);

    // The last minute's batches per bucket.
    const auto hist = dash.batchHistogram();
    REQUIRE(hist.size() == 5);
    CHECK(hist[0].first == "1");
    CHECK(hist[2].first == "3–4");
    CHECK(hist[4].first == ">8");
    CHECK(hist[0].second == Approx(2.0 * RegistryFixture::kSeconds));
    CHECK(hist[2].second == Approx(5.0 * RegistryFixture::kSeconds));
    CHECK(hist[4].second == Approx(0.0));
    CHECK(dash.batchBars()->data()->size() == 5);

    const QString summary = chart->summaryText();
    CHECK(summary.contains(QStringLiteral("v2 live · %1").arg(RegistryFixture::kUrl)));
    CHECK(summary.contains("P99"));
    CHECK(summary.contains("QPS"));
    CHECK(dash.lastValue("rss_mb") == Approx(210));

    // Hover over the v3 marker names it.
    chart->plot()->replot(QCustomPlot::rpImmediateRefresh);
    const QString hover =
        chart->hoverAt(QPointF(x0->coordToPixel(fx.t0 + 30), chart->latencyRect()->rect().center().y()));
    CHECK(hover.contains("v3 deploy"));

    const QString png = outputPath("serving_dashboard.png");
    dash.grab().save(png);
    CHECK(QImage(png).width() == 1300);
    REQUIRE(chart->savePng(outputPath("serving_chart.png"), 1000, 600));

    // Incremental: the next poll reads only what was appended since.
    fx.appendSeconds(RegistryFixture::kSeconds, 5);
    const int before = polled.count();
    dash.pollNow();
    REQUIRE(waitUntil([&] { return polled.count() > before; }, 5000));
    CHECK(polled.last().at(0).toInt() == 5 * 8);
    chart->flushStaged();
    CHECK(chart->pointCount(Series::P99) == RegistryFixture::kSeconds + 5);
    CHECK(chart->pointCount(Series::P50) == RegistryFixture::kSeconds + 5);
    CHECK(chart->pointCount(Series::ErrorRate) == RegistryFixture::kSeconds + 5);
    CHECK(dash.lastValue("p99_ms") == Approx(12.5));
    // A quiet poll adds nothing.
    const int again = polled.count();
    dash.pollNow();
    REQUIRE(waitUntil([&] { return polled.count() > again; }, 5000));
    CHECK(polled.last().at(0).toInt() == 0);
    CHECK(chart->pointCount(Series::P99) == RegistryFixture::kSeconds + 5);

    // A firing alert is shaded and counted.
    fx.registry->fireAlert("digits", "error_rate", "error rate up 6 points in 5 minutes", 0.06, fx.t0 + 84);
    const int fired = polled.count();
    dash.pollNow();
    REQUIRE(waitUntil([&] { return polled.count() > fired; }, 5000));
    CHECK(chart->alertSpanCount() == 2);
    CHECK(alerts->firingCount() == 1);
    CHECK(chart->summaryText().contains("1 alert firing"));

    // Another model: nothing of digits is left.
    dash.showModel(fx.registry, "spirals");
    REQUIRE(waitUntil([&] { return dash.pollCount() > fired + 1 && !dash.isPolling(); }, 5000));
    CHECK(chart->pointCount(Series::P99) == 0);
    CHECK(chart->markerCount() == 0);
    CHECK(chart->alertSpanCount() == 0);
    CHECK(deployments->rowCount() == 0);
    CHECK(chart->placeholderText().contains("spirals has not been deployed"));
}

TEST_CASE("ModelsView: Deploy and Roll back ask first and change nothing when the answer is no",
          "[widgets][models]") {
    RegistryFixture fx;
    ModelsView view;
    view.resize(1400, 900);
    view.show();
    QAbstractItemModelTester tester(view.listModel(), QAbstractItemModelTester::FailureReportingMode::Fatal);
    QStringList asked;
    bool answer = false;
    view.setConfirmHook([&](const QString&, const QString& question) {
        asked << question;
        return answer;
    });
    QSignalSpy refreshed(&view, &ModelsView::refreshed);
    QSignalSpy deployRequested(&view, &ModelsView::deployRequested);
    QSignalSpy rollbackRequested(&view, &ModelsView::rollbackRequested);

    view.setRegistry(fx.registry);
    REQUIRE(waitUntil([&] { return refreshed.count() >= 1; }, 5000));
    CHECK(view.listModel()->modelCount() == 2);
    // The first read selects where one left off: the live version.
    CHECK(view.selectedModel() == "digits");
    CHECK(view.selectedVersion() == 2);
    CHECK(view.tree()->isExpanded(view.listModel()->indexOf("digits")));
    REQUIRE(waitUntil([&] { return view.dashboard()->pollCount() >= 1; }, 5000));
    CHECK(view.dashboard()->model() == "digits");
    CHECK(view.dashboard()->chart()->markerCount() == 3);

    view.selectModel("digits", 3);
    CHECK(view.selectedVersion() == 3);
    CHECK(view.deployButton()->isEnabled());
    CHECK(view.rollbackButton()->isEnabled());
    const QString deployText =
        QStringLiteral("Deploy digits v3 to %1, replacing v2?").arg(RegistryFixture::kUrl);
    CHECK(view.deployQuestion("digits", 3) == deployText);
    CHECK(view.rollbackQuestion("digits") == "Roll back digits from v2 to v3?");
    CHECK(view.deployQuestion("spirals", 1) ==
          "Deploy spirals v1 to a new local server at http://127.0.0.1:8500 (or the next free port)?");

    const auto historyBefore = fx.registry->deployments("digits");
    QTest::mouseClick(view.deployButton(), Qt::LeftButton);
    REQUIRE(asked.size() == 1);
    CHECK(asked.front() == deployText);
    QTest::mouseClick(view.rollbackButton(), Qt::LeftButton);
    REQUIRE(asked.size() == 2);
    CHECK(asked.back() == "Roll back digits from v2 to v3?");
    CHECK(deployRequested.count() == 0);
    CHECK(rollbackRequested.count() == 0);
    CHECK(view.statusText().contains("cancelled"));
    // Nothing changed in the registry.
    const auto historyAfter = fx.registry->deployments("digits");
    REQUIRE(historyAfter.size() == historyBefore.size());
    CHECK(historyAfter.front().id == historyBefore.front().id);
    CHECK(fx.registry->liveDeployment("digits")->version == 2);

    view.grab().save(outputPath("models_view.png"));

    // "Yes" emits exactly the request the question named.
    answer = true;
    QTest::mouseClick(view.deployButton(), Qt::LeftButton);
    REQUIRE(deployRequested.count() == 1);
    CHECK(deployRequested.at(0).at(0).toString() == "digits");
    CHECK(deployRequested.at(0).at(1).toLongLong() == 3);
    QTest::mouseClick(view.rollbackButton(), Qt::LeftButton);
    REQUIRE(rollbackRequested.count() == 1);
    CHECK(rollbackRequested.at(0).at(1).toLongLong() == 2);
    CHECK(rollbackRequested.at(0).at(2).toLongLong() == 3);

    // While a deployment runs nothing else can be started.
    view.setBusy(true, "Deploying digits…");
    CHECK_FALSE(view.deployButton()->isEnabled());
    CHECK_FALSE(view.rollbackButton()->isEnabled());
    CHECK(view.statusText() == "Deploying digits…");
    view.setBusy(false);

    // A model row has no version to deploy; a model never deployed has nothing to roll back.
    view.selectModel("digits");
    CHECK_FALSE(view.deployButton()->isEnabled());
    CHECK(view.rollbackButton()->isEnabled());
    view.selectModel("spirals", 1);
    CHECK(view.deployButton()->isEnabled());
    CHECK_FALSE(view.rollbackButton()->isEnabled());
    CHECK(view.rollbackButton()->toolTip().contains("no live deployment"));
    REQUIRE(waitUntil(
        [&] { return view.dashboard()->model() == "spirals" && !view.dashboard()->isPolling(); }, 5000));

    // A deployment made elsewhere (lathectl) shows up on the next refresh, selection kept.
    lathe::core::Deployment d;
    d.model = "spirals";
    d.version = 1;
    d.url = "http://127.0.0.1:8501";
    fx.registry->recordDeployment(d);
    const int n = refreshed.count();
    view.refresh();
    REQUIRE(waitUntil([&] { return refreshed.count() > n; }, 5000));
    CHECK(view.selectedModel() == "spirals");
    CHECK(view.selectedVersion() == 1);
    CHECK(view.listModel()->index(1, ModelListModel::ColStatus).data().toString() == "v1 live");
    CHECK(view.deployQuestion("spirals", 1) ==
          "Deploy spirals v1 to http://127.0.0.1:8501 again? It is already the live version.");
}

TEST_CASE("ModelsView: a new server's host is chosen beside Deploy, and a live model stays where it runs",
          "[widgets][models]") {
    RegistryFixture fx;
    ModelsView view;
    view.resize(1400, 900);
    view.show();
    QSignalSpy refreshed(&view, &ModelsView::refreshed);
    view.setRegistry(fx.registry);
    REQUIRE(waitUntil([&] { return refreshed.count() >= 1; }, 5000));
    view.setTargetHosts({"gpu-a", "gpu-b"});
    REQUIRE(view.targetBox()->count() == 3);
    CHECK(view.targetBox()->itemText(0) == "This machine");

    // spirals is not live: the chosen host is where its server starts, and the question says so.
    view.selectModel("spirals", 1);
    CHECK(view.targetBox()->isEnabled());
    CHECK(view.deployHost().isEmpty());
    view.targetBox()->setCurrentIndex(view.targetBox()->findData(QStringLiteral("gpu-b")));
    CHECK(view.deployHost() == "gpu-b");
    CHECK(view.deployQuestion("spirals", 1) ==
          "Deploy spirals v1 to host gpu-b? The model is copied there and a new server started on it.");
    CHECK(view.deployButton()->toolTip() == view.deployQuestion("spirals", 1));

    // The inventory changes: the choice stays while its host does, else back to this machine.
    view.setTargetHosts({"gpu-b", "gpu-c"});
    CHECK(view.deployHost() == "gpu-b");
    view.setTargetHosts({"gpu-c"});
    CHECK(view.deployHost().isEmpty());

    // digits is live here: a deploy hot-swaps it where it runs; the box shows that place, greyed.
    view.targetBox()->setCurrentIndex(1);
    CHECK(view.deployHost() == "gpu-c");
    view.selectModel("digits", 3);
    CHECK_FALSE(view.targetBox()->isEnabled());
    CHECK(view.targetBox()->currentIndex() == 0);
    CHECK(view.targetBox()->toolTip().contains("hot-swaps it there"));
    CHECK(view.deployHost().isEmpty());
    // Back on spirals, the choice made for it is still there.
    view.selectModel("spirals", 1);
    CHECK(view.targetBox()->isEnabled());
    CHECK(view.deployHost() == "gpu-c");

    // A model live on a host shows that host, in the box and beside its URL.
    lathe::core::Deployment d;
    d.model = "spirals";
    d.version = 1;
    d.target = "ssh:gpu-c";
    d.url = "http://10.0.0.7:8500";
    fx.registry->recordDeployment(d);
    const int n = refreshed.count();
    view.refresh();
    REQUIRE(waitUntil([&] { return refreshed.count() > n; }, 5000));
    view.selectModel("spirals", 1);
    CHECK_FALSE(view.targetBox()->isEnabled());
    CHECK(view.targetBox()->currentText() == "host gpu-c");
    CHECK(view.deployHost().isEmpty());
    const auto row = view.listModel()->indexOf("spirals", 1);
    CHECK(cell(*view.listModel(), row, 1).contains("http://10.0.0.7:8500 on gpu-c"));
    view.grab().save(outputPath("models_view_target.png"));
}

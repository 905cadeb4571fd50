#include <catch2/catch.hpp>

#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QTemporaryDir>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "lathe/core/profile_analysis.h"
#include "lathe/core/store.h"
#include "lathe/widgets/profile_timeline.h"
#include "lathe/widgets/profile_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/step_phase_chart.h"
#include "lathe/widgets/top_ops_model.h"
#include "profile_fixture.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::ProfileTimeline;
using lathe::widgets::ProfileView;
using lathe::widgets::TimelineLayout;
using lathe::widgets::TopOpsModel;

TEST_CASE("TimelineLayout puts phases above ops and nests ops by depth", "[widgets][profile]") {
    const auto spans = lathe::test::syntheticSpans(1, 3, 2);
    const auto layout = TimelineLayout::build(spans);
    REQUIRE(layout->spans.size() == spans.size());
    // Thread 0: phases, ops depth 0..1; thread 1: phases, ops depth 0..1 (copy_ inside to).
    REQUIRE(layout->rows.size() == 6);
    CHECK(layout->rows[0].thread == 0);
    CHECK(layout->rows[0].phases);
    CHECK_FALSE(layout->rows[1].phases);
    CHECK(layout->rows[1].depth == 0);
    CHECK(layout->rows[2].depth == 1);
    CHECK(layout->rows[3].thread == 1);
    CHECK(layout->rows[3].phases);
    size_t total = 0;
    for (const auto& row : layout->rows) {
        total += row.spans.size();
        // Spans of a row never overlap, ordered by start: what culling relies on.
        for (size_t i = 1; i < row.spans.size(); ++i) {
            const auto& a = layout->spans[row.spans[i - 1]];
            const auto& b = layout->spans[row.spans[i]];
            CHECK(a.startNs + a.durationNs <= b.startNs);
        }
        for (uint32_t i : row.spans)
            CHECK((layout->spans[i].kind == lathe::core::ProfileSpan::Kind::Phase) == row.phases);
    }
    CHECK(total == spans.size());
    REQUIRE(layout->steps.size() == 3);
    CHECK(layout->steps[0].step == 1);
    CHECK(layout->startNs == 0);
}

TEST_CASE("ProfileTimeline culls and merges 100k spans and hovers the span under the mouse",
          "[widgets][profile]") {
    // ~110 spans per step: 900 steps is about 100k.
    const auto layout = TimelineLayout::build(lathe::test::syntheticSpans(1, 900, 6));
    REQUIRE(layout->spans.size() > 95000);
    ProfileTimeline timeline;
    timeline.resize(1200, 360);
    timeline.setLayoutData(layout);
    timeline.show();
    QTest::qWait(20);
    timeline.grab();
    auto stats = timeline.lastPaintStats();
    // Full view: every span is accounted for but drawn as at most one rect per pixel column.
    CHECK(stats.visibleSpans == int(layout->spans.size()));
    CHECK(stats.rects <= timeline.plotArea().width() * int(layout->rows.size()) + 100);
    CHECK(stats.rects < int(layout->spans.size()) / 10);

    // Zoomed into two steps: only those spans are visited, each wide enough to be its own rect.
    const double s0 = double(layout->steps[10].startNs), s1 = double(layout->steps[12].startNs);
    timeline.setViewRange(s0, s1);
    timeline.grab();
    stats = timeline.lastPaintStats();
    CHECK(stats.visibleSpans > 150);
    CHECK(stats.visibleSpans < 400);
    CHECK(stats.labels > 10);

    // Hover: the span under a point is found and described.
    const auto& row = layout->rows[1];  // thread 0 ops, depth 0
    const auto& target = *std::find_if(row.spans.begin(), row.spans.end(), [&](uint32_t i) {
        return layout->spans[i].startNs >= s0 && layout->spans[i].name == "aten::linear";
    });
    const auto& span = layout->spans[target];
    const double x = timeline.timeToX(double(span.startNs) + span.durationNs / 2.0);
    const double y = timeline.rowTop(1) + timeline.rowHeight(row) / 2.0;
    CHECK(timeline.spanAt(QPointF(x, y)) == int(target));
    const QString text = timeline.hoverAt(QPointF(x, y));
    CHECK(text.contains("aten::linear"));
    CHECK(text.contains("shapes [64, 128], [128, 128], [128]"));
    CHECK(text.contains(QStringLiteral("step %1").arg(span.step)));
    CHECK(text.contains("26.0 µs"));

    // Wheel zoom around the cursor keeps the time under it fixed.
    const double before = timeline.xToTime(x);
    timeline.zoom(0.5, x);
    CHECK(timeline.xToTime(x) == Approx(before).epsilon(1e-9));
    CHECK(timeline.viewEnd() - timeline.viewStart() == Approx((s1 - s0) * 0.5));
    timeline.fitAll();
    CHECK(timeline.viewStart() < double(layout->startNs));
}

TEST_CASE("ProfileView loads off the GUI thread: timeline, sortable top ops, phase stacks",
          "[widgets][profile]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const auto rec = lathe::test::recordAmpRun(store);
    const int64_t plain = store.createRun("default", "not-profiled", "mlp", "digits", "", {}, "localhost");
    store.flush();
    REQUIRE(store.profileSpanCount(rec.runId) == int64_t(rec.spanCount));

    ProfileView view;
    view.resize(1300, 820);
    view.show();
    QAbstractItemModelTester tester(view.opsModel(), QAbstractItemModelTester::FailureReportingMode::Fatal);
    QSignalSpy loaded(&view, &ProfileView::loaded);
    CHECK(view.isPlaceholderShown());

    view.showRun(store, rec.runId);
    CHECK(view.isLoading());
    REQUIRE(waitUntil([&] { return loaded.count() == 1; }, 10000));
    CHECK(loaded.at(0).at(0).toLongLong() == rec.runId);
    CHECK(loaded.at(0).at(1).toInt() == int(rec.spanCount));
    CHECK_FALSE(view.isPlaceholderShown());
    CHECK(view.spanCount() == int(rec.spanCount));

    // The table is core::topOps, row for row.
    const auto spans = store.profileSpans(rec.runId);
    const auto ops = lathe::core::topOps(spans);
    auto* model = view.opsModel();
    REQUIRE(model->rowCount() == int(ops.size()));
    for (int r = 0; r < model->rowCount(); ++r) {
        const auto& op = ops[size_t(r)];
        CHECK(model->index(r, TopOpsModel::ColName).data().toString().toStdString() == op.name);
        CHECK(model->index(r, TopOpsModel::ColCalls).data().toLongLong() == op.calls);
        CHECK(model->index(r, TopOpsModel::ColSelfMs).data(TopOpsModel::SortRole).toLongLong() == op.selfNs);
        CHECK(model->index(r, TopOpsModel::ColTotalMs).data(TopOpsModel::SortRole).toLongLong() ==
              op.totalNs);
        CHECK(model->index(r, TopOpsModel::ColShare).data().toString() ==
              QString::number(op.share * 100.0, 'f', 1));
        CHECK(model->index(r, TopOpsModel::ColCudaSelfMs).data().toString() ==
              QStringLiteral("–"));  // a CPU run
    }
    // Device-time columns only for runs measured on a GPU.
    auto* table = view.findChild<QTableView*>(QStringLiteral("topOpsTable"));
    REQUIRE(table);
    CHECK(table->isColumnHidden(TopOpsModel::ColCudaSelfMs));
    CHECK(table->isColumnHidden(TopOpsModel::ColCudaTotalMs));
    TopOpsModel gpu;
    lathe::core::OpSummary mm;
    mm.name = "aten::addmm";
    mm.calls = 2;
    mm.cudaSelfNs = 1500000;
    mm.cudaTotalNs = 2000000;
    gpu.setOps({mm});
    CHECK(gpu.hasDeviceTimes());
    CHECK(gpu.index(0, TopOpsModel::ColCudaSelfMs).data().toString() == QStringLiteral("1.500"));
    CHECK(gpu.index(0, TopOpsModel::ColCudaTotalMs).data(TopOpsModel::SortRole).toLongLong() == 2000000);
    // Sorted by self time (descending) by default; clicking headers re-sorts.
    auto* proxy = view.opsProxy();
    auto column = [&](int col) {
        std::vector<double> v;
        for (int r = 0; r < proxy->rowCount(); ++r)
            v.push_back(proxy->index(r, col).data(TopOpsModel::SortRole).toDouble());
        return v;
    };
    auto self = column(TopOpsModel::ColSelfMs);
    CHECK(std::is_sorted(self.rbegin(), self.rend()));
    view.opsTable()->sortByColumn(TopOpsModel::ColCalls, Qt::AscendingOrder);
    auto calls = column(TopOpsModel::ColCalls);
    CHECK(std::is_sorted(calls.begin(), calls.end()));
    view.opsTable()->sortByColumn(TopOpsModel::ColName, Qt::AscendingOrder);
    CHECK(proxy->index(0, TopOpsModel::ColName).data().toString() == "AddmmBackward0");
    view.opsTable()->sortByColumn(TopOpsModel::ColSelfMs, Qt::DescendingOrder);

    // One stack per profiled step, one layer per phase.
    auto* phases = view.phaseChart();
    CHECK(phases->stepCount() == int(rec.profiledSteps));
    CHECK(phases->phaseNames() == QStringList({"data", "forward", "backward", "optimizer"}));
    std::set<double> keys;
    for (const QString& name : phases->phaseNames()) {
        QCPBars* bars = phases->bars(name.toStdString());
        REQUIRE(bars != nullptr);
        CHECK(bars->data()->size() == int(rec.profiledSteps));
        for (auto it = bars->data()->constBegin(); it != bars->data()->constEnd(); ++it) keys.insert(it->key);
    }
    CHECK(keys.size() == size_t(rec.profiledSteps));
    CHECK(phases->bars("forward")->barBelow() == phases->bars("data"));
    CHECK(phases->bars("optimizer")->barAbove() == nullptr);

    // Zoom the timeline to three steps for a readable screenshot.
    const auto* layout = view.timeline()->layoutData();
    REQUIRE(layout->steps.size() == size_t(rec.profiledSteps));
    view.timeline()->setViewRange(double(layout->steps[3].startNs) - 5000,
                                  double(layout->steps[5].startNs) - 2000);
    QTest::qWait(60);
    REQUIRE(view.grab().save(outputPath("profile_view.png")));
    view.timeline()->fitAll();
    QTest::qWait(30);
    REQUIRE(view.grab().save(outputPath("profile_view_full.png")));

    const QString trace = outputPath("profile_trace.json");
    QFile::remove(trace);
    REQUIRE(view.exportChromeTrace(trace));
    CHECK(QFileInfo(trace).size() > 1000);

    // A run without spans: a clear placeholder, not an empty timeline.
    loaded.clear();
    view.showRun(store, plain);
    REQUIRE(waitUntil([&] { return loaded.count() == 1; }, 10000));
    CHECK(view.isPlaceholderShown());
    CHECK(view.placeholderText().contains(QStringLiteral("run %1 was not profiled").arg(plain)));
    CHECK(view.placeholderText().contains("Profile on"));
    CHECK(model->rowCount() == 0);
    view.grab().save(outputPath("profile_view_placeholder.png"));

    // Stale loads are dropped: only the last selection is applied.
    loaded.clear();
    const int loadsBefore = view.loadCount();
    view.showRun(store, rec.runId);
    view.showRun(store, plain);
    view.showRun(store, rec.runId);
    REQUIRE(waitUntil([&] { return loaded.count() >= 1 && !view.isLoading(); }, 10000));
    QTest::qWait(200);
    CHECK(loaded.count() == 1);
    CHECK(view.loadCount() == loadsBefore + 1);
    CHECK(loaded.at(0).at(0).toLongLong() == rec.runId);
    CHECK(view.spanCount() == int(rec.spanCount));

    view.clear();
    CHECK(view.isPlaceholderShown());
    CHECK(view.runId() == 0);
}

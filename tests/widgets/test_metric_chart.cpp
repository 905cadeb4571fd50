#include <catch2/catch.hpp>

#include <QApplication>
#include <QFileInfo>
#include <QImage>
#include <QMouseEvent>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <cmath>

#include "lathe/core/store.h"
#include "lathe/widgets/dashboard.h"
#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::Dashboard;
using lathe::widgets::MetricChart;

namespace {
double lossAt(int i, double offset) { return offset + 2.0 * std::exp(-i / 300.0) + 0.05 * std::sin(i * 0.7); }
}  // namespace

TEST_CASE("MetricChart coalesces many appends into one flush and replot", "[widgets][chart]") {
    MetricChart chart(QStringLiteral("loss"), {QStringLiteral("train/loss"), QStringLiteral("val/loss")});
    chart.resize(900, 420);
    chart.show();
    QTest::qWait(50);  // let the first paint happen before counting replots
    CHECK(chart.plot()->interactions().testFlag(QCP::iRangeDrag));
    CHECK(chart.plot()->interactions().testFlag(QCP::iRangeZoom));
    const int replotsBefore = chart.replotCount();

    QSignalSpy flushed(&chart, &MetricChart::flushed);
    for (int i = 0; i < 1000; ++i) chart.appendPoint(1, "train/loss", i * 10, lossAt(i, 0.0));
    for (int i = 0; i < 1000; ++i) chart.appendPoint(2, "train/loss", i * 10, lossAt(i, 0.6));
    for (int e = 1; e <= 10; ++e) chart.appendPoint(1, "val/loss", e * 1000, lossAt(e * 100, 0.1));

    // Nothing reaches the graphs until the timer fires.
    CHECK(chart.pointCount(1, "train/loss") == 0);
    CHECK(chart.stagedCount() == 2010);
    CHECK(chart.replotCount() == replotsBefore);

    REQUIRE(waitUntil([&] { return chart.pointCount(1, "train/loss") == 1000; }, 2000));
    QTest::qWait(chart.flushInterval() * 3);
    CHECK(flushed.count() == 1);
    CHECK(flushed.at(0).at(0).toInt() == 2010);
    CHECK(chart.flushCount() == 1);
    CHECK(chart.stagedCount() == 0);
    CHECK(chart.pointCount(2, "train/loss") == 1000);
    CHECK(chart.pointCount(1, "val/loss") == 10);
    CHECK(chart.graphCount() == 3);
    // One queued replot for 2010 samples (a hover or resize could add one more).
    CHECK(chart.replotCount() - replotsBefore >= 1);
    CHECK(chart.replotCount() - replotsBefore <= 2);
    CHECK(chart.lastStep(1, "train/loss") == 9990);

    // Hover: the nearest point of the nearest curve, by direct call and by a real mouse event.
    const QPointF p = chart.pixelFor(5000, lossAt(500, 0.0));
    const QString text = chart.hoverAt(p + QPointF(2, 1));
    CHECK(text.contains(QStringLiteral("run 1 · train/loss")));
    // Neighbouring points are about a pixel apart: any of them is "nearest" at screen precision.
    const auto m = QRegularExpression(QStringLiteral("step (\\d+)")).match(text);
    REQUIRE(m.hasMatch());
    CHECK(std::abs(m.captured(1).toInt() - 5000) <= 100);
    chart.hoverAt(QPointF(-100, -100));
    CHECK(chart.hoverText().isEmpty());
    const QPointF q = chart.pixelFor(3000, lossAt(300, 0.6));
    QMouseEvent move(QEvent::MouseMove, q, chart.plot()->mapToGlobal(q), Qt::NoButton, Qt::NoButton,
                     Qt::NoModifier);
    QApplication::sendEvent(chart.plot(), &move);
    CHECK(chart.hoverText().contains(QStringLiteral("run 2 · train/loss")));
    QTest::qWait(50);
    chart.grab().save(outputPath("metric_chart_hover.png"));

    // Export.
    const QString png = outputPath("metric_chart.png");
    const QString pdf = outputPath("metric_chart.pdf");
    QFile::remove(png);
    QFile::remove(pdf);
    REQUIRE(chart.savePng(png, 1000, 500));
    QImage image(png);
    CHECK(image.width() == 1000);
    CHECK(image.height() == 500);
    REQUIRE(chart.savePdf(pdf));
    CHECK(QFileInfo(pdf).size() > 1000);

    // Removing a run and clearing.
    chart.removeRun(2);
    CHECK(chart.graphCount() == 2);
    CHECK(chart.pointCount(2, "train/loss") == 0);
    chart.clear();
    CHECK(chart.graphCount() == 0);
}

TEST_CASE("Dashboard merges store history with live points by step", "[widgets][dashboard]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const int64_t a = store.createRun("default", "a", "mlp", "digits", "", {}, "localhost");
    const int64_t b = store.createRun("default", "b", "mlp", "digits", "", {}, "localhost");
    for (int i = 0; i < 100; ++i) {
        store.appendMetric(a, "train/loss", i, 0, lossAt(i * 10, 0));
        store.appendMetric(b, "train/loss", i, 0, lossAt(i * 10, 0.3));
    }
    for (int e = 1; e <= 4; ++e) {
        store.appendMetric(a, "val/loss", e * 25, 0, lossAt(e * 250, 0.1));
        store.appendMetric(a, "val/accuracy", e * 25, 0, 0.5 + 0.1 * e);
        store.appendMetric(a, "train/lr", e * 25, 0, 0.001);
    }
    store.flush();

    Dashboard dash;
    dash.resize(900, 700);
    dash.show();
    dash.showRuns(store, {a, b});
    CHECK(dash.lossChart()->pointCount(a, "train/loss") == 100);
    CHECK(dash.lossChart()->pointCount(b, "train/loss") == 100);
    CHECK(dash.lossChart()->pointCount(a, "val/loss") == 4);
    CHECK(dash.accuracyChart()->pointCount(a, "val/accuracy") == 4);
    CHECK(dash.chartFor("train/lr") == nullptr);

    // Live points overlapping the history (steps 50..149) only add the new ones.
    std::vector<lathe::core::Event> events;
    for (int i = 50; i < 150; ++i)
        events.push_back(lathe::core::Event::metric("train/loss", i, lossAt(i * 10, 0)));
    events.push_back(lathe::core::Event::log("info", "ignored"));
    dash.onEvents(a, events);
    REQUIRE(waitUntil([&] { return dash.lossChart()->pointCount(a, "train/loss") == 150; }, 2000));

    dash.onEvent(b, lathe::core::Event::metric("train/loss", 100, 0.5));
    REQUIRE(waitUntil([&] { return dash.lossChart()->pointCount(b, "train/loss") == 101; }, 2000));
    dash.showRuns(store, {a});
    CHECK(dash.shownRuns() == std::vector<int64_t>{a});
    CHECK(dash.lossChart()->pointCount(b, "train/loss") == 0);
    CHECK(dash.lossChart()->pointCount(a, "train/loss") == 150);  // 100 stored + 50 live only

    // Live points of a run that is not shown are kept and appear when it is selected.
    dash.onEvent(b, lathe::core::Event::metric("train/loss", 101, 0.45));
    QTest::qWait(100);
    CHECK(dash.lossChart()->pointCount(b, "train/loss") == 0);
    dash.showRuns(store, {a, b});
    CHECK(dash.lossChart()->pointCount(b, "train/loss") == 102);

    const QString png = outputPath("dashboard_export.png");
    REQUIRE(dash.exportCharts(png, 1000, 800));
    CHECK(QImage(png).height() == 800);
    REQUIRE(dash.exportCharts(outputPath("dashboard_export.pdf")));
}

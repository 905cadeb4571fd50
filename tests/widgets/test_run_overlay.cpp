#include <catch2/catch.hpp>

#include <QApplication>
#include <QImage>
#include <QTemporaryDir>

#include <atomic>
#include <cmath>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "lathe/widgets/dashboard.h"
#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/run_overlay.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::Dashboard;
using lathe::widgets::OverlayCurve;
using lathe::widgets::OverlayData;
using lathe::widgets::OverlayFrame;

namespace {

OverlayCurve curve(std::vector<float> x, std::vector<float> y, int style = 0) {
    OverlayCurve c;
    c.runId = 1;
    c.key = "train/loss";
    c.style = style;
    c.x = std::move(x);
    c.y = std::move(y);
    return c;
}

bool painted(const QImage& image, int col, int row) { return qAlpha(image.pixel(col, row)) > 0; }

int paintedInColumn(const QImage& image, int col) {
    int n = 0;
    for (int r = 0; r < image.height(); ++r) n += painted(image, col, r);
    return n;
}

}  // namespace

TEST_CASE("renderOverlay draws each curve's pixel columns, joined, and breaks at gaps",
          "[widgets][overlay]") {
    OverlayFrame frame;
    frame.x = QCPRange(0, 100);
    frame.y = QCPRange(0, 1);
    frame.size = QSize(100, 11);
    const std::vector<QRgb> red{qRgb(255, 0, 0)};

    // A level line at 0.5, one point per column: row 5 (0.5 of 11 rows from the top) everywhere.
    std::vector<float> x, level;
    for (int i = 0; i <= 100; ++i) x.push_back(float(i)), level.push_back(0.5f);
    OverlayData d;
    d.curves.push_back(curve(x, level));
    d.finish();
    CHECK(d.points == 101);
    CHECK(d.yMin == 0.5);
    QImage image = lathe::widgets::renderOverlay(d, red, frame);
    REQUIRE(image.size() == frame.size);
    for (int c = 0; c < 100; ++c) {
        INFO("column " << c);
        CHECK(painted(image, c, 5));
        CHECK(paintedInColumn(image, c) == 1);
    }
    CHECK(qRed(image.pixel(50, 5)) > 0);
    CHECK(qBlue(image.pixel(50, 5)) == 0);

    // Dotted (a validation key): four columns on, four off.
    d.curves[0].style = 1;
    image = lathe::widgets::renderOverlay(d, red, frame);
    CHECK(painted(image, 0, 5));
    CHECK(painted(image, 3, 5));
    CHECK_FALSE(painted(image, 4, 5));
    CHECK_FALSE(painted(image, 7, 5));
    CHECK(painted(image, 8, 5));

    // Two points far apart: the line between them covers every column in between, and a steep
    // segment fills its column from top to bottom.
    d.curves = {curve({0.f, 100.f}, {0.f, 1.f}), curve({20.f, 21.f}, {0.f, 1.f})};
    d.finish();
    image = lathe::widgets::renderOverlay(d, {qRgb(0, 0, 255), qRgb(0, 0, 255)}, frame);
    for (int c = 0; c < 100; ++c) CHECK(paintedInColumn(image, c) >= 1);
    CHECK(paintedInColumn(image, 20) == 11);

    // A missing value breaks the line: nothing is drawn in its column.
    std::vector<float> gap = level;
    gap[50] = std::nanf("");
    d.curves = {curve(x, gap)};
    d.finish();
    image = lathe::widgets::renderOverlay(d, red, frame);
    CHECK(painted(image, 49, 5));
    CHECK_FALSE(painted(image, 50, 5));
    CHECK(painted(image, 51, 5));

    // Zoomed in, the points outside still draw the lines into the view.
    frame.x = QCPRange(40.5, 60.5);
    d.curves = {curve({0.f, 100.f}, {0.5f, 0.5f})};
    image = lathe::widgets::renderOverlay(d, red, frame);
    for (int c = 0; c < 100; ++c) CHECK(painted(image, c, 5));

    // More curves are fainter each; a cancelled render gives no image.
    CHECK(lathe::widgets::overlayAlpha(1) > lathe::widgets::overlayAlpha(1000));
    CHECK(lathe::widgets::overlayAlpha(1000) > 0);
    std::atomic<bool> cancelled{true};
    CHECK(lathe::widgets::renderOverlay(d, red, frame, &cancelled).isNull());
}

TEST_CASE("Selecting more than a dozen runs overlays them, loaded and drawn off the GUI thread",
          "[widgets][dashboard][overlay]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    std::vector<int64_t> runs;
    for (int r = 0; r < 30; ++r) {
        const double lr = std::pow(10.0, -4.0 + 3.0 * r / 29.0);
        const int64_t id = store.createRun(
            "default", "r" + std::to_string(r), "mlp", "digits", "",
            {{"lr", std::to_string(lr)}, {"batch", r % 2 ? "64" : "128"}, {"seed", "1"}}, "localhost");
        runs.push_back(id);
        for (int i = 0; i < 200; ++i) {
            store.appendMetric(id, "train/loss", i, 0, 0.1 + 2.0 * std::exp(-i * lr * 10));
            store.appendMetric(id, "train/accuracy", i, 0, 0.9 - 0.8 * std::exp(-i * lr * 10));
            if (i % 20 == 19) store.appendMetric(id, "val/loss", i, 0, 0.2 + 2.0 * std::exp(-i * lr * 10));
        }
    }
    store.flush();

    Dashboard dash;
    dash.resize(1000, 800);
    dash.show();
    QTest::qWait(20);

    // The first run trains in this session: it stays a graph on top of the overlay.
    dash.onEvent(runs[0], lathe::core::Event::metric("train/loss", 200, 0.1));
    dash.showRuns(store, runs);
    CHECK(dash.overlayLoading());  // asynchronous: showRuns returned before the points were read
    CHECK(dash.lossChart()->pointCount(runs[0], "train/loss") == 201);
    REQUIRE(waitUntil(
        [&] {
            return !dash.overlayLoading() && dash.lossChart()->hasOverlay() &&
                   dash.lossChart()->overlayCurrent() && dash.accuracyChart()->overlayCurrent();
        },
        10000));
    const OverlayData* loss = dash.lossChart()->overlayData();
    REQUIRE(loss);
    CHECK(loss->curves.size() == 29 * 2);  // train/loss and val/loss of every run but the live one
    CHECK(loss->points == 29 * 210);
    CHECK(dash.accuracyChart()->overlayData()->curves.size() == 29);
    CHECK(dash.lossChart()->graphCount() == 2);  // the live run's train and val loss
    CHECK(dash.lossChart()->overlayRenderCount() >= 1);
    CHECK(dash.shownRuns().size() == 30);

    // Colour by a parameter: only those that differ between runs are offered.
    const QStringList keys = dash.overlayColorKeys();
    CHECK(keys.contains(QStringLiteral("lr")));
    CHECK(keys.contains(QStringLiteral("batch")));
    CHECK_FALSE(keys.contains(QStringLiteral("seed")));
    CHECK_FALSE(dash.setOverlayColorKey(QStringLiteral("nope")));
    REQUIRE(dash.setOverlayColorKey(QStringLiteral("lr")));
    REQUIRE(waitUntil([&] { return dash.lossChart()->overlayCurrent(); }, 10000));
    const QString note = dash.lossChart()->headerNote();
    INFO(note.toStdString());
    CHECK(note.contains(QStringLiteral("29 runs overlaid")));
    CHECK(note.contains(QStringLiteral("lr")));
    CHECK(note.contains(QStringLiteral("log scale")));

    // The picture: something drawn inside the axis rect, and saved for a look.
    const QImage shot = dash.grab().toImage();
    shot.save(outputPath("dashboard_overlay.png"));
    const QPixmap plot = dash.lossChart()->plot()->toPixmap();
    CHECK_FALSE(plot.isNull());

    // Hovering a point of an overlaid run names it.
    const auto& c = loss->curves[10];
    const QPointF at = dash.lossChart()->pixelFor(c.x[50], c.y[50]);
    const QString hover = dash.lossChart()->hoverAt(at);
    INFO(hover.toStdString());
    CHECK(hover.startsWith(QStringLiteral("run ")));  // an overlaid run, not the live graph
    CHECK_FALSE(hover.startsWith(QStringLiteral("run %1 ").arg(runs[0])));

    // Refitting the axes to where they are (as every live flush does) draws no new image.
    {
        const int before = dash.lossChart()->overlayRenderCount();
        for (int i = 0; i < 3; ++i) {
            dash.lossChart()->rescale();
            QTest::qWait(80);
        }
        CHECK(dash.lossChart()->overlayCurrent());
        CHECK(dash.lossChart()->overlayRenderCount() == before);
    }

    // A zoom renders again for the new range.
    const int renders = dash.lossChart()->overlayRenderCount();
    dash.lossChart()->plot()->xAxis->setRange(50, 100);
    dash.lossChart()->plot()->replot();
    CHECK_FALSE(dash.lossChart()->overlayCurrent());
    REQUIRE(waitUntil([&] { return dash.lossChart()->overlayCurrent(); }, 10000));
    CHECK(dash.lossChart()->overlayRenderCount() > renders);

    // Runs without any accuracy key: the accuracy chart says so instead of an empty overlay.
    {
        std::vector<int64_t> lossOnly;
        for (int r = 0; r < 14; ++r) {
            const int64_t id =
                store.createRun("default", "l" + std::to_string(r), "mlp", "digits", "", {}, "x");
            store.appendMetric(id, "train/loss", 0, 0, 1.0);
            lossOnly.push_back(id);
        }
        store.flush();
        dash.showRuns(store, lossOnly);
        REQUIRE(waitUntil([&] { return !dash.overlayLoading() && dash.lossChart()->hasOverlay(); }, 10000));
        CHECK_FALSE(dash.accuracyChart()->hasOverlay());
        CHECK(dash.accuracyChart()->headerNote().contains(QStringLiteral("none has accuracy curves")));
    }

    // A few runs are graphs again, at once; a superseded overlay load never lands.
    dash.showRuns(store, runs);
    dash.showRuns(store, {runs[1], runs[2]});
    CHECK_FALSE(dash.lossChart()->hasOverlay());
    CHECK(dash.lossChart()->pointCount(runs[1], "train/loss") == 200);
    QTest::qWait(300);
    CHECK_FALSE(dash.lossChart()->hasOverlay());
    CHECK_FALSE(dash.overlayLoading());
}

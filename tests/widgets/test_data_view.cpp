#include <catch2/catch.hpp>

#include <QImage>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <cmath>
#include <string>

#include "lathe/core/store.h"
#include "lathe/widgets/data_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::DataView;
using Metric = lathe::widgets::DataView::Metric;

namespace {

constexpr int64_t kSteps = 80;

// What a run with the memory and disk caches (no redis) records: the loader keeps up except
// every tenth step, the hit rates climb over the epoch, and two corrupt samples are skipped.
double waitMs(int64_t step) { return step % 10 == 0 ? 4.0 + double(step) / 20.0 : 0.0; }
double samplesPerS(int64_t step) { return 5000.0 + 200.0 * std::sin(double(step) / 9.0); }
double hitMemory(int64_t step) { return std::min(0.9, double(step) / 100.0); }
double hitDisk(int64_t step) { return 0.25 + double(step) / 1000.0; }

int64_t recordDataRun(lathe::core::Store& store) {
    const int64_t id = store.createRun("default", "cached", "mlp", "digits", "",
                                       {{"cache_memory_mb", "256"}, {"cache_disk_gb", "1"}}, "localhost");
    for (int64_t step = 1; step <= kSteps; ++step) {
        store.appendMetric(id, DataView::keyFor(Metric::WaitMs), step, 0, waitMs(step));
        store.appendMetric(id, DataView::keyFor(Metric::SamplesPerS), step, 0, samplesPerS(step));
        store.appendMetric(id, DataView::keyFor(Metric::HitMemory), step, 0, hitMemory(step));
        store.appendMetric(id, DataView::keyFor(Metric::HitDisk), step, 0, hitDisk(step));
        if (step >= 30)
            store.appendMetric(id, DataView::keyFor(Metric::Skipped), step, 0, step >= 60 ? 2 : 1);
        store.appendMetric(id, "train/loss", step, 0, 1.0 / double(step));
    }
    store.appendMetric(id, "perf/samples_per_s", kSteps, 0, 4800.0);  // not a data/ key
    store.flush();
    return id;
}

double mean(double (*f)(int64_t)) {
    double sum = 0;
    for (int64_t step = 1; step <= kSteps; ++step) sum += f(step);
    return sum / double(kSteps);
}

}  // namespace

TEST_CASE("DataView parses data-loader keys", "[widgets][data]") {
    CHECK(DataView::parseKey("data/wait_ms") == Metric::WaitMs);
    CHECK(DataView::parseKey("data/samples_per_s") == Metric::SamplesPerS);
    CHECK(DataView::parseKey("data/hit_memory") == Metric::HitMemory);
    CHECK(DataView::parseKey("data/hit_disk") == Metric::HitDisk);
    CHECK(DataView::parseKey("data/hit_redis") == Metric::HitRedis);
    CHECK(DataView::parseKey("data/skipped") == Metric::Skipped);
    CHECK_FALSE(DataView::parseKey("perf/samples_per_s"));
    CHECK_FALSE(DataView::parseKey("data/unknown"));
    CHECK_FALSE(DataView::parseKey("rank1/data/wait_ms"));
    CHECK(DataView::keyFor(Metric::HitRedis) == "data/hit_redis");
    CHECK(DataView::isHitRate(Metric::HitDisk));
    CHECK_FALSE(DataView::isHitRate(Metric::WaitMs));
}

TEST_CASE("DataView plots batch wait, samples/s and the enabled cache levels from the store",
          "[widgets][data]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const int64_t cached = recordDataRun(store);
    const int64_t old =
        store.createRun("default", "before-loader-metrics", "mlp", "digits", "", {}, "localhost");
    store.appendMetric(old, "train/loss", 1, 0, 1.0);
    store.appendMetric(old, "perf/samples_per_s", 1, 0, 3000.0);
    const int64_t uncached = store.createRun("default", "no-cache", "mlp", "digits", "", {}, "localhost");
    for (int64_t step = 1; step <= 5; ++step) {
        store.appendMetric(uncached, DataView::keyFor(Metric::WaitMs), step, 0, 0.0);
        store.appendMetric(uncached, DataView::keyFor(Metric::SamplesPerS), step, 0, 42.0);
    }
    store.flush();

    DataView view;
    view.resize(1100, 700);
    view.show();
    CHECK(view.tabTitle() == "Data");
    CHECK(view.placeholderText().contains("No run selected"));

    view.showRun(store, cached);
    CHECK(view.runId() == cached);
    CHECK(view.hasDataMetrics());
    // wait, samples/s and one hit line per level the run recorded (no redis).
    CHECK(view.graphCount() == 4);
    CHECK(view.plot()->graphCount() == 4);
    CHECK(view.hitLevels() == std::vector<Metric>{Metric::HitMemory, Metric::HitDisk});
    CHECK(view.graph(Metric::HitRedis) == nullptr);
    for (Metric m : {Metric::WaitMs, Metric::SamplesPerS, Metric::HitMemory, Metric::HitDisk}) {
        INFO("metric " << int(m));
        CHECK(view.pointCount(m) == int(kSteps));
    }
    CHECK(view.pointCount(Metric::Skipped) == int(kSteps - 29));
    CHECK(view.skippedCount() == 2);
    CHECK(view.placeholderText().isEmpty());
    CHECK(view.hitPlaceholderText().isEmpty());

    // The legend names the cache levels only, in the hit-rate chart.
    CHECK(view.plot()->legend->visible());
    CHECK(view.plot()->legend->itemCount() == 2);
    CHECK(view.plot()->legend->layout() == view.hitRect()->insetLayout());

    // Values are the stored ones, each in its chart; hit rates on a 0..1 axis.
    auto at = [](QCPGraph* g, int64_t step) { return g->data()->findBegin(double(step), false)->value; };
    CHECK(at(view.graph(Metric::WaitMs), 40) == Approx(waitMs(40)));
    CHECK(at(view.graph(Metric::SamplesPerS), 41) == Approx(samplesPerS(41)));
    CHECK(at(view.graph(Metric::HitDisk), 42) == Approx(hitDisk(42)));
    CHECK(view.graph(Metric::WaitMs)->valueAxis()->axisRect() == view.waitRect());
    CHECK(view.graph(Metric::SamplesPerS)->valueAxis()->axisRect() == view.rateRect());
    CHECK(view.graph(Metric::HitMemory)->valueAxis()->axisRect() == view.hitRect());
    CHECK(view.hitRect()->axis(QCPAxis::atLeft)->range().lower == Approx(0));
    CHECK(view.hitRect()->axis(QCPAxis::atLeft)->range().upper == Approx(1.05));
    CHECK(view.graph(Metric::HitMemory)->pen().color() != view.graph(Metric::HitDisk)->pen().color());

    // Linked step axes.
    QCPAxis* waitX = view.waitRect()->axis(QCPAxis::atBottom);
    QCPAxis* hitX = view.hitRect()->axis(QCPAxis::atBottom);
    CHECK(waitX->range().lower < 1);
    CHECK(waitX->range().upper > kSteps);
    waitX->setRange(20, 40);
    CHECK(hitX->range().lower == Approx(20));
    CHECK(view.rateRect()->axis(QCPAxis::atBottom)->range().upper == Approx(40));
    view.rescale();
    view.plot()->replot(QCustomPlot::rpImmediateRefresh);

    // Summary: mean wait, mean samples/s, the last hit rates and the skipped count.
    const QString summary = view.summaryText();
    INFO(summary.toStdString());
    CHECK(summary.contains(QStringLiteral("wait %1 ms/step").arg(mean(waitMs), 0, 'f', 2)));
    CHECK(summary.contains(QStringLiteral("%1 samples/s").arg(mean(samplesPerS), 0, 'f', 0)));
    CHECK(summary.contains(QStringLiteral("memory %1%").arg(100 * hitMemory(kSteps), 0, 'f', 0)));
    CHECK(summary.contains(QStringLiteral("disk %1%").arg(100 * hitDisk(kSteps), 0, 'f', 0)));
    CHECK_FALSE(summary.contains("redis"));
    CHECK(summary.contains("2 samples skipped"));

    // Hover names the step and its figures, with the skipped count up to then.
    const QString hover =
        view.hoverAt(QPointF(waitX->coordToPixel(50), view.waitRect()->rect().center().y()));
    CHECK(hover.contains("step 50"));
    CHECK(hover.contains(QString::number(waitMs(50), 'f', 2)));
    CHECK(hover.contains("1 skipped so far"));

    const QString png = outputPath("data_view.png");
    REQUIRE(view.savePng(png, 1100, 700));
    CHECK(QImage(png).width() == 1100);

    // A run without caches: its loader figures, and a note where the hit rates would be.
    view.showRun(store, uncached);
    CHECK(view.graphCount() == 2);
    CHECK(view.hitLevels().empty());
    CHECK(view.placeholderText().isEmpty());
    CHECK(view.hitPlaceholderText().contains("No sample cache"));
    CHECK_FALSE(view.plot()->legend->visible());
    CHECK(view.summaryText() == "wait 0.00 ms/step · 42.0 samples/s");
    view.savePng(outputPath("data_view_no_cache.png"), 900, 500);

    // A run from before the loader recorded metrics: no graphs, a placeholder saying how to get them.
    view.showRun(store, old);
    CHECK_FALSE(view.hasDataMetrics());
    CHECK(view.graphCount() == 0);
    CHECK(view.plot()->graphCount() == 0);
    CHECK(view.skippedCount() == 0);
    CHECK(view.placeholderText().contains(QStringLiteral("Run %1 recorded no data-loader metrics").arg(old)));
    CHECK(view.placeholderText().contains("Train it again"));
    CHECK_FALSE(view.plot()->legend->visible());
    CHECK(view.summaryText().isEmpty());
    CHECK(view.hitPlaceholderText().isEmpty());
    view.savePng(outputPath("data_view_placeholder.png"), 900, 500);
}

TEST_CASE("DataView stages live data events and replots once per flush", "[widgets][data]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const int64_t id = store.createRun("default", "live", "mlp", "digits", "", {}, "localhost");
    store.flush();

    DataView view;
    view.resize(900, 600);
    view.show();
    view.showRun(store, id);
    CHECK_FALSE(view.hasDataMetrics());
    QTest::qWait(100);  // let the show/resize and showRun replots happen first

    QSignalSpy flushed(&view, &DataView::flushed);
    std::vector<lathe::core::Event> batch;
    for (int64_t step = 1; step <= 30; ++step) {
        batch.push_back(lathe::core::Event::metric(DataView::keyFor(Metric::WaitMs), step, waitMs(step)));
        batch.push_back(
            lathe::core::Event::metric(DataView::keyFor(Metric::SamplesPerS), step, samplesPerS(step)));
        batch.push_back(lathe::core::Event::metric(DataView::keyFor(Metric::HitRedis), step, 0.5));
        batch.push_back(lathe::core::Event::metric("train/loss", step, 1.0));  // ignored
    }
    const size_t half = batch.size() / 2;

    view.onEvents(id, {batch.begin(), batch.begin() + half});
    view.onEvents(id, {batch.begin() + half, batch.end()});
    CHECK(view.stagedCount() == 90);
    CHECK(view.graphCount() == 0);  // nothing moved before the timer
    const int replotsBefore = view.replotCount();
    REQUIRE(waitUntil([&] { return flushed.count() >= 1 && view.stagedCount() == 0; }, 2000));
    CHECK(flushed.count() == 1);
    CHECK(view.flushCount() == 1);
    CHECK(view.graphCount() == 3);
    CHECK(view.pointCount(Metric::WaitMs) == 30);
    CHECK(view.hitLevels() == std::vector<Metric>{Metric::HitRedis});
    CHECK(view.placeholderText().isEmpty());
    CHECK(view.summaryText().contains("redis 50%"));
    REQUIRE(waitUntil([&] { return view.replotCount() > replotsBefore; }, 2000));
    QTest::qWait(100);
    CHECK(view.replotCount() - replotsBefore <= 2);

    // A live event of another run is kept, not shown.
    view.onEvents(id + 1, {lathe::core::Event::metric(DataView::keyFor(Metric::WaitMs), 1, 3.0)});
    CHECK(view.stagedCount() == 0);

    // Reselecting the run merges the (uncommitted) live points with the store.
    view.showRun(store, 0);
    view.showRun(store, id);
    CHECK(view.pointCount(Metric::SamplesPerS) == 30);
    view.forgetLive(id);
    view.showRun(store, id);
    CHECK(view.graphCount() == 0);
    CHECK(view.placeholderText().contains("no data-loader metrics"));
}

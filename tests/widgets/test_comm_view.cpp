#include <catch2/catch.hpp>

#include <QFileInfo>
#include <QImage>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <cmath>
#include <string>

#include "lathe/core/store.h"
#include "lathe/widgets/comm_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::CommView;
using Metric = lathe::widgets::CommView::Metric;

namespace {

constexpr int64_t kSteps = 100;

// What a 2-rank int8 run records: rank 0 as comm/*, rank 1 as rank1/comm/*. Rank 1 is a bit
// slower and hides less; the ratio is constant.
double commMs(int rank, int64_t step) { return 2.0 + rank * 0.6 + 0.5 * std::sin(double(step) / 7.0 + rank); }
double overlap(int rank, int64_t step) { return 0.55 - 0.15 * rank + 0.1 * std::cos(double(step) / 11.0); }
double bytesSent(int rank, int64_t) { return 180000.0 + rank * 2048.0; }

int64_t recordCommRun(lathe::core::Store& store, int ranks = 2) {
    const int64_t id = store.createRun("default", "dp-fixture", "mlp", "synthetic:spirals", "",
                                       {{"nproc", std::to_string(ranks)}, {"compress", "int8"}}, "localhost");
    for (int64_t step = 1; step <= kSteps; ++step) {
        for (int r = 0; r < ranks; ++r) {
            store.appendMetric(id, CommView::keyFor(r, Metric::Ms), step, 0, commMs(r, step));
            store.appendMetric(id, CommView::keyFor(r, Metric::Overlap), step, 0, overlap(r, step));
            store.appendMetric(id, CommView::keyFor(r, Metric::BytesSent), step, 0, bytesSent(r, step));
            store.appendMetric(id, CommView::keyFor(r, Metric::CompressionRatio), step, 0, 3.99);
        }
        store.appendMetric(id, "train/loss", step, 0, 1.0 / double(step));
    }
    store.appendMetric(id, "perf/step_ms", kSteps, 0, 9.5);
    store.flush();
    return id;
}

}  // namespace

TEST_CASE("CommView parses rank keys", "[widgets][comm]") {
    CHECK(CommView::parseKey("comm/ms") == std::make_pair(0, Metric::Ms));
    CHECK(CommView::parseKey("rank1/comm/overlap") == std::make_pair(1, Metric::Overlap));
    CHECK(CommView::parseKey("rank12/comm/bytes_sent") == std::make_pair(12, Metric::BytesSent));
    CHECK(CommView::parseKey("comm/compression_ratio") == std::make_pair(0, Metric::CompressionRatio));
    CHECK_FALSE(CommView::parseKey("train/loss"));
    CHECK_FALSE(CommView::parseKey("rank/comm/ms"));
    CHECK_FALSE(CommView::parseKey("rankx/comm/ms"));
    CHECK_FALSE(CommView::parseKey("comm/unknown"));
    CHECK(CommView::keyFor(0, Metric::Ms) == "comm/ms");
    CHECK(CommView::keyFor(3, Metric::BytesSent) == "rank3/comm/bytes_sent");
    CHECK(CommView::rankColor(0) != CommView::rankColor(1));
    // Pipeline stages are series of their own.
    CHECK(CommView::parseKey("pipe/stage1/bubble") ==
          std::make_pair(CommView::kStageSeries + 1, Metric::Bubble));
    CHECK(CommView::parseKey("pipe/stage0/bytes_sent") ==
          std::make_pair(CommView::kStageSeries, Metric::BytesSent));
    CHECK(CommView::parseKey("pipe/stage12/forward_ms") ==
          std::make_pair(CommView::kStageSeries + 12, Metric::ForwardMs));
    CHECK_FALSE(CommView::parseKey("pipe/stage1/in_flight"));
    CHECK_FALSE(CommView::parseKey("pipe/stagex/bubble"));
    CHECK_FALSE(CommView::parseKey("pipe/bubble"));
    CHECK_FALSE(CommView::parseKey("comm/bubble"));  // a rank has no bubble
    CHECK(CommView::keyFor(CommView::kStageSeries + 2, Metric::BackwardMs) == "pipe/stage2/backward_ms");
}

TEST_CASE("CommView plots comm time, overlap, bytes and ratio per rank from the store", "[widgets][comm]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const int64_t dp = recordCommRun(store);
    const int64_t plain = store.createRun("default", "single", "mlp", "digits", "", {}, "localhost");
    store.appendMetric(plain, "train/loss", 1, 0, 1.0);
    store.appendMetric(plain, "perf/step_ms", 1, 0, 3.0);
    store.flush();

    CommView view;
    view.resize(1100, 700);
    view.show();
    CHECK(view.placeholderText().contains("No run selected"));

    view.showRun(store, dp);
    CHECK(view.runId() == dp);
    REQUIRE(view.rankCount() == 2);
    CHECK(view.ranks() == std::vector<int>{0, 1});
    CHECK(view.graphCount() == 8);  // 4 figures × 2 ranks
    CHECK(view.plot()->graphCount() == 8);
    for (int r : {0, 1})
        for (Metric m : {Metric::Ms, Metric::Overlap, Metric::BytesSent, Metric::CompressionRatio}) {
            INFO("rank " << r << " metric " << int(m));
            CHECK(view.pointCount(r, m) == int(kSteps));
        }
    CHECK(view.placeholderText().isEmpty());
    CHECK(view.plot()->legend->visible());
    CHECK(view.summaryText().contains("2 ranks"));
    CHECK(view.summaryText().contains("3.99"));

    // Each rank keeps one colour in every chart; ranks differ.
    for (int r : {0, 1})
        for (Metric m : {Metric::Overlap, Metric::BytesSent, Metric::CompressionRatio})
            CHECK(view.graph(r, m)->pen().color() == view.graph(r, Metric::Ms)->pen().color());
    CHECK(view.graph(0, Metric::Ms)->pen().color() != view.graph(1, Metric::Ms)->pen().color());

    // Values are the stored ones (bytes in KiB), on the right axis rects.
    auto at = [](QCPGraph* g, int64_t step) { return g->data()->findBegin(double(step), false)->value; };
    CHECK(at(view.graph(1, Metric::Ms), 42) == Approx(commMs(1, 42)));
    CHECK(at(view.graph(0, Metric::Overlap), 42) == Approx(overlap(0, 42)));
    CHECK(at(view.graph(1, Metric::BytesSent), 42) == Approx(bytesSent(1, 42) / 1024.0));
    CHECK(view.graph(0, Metric::Ms)->valueAxis()->axisRect() == view.msRect());
    CHECK(view.graph(0, Metric::Overlap)->valueAxis()->axisRect() == view.overlapRect());
    CHECK(view.graph(0, Metric::BytesSent)->valueAxis() == view.bytesRect()->axis(QCPAxis::atLeft));
    CHECK(view.graph(0, Metric::CompressionRatio)->valueAxis() == view.bytesRect()->axis(QCPAxis::atRight));

    // Overlap is a share: its axis is 0..1 (with air), and the step axes are linked.
    CHECK(view.overlapRect()->axis(QCPAxis::atLeft)->range().lower == Approx(0));
    CHECK(view.overlapRect()->axis(QCPAxis::atLeft)->range().upper == Approx(1.05));
    QCPAxis* msX = view.msRect()->axis(QCPAxis::atBottom);
    QCPAxis* ovX = view.overlapRect()->axis(QCPAxis::atBottom);
    QCPAxis* byX = view.bytesRect()->axis(QCPAxis::atBottom);
    CHECK(msX->range().lower < 1);
    CHECK(msX->range().upper > kSteps);
    msX->setRange(20, 40);
    CHECK(ovX->range().lower == Approx(20));
    CHECK(byX->range().upper == Approx(40));
    byX->setRange(10, 60);
    CHECK(msX->range().lower == Approx(10));
    CHECK(ovX->range().upper == Approx(60));
    view.rescale();
    view.plot()->replot(QCustomPlot::rpImmediateRefresh);

    // Hover names the step and every rank's figures.
    const QString hover = view.hoverAt(QPointF(msX->coordToPixel(50), view.msRect()->rect().center().y()));
    CHECK(hover.contains("step 50"));
    CHECK(hover.contains("rank 0:"));
    CHECK(hover.contains("rank 1:"));
    CHECK(hover.contains(QString::number(commMs(1, 50), 'f', 3)));

    const QString png = outputPath("comm_view.png");
    REQUIRE(view.savePng(png, 1100, 700));
    view.grab().save(outputPath("comm_view_widget.png"));
    QImage img(png);
    CHECK(img.width() == 1100);

    // A single-process run: no graphs, a placeholder that says what to do.
    view.showRun(store, plain);
    CHECK(view.rankCount() == 0);
    CHECK(view.graphCount() == 0);
    CHECK(view.plot()->graphCount() == 0);
    CHECK(view.placeholderText().contains(QStringLiteral("run %1 ran in one process").arg(plain),
                                          Qt::CaseInsensitive));
    CHECK(view.placeholderText().contains("Processes > 1"));
    CHECK_FALSE(view.plot()->legend->visible());
    CHECK(view.summaryText().isEmpty());
    view.savePng(outputPath("comm_view_placeholder.png"), 900, 500);
}

TEST_CASE("CommView stages live comm events and replots once per flush", "[widgets][comm]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const int64_t id = store.createRun("default", "live", "mlp", "synthetic:spirals", "", {}, "localhost");
    store.flush();

    CommView view;
    view.resize(900, 600);
    view.show();
    view.showRun(store, id);
    CHECK_FALSE(view.hasCommData());
    QTest::qWait(100);  // let the show/resize and showRun replots happen first

    QSignalSpy flushed(&view, &CommView::flushed);
    std::vector<lathe::core::Event> batch;
    for (int64_t step = 1; step <= 30; ++step)
        for (int r : {0, 1}) {
            lathe::core::Event e;
            e.type = lathe::core::Event::Type::Metric;
            e.step = step;
            e.key = CommView::keyFor(r, Metric::Ms);
            e.value = commMs(r, step);
            batch.push_back(e);
            e.key = CommView::keyFor(r, Metric::Overlap);
            e.value = overlap(r, step);
            batch.push_back(e);
            e.key = "train/grad_norm";  // ignored
            batch.push_back(e);
        }
    // Delivered in three chunks within one flush window.
    const size_t third = batch.size() / 3;
    view.onEvents(id, {batch.begin(), batch.begin() + third});
    view.onEvents(id, {batch.begin() + third, batch.begin() + 2 * third});
    view.onEvents(id, {batch.begin() + 2 * third, batch.end()});
    CHECK(view.stagedCount() == 120);
    CHECK(view.graphCount() == 0);  // nothing moved before the timer
    const int replotsBefore = view.replotCount();
    REQUIRE(waitUntil([&] { return flushed.count() >= 1 && view.stagedCount() == 0; }, 2000));
    CHECK(flushed.count() == 1);
    CHECK(view.flushCount() == 1);
    CHECK(view.rankCount() == 2);
    CHECK(view.pointCount(0, Metric::Ms) == 30);
    CHECK(view.pointCount(1, Metric::Overlap) == 30);
    CHECK(view.placeholderText().isEmpty());
    REQUIRE(waitUntil([&] { return view.replotCount() > replotsBefore; }, 2000));
    QTest::qWait(100);
    CHECK(view.replotCount() - replotsBefore <= 2);

    // Reselecting the run merges the (uncommitted) live points with the store.
    view.showRun(store, 0);
    view.showRun(store, id);
    CHECK(view.pointCount(1, Metric::Ms) == 30);
    view.forgetLive(id);
    view.showRun(store, id);
    CHECK(view.rankCount() == 0);
}

TEST_CASE("CommView shows a pipeline run's compute, bubble and traffic per stage", "[widgets][comm]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const int64_t id = store.createRun("default", "pipe-fixture", "mlp", "digits", "",
                                       {{"pipeline_stages", "3"}}, "localhost");
    auto bubble = [](int s, int64_t step) { return 0.2 + 0.05 * s + 0.02 * std::sin(double(step) / 5.0); };
    for (int64_t step = 1; step <= kSteps; ++step)
        for (int s = 0; s < 3; ++s) {
            const int series = CommView::kStageSeries + s;
            store.appendMetric(id, CommView::keyFor(series, Metric::Bubble), step, 0, bubble(s, step));
            store.appendMetric(id, CommView::keyFor(series, Metric::ForwardMs), step, 0, 1.0 + 0.2 * s);
            store.appendMetric(id, CommView::keyFor(series, Metric::BackwardMs), step, 0, 2.0 + 0.3 * s);
            store.appendMetric(id, CommView::keyFor(series, Metric::BytesSent), step, 0,
                               s == 0 || s == 2 ? 32768 : 65536);
            store.appendMetric(id, "pipe/stage" + std::to_string(s) + "/in_flight", step, 0, 3 - s);
        }
    store.flush();

    CommView view;
    view.resize(1100, 700);
    view.show();
    view.showRun(store, id);
    CHECK(view.rankCount() == 0);
    REQUIRE(view.stageCount() == 3);
    CHECK(view.stages() == std::vector<int>{0, 1, 2});
    CHECK(view.graphCount() == 12);  // 4 figures x 3 stages
    CHECK(view.plot()->graphCount() == 12);
    CHECK(view.placeholderText().isEmpty());
    const int s1 = CommView::kStageSeries + 1;
    CHECK(view.pointCount(s1, Metric::Bubble) == int(kSteps));
    CHECK(view.graph(s1, Metric::Ms) == nullptr);  // a stage has no gradient exchange of its own
    CHECK(view.graph(s1, Metric::Bubble)->valueAxis()->axisRect() == view.overlapRect());
    CHECK(view.graph(s1, Metric::ForwardMs)->valueAxis()->axisRect() == view.msRect());
    CHECK(view.graph(s1, Metric::BytesSent)->valueAxis() == view.bytesRect()->axis(QCPAxis::atLeft));
    CHECK(view.graph(s1, Metric::Bubble)->pen().color() == view.graph(s1, Metric::BackwardMs)->pen().color());
    CHECK(view.graph(CommView::kStageSeries, Metric::Bubble)->pen().color() !=
          view.graph(s1, Metric::Bubble)->pen().color());
    CHECK(view.summaryText().contains("3 stages"));
    CHECK(view.summaryText().contains("bubble 25%"));
    view.rescale();
    view.plot()->replot(QCustomPlot::rpImmediateRefresh);
    QCPAxis* x = view.msRect()->axis(QCPAxis::atBottom);
    const QString hover = view.hoverAt(QPointF(x->coordToPixel(50), view.msRect()->rect().center().y()));
    CHECK(hover.contains("stage 1: forward 1.200 ms"));
    CHECK(hover.contains("64.0 KiB"));
    REQUIRE(view.savePng(outputPath("comm_view_pipeline.png"), 1100, 700));
}

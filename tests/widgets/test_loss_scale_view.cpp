#include <catch2/catch.hpp>

#include <QFileInfo>
#include <QImage>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <cmath>

#include "lathe/core/store.h"
#include "lathe/widgets/loss_scale_view.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "profile_fixture.h"
#include "test_helpers.h"

using lathe::test::outputPath;
using lathe::test::waitUntil;
using lathe::widgets::LossScaleView;

TEST_CASE("LossScaleView plots scale, skipped steps and grad norm with linked step axes", "[widgets][amp]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const auto rec = lathe::test::recordAmpRun(store);
    const int64_t plain = store.createRun("default", "fp32", "mlp", "digits", "", {}, "localhost");
    store.appendMetric(plain, "train/loss", 1, 0, 1.0);
    store.flush();

    LossScaleView view;
    view.resize(1000, 600);
    view.show();
    view.showRun(store, rec.runId);
    CHECK(view.runId() == rec.runId);
    CHECK(view.scalePointCount() == int(rec.steps));
    CHECK(view.skippedCount() == int(rec.skipped.size()));
    CHECK(view.skippedGraph()->data()->size() == int(rec.skipped.size()));
    CHECK(view.gradNormPointCount() == int(rec.steps - int64_t(rec.skipped.size())));

    // Each marker sits at its step, at the scale used in that step.
    const auto stored = store.metrics(rec.runId, "amp/loss_scale");
    for (auto it = view.skippedGraph()->data()->constBegin(); it != view.skippedGraph()->data()->constEnd();
         ++it) {
        const auto step = int64_t(it->key);
        CHECK(rec.skipped.count(step) == 1);
        CHECK(it->value == Approx(stored[size_t(step - 1)].value));
    }

    // Log scale axis; the two step axes move together both ways.
    QCPAxis* scaleX = view.scaleRect()->axis(QCPAxis::atBottom);
    QCPAxis* normX = view.normRect()->axis(QCPAxis::atBottom);
    CHECK(view.scaleRect()->axis(QCPAxis::atLeft)->scaleType() == QCPAxis::stLogarithmic);
    CHECK(view.normRect()->axis(QCPAxis::atLeft)->scaleType() == QCPAxis::stLinear);
    CHECK(view.scaleGraph()->keyAxis() == scaleX);
    CHECK(view.gradNormGraph()->keyAxis() == normX);
    CHECK(scaleX->range().lower == Approx(normX->range().lower));
    CHECK(scaleX->range().upper == Approx(normX->range().upper));
    scaleX->setRange(40, 80);
    CHECK(normX->range().lower == Approx(40));
    CHECK(normX->range().upper == Approx(80));
    normX->setRange(100, 170);
    CHECK(scaleX->range().lower == Approx(100));
    CHECK(scaleX->range().upper == Approx(170));
    view.rescale();
    view.plot()->replot(QCustomPlot::rpImmediateRefresh);

    // Hover over a skipped step shows all four values.
    const double x = scaleX->coordToPixel(60);
    const double y = view.scaleRect()->axis(QCPAxis::atLeft)->coordToPixel(stored[59].value);
    const QString text = view.hoverAt(QPointF(x, y));
    CHECK(text.contains("step 60"));
    CHECK(text.contains("skipped: yes"));
    CHECK(text.contains("loss scale"));
    CHECK(text.contains("grad norm non-finite"));
    QCPItemTracer* tracer = nullptr;
    for (int i = 0; i < view.plot()->itemCount(); ++i)
        if (auto* t = qobject_cast<QCPItemTracer*>(view.plot()->item(i))) tracer = t;
    REQUIRE(tracer);
    CHECK(tracer->visible());
    CHECK(tracer->graph() != nullptr);
    CHECK(tracer->graphKey() == Approx(60));
    const double x2 = scaleX->coordToPixel(100);
    const QString text2 = view.hoverAt(QPointF(x2, view.normRect()->rect().center().y()));
    CHECK(text2.contains("step 100"));
    CHECK(text2.contains("skipped: no"));
    CHECK(text2.contains(QString::number(lathe::test::gradNormAt(100), 'g', 5)));
    view.hoverAt(QPointF(-50, -50));
    CHECK(view.hoverText().isEmpty());

    QTest::qWait(60);
    REQUIRE(view.grab().save(outputPath("loss_scale_view.png")));
    const QString png = outputPath("loss_scale_export.png");
    const QString pdf = outputPath("loss_scale_export.pdf");
    QFile::remove(png);
    QFile::remove(pdf);
    REQUIRE(view.savePng(png, 1000, 600));
    CHECK(QImage(png).width() == 1000);
    REQUIRE(view.savePdf(pdf));
    CHECK(QFileInfo(pdf).size() > 1000);

    // A run without loss scaling says so instead of showing empty axes.
    view.showRun(store, plain);
    CHECK(view.scalePointCount() == 0);
    view.showRun(store, rec.runId);
    CHECK(view.scalePointCount() == int(rec.steps));
}

namespace {
QStringList g_messages;
void collectMessage(QtMsgType, const QMessageLogContext&, const QString& text) { g_messages << text; }
}  // namespace

TEST_CASE("An empty LossScaleView logs nothing", "[widgets][amp]") {
    // QCustomPlot logs "graph has no data" when a tracer is given an empty graph: the view
    // of no run must not, since every window builds one at start.
    g_messages.clear();
    const QtMessageHandler previous = qInstallMessageHandler(collectMessage);
    {
        LossScaleView view;
        view.resize(600, 400);
        view.plot()->replot(QCustomPlot::rpImmediateRefresh);
        view.hoverAt(QPointF(100, 100));
    }
    qInstallMessageHandler(previous);
    CHECK(g_messages.join(QLatin1Char('\n')).toStdString() == "");
}

TEST_CASE("LossScaleView stages live points and replots once per flush", "[widgets][amp]") {
    QTemporaryDir dir;
    REQUIRE(dir.isValid());
    lathe::core::Store store((dir.path() + "/ws.db").toStdString());
    const auto rec = lathe::test::recordAmpRun(store, 50, 2);

    LossScaleView view;
    view.resize(800, 500);
    view.show();
    view.showRun(store, rec.runId);
    QTest::qWait(60);
    const int replotsBefore = view.replotCount();
    QSignalSpy flushed(&view, &LossScaleView::flushed);

    // Steps 41..120: 41..50 overlap the history and are not added twice.
    std::vector<lathe::core::Event> events;
    for (int64_t step = 41; step <= 120; ++step) {
        const bool skip = step == 100;
        events.push_back(lathe::core::Event::metric("amp/loss_scale", step, 1024.0));
        events.push_back(lathe::core::Event::metric("amp/skipped", step, skip ? 1.0 : 0.0));
        events.push_back(lathe::core::Event::metric("train/grad_norm", step, skip ? NAN : 0.5));
        events.push_back(lathe::core::Event::metric("train/loss", step, 0.3));  // not ours
        // One batch per step, as the session would deliver them.
        view.onEvents(rec.runId, events);
        events.clear();
    }
    view.onEvents(rec.runId + 99, {lathe::core::Event::metric("amp/loss_scale", 1, 8.0)});  // other run
    CHECK(view.stagedCount() == 70 * 3);
    CHECK(view.scalePointCount() == 50);
    REQUIRE(waitUntil([&] { return view.scalePointCount() == 120; }, 2000));
    QTest::qWait(100);
    CHECK(flushed.count() == 1);
    CHECK(view.flushCount() == 1);
    CHECK(view.skippedCount() == int(rec.skipped.size()) + 1);
    CHECK(view.gradNormPointCount() == 120 - int(rec.skipped.size()) - 1);
    CHECK(view.replotCount() - replotsBefore >= 1);
    CHECK(view.replotCount() - replotsBefore <= 2);

    // Reselecting the run mid-training: store history + remembered live points, no doubles.
    view.showRun(store, rec.runId);
    CHECK(view.scalePointCount() == 120);
    view.forgetLive(rec.runId);
    view.showRun(store, rec.runId);
    CHECK(view.scalePointCount() == 50);
}

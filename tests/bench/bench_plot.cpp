// bench_plot: how long one MetricChart replot takes at 1,000,000 points with QCustomPlot's
// adaptive sampling on and off (the baseline), plus the cost of the live path (stage many
// small appends, one flush). Reports medians and ratios; it does not fail on speed.
//
//   QT_QPA_PLATFORM=offscreen bench_plot [--points N] [--reps N]
#include <QApplication>
#include <QElapsedTimer>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/qcustomplot_include.h"

using lathe::widgets::MetricChart;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median wall time of `reps` immediate replots, in milliseconds, after two warm-up replots.
double timeReplots(MetricChart& chart, int reps) {
    for (int i = 0; i < 2; ++i) chart.plot()->replot(QCustomPlot::rpImmediateRefresh);
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        QElapsedTimer t;
        t.start();
        chart.plot()->replot(QCustomPlot::rpImmediateRefresh);
        ms.push_back(double(t.nsecsElapsed()) / 1e6);
    }
    return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    int64_t points = 1000000;
    int reps = 10;
    for (int i = 1; i + 1 < argc; ++i) {
        if (!std::strcmp(argv[i], "--points"))
            points = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--reps"))
            reps = std::max(1, std::atoi(argv[++i]));
    }

    MetricChart chart(QStringLiteral("loss"), {QStringLiteral("train/loss"), QStringLiteral("val/loss")});
    chart.resize(1200, 500);
    chart.show();
    QApplication::processEvents();

    // A noisy, decaying loss curve: noise is what makes naive drawing expensive.
    std::mt19937_64 rng(42);
    std::normal_distribution<double> noise(0.0, 0.08);
    std::vector<lathe::core::MetricPoint> series(static_cast<size_t>(points));
    for (int64_t i = 0; i < points; ++i) {
        auto& p = series[static_cast<size_t>(i)];
        p.step = i;
        p.value = 0.05 + 2.0 * std::exp(-double(i) / (double(points) / 6.0)) + noise(rng);
    }
    QElapsedTimer load;
    load.start();
    chart.setSeries(1, "train/loss", series);
    const double loadMs = double(load.nsecsElapsed()) / 1e6;
    if (chart.pointCount(1, "train/loss") != points) {
        std::fprintf(stderr, "bench_plot: expected %lld points in the graph, got %d\n",
                     static_cast<long long>(points), chart.pointCount(1, "train/loss"));
        return 1;
    }

    chart.setAdaptiveSampling(true);
    const double onMs = timeReplots(chart, reps);
    chart.setAdaptiveSampling(false);
    const double offMs = timeReplots(chart, reps);
    chart.setAdaptiveSampling(true);

    // Live path: 1000 appends of 10 points staged, then the one flush the timer would do.
    const int64_t base = points;
    QElapsedTimer stage;
    stage.start();
    for (int c = 0; c < 1000; ++c) {
        std::vector<lathe::core::MetricPoint> chunk(10);
        for (int j = 0; j < 10; ++j) {
            chunk[size_t(j)].step = base + c * 10 + j;
            chunk[size_t(j)].value = 0.05 + noise(rng);
        }
        chart.appendPoints(1, "train/loss", std::move(chunk));
    }
    const double stageMs = double(stage.nsecsElapsed()) / 1e6;
    QElapsedTimer flush;
    flush.start();
    chart.flushStaged();
    chart.plot()->replot(QCustomPlot::rpImmediateRefresh);
    const double flushMs = double(flush.nsecsElapsed()) / 1e6;

    std::printf("bench_plot: %lld points, %dx%d px plot, median of %d replots (rpImmediateRefresh)\n",
                static_cast<long long>(points), chart.plot()->width(), chart.plot()->height(), reps);
    std::printf("  load (setSeries)             %9.2f ms\n", loadMs);
    std::printf("  replot, adaptive sampling on %9.2f ms\n", onMs);
    std::printf("  replot, adaptive sampling off%9.2f ms   (baseline)\n", offMs);
    std::printf("  speed-up on vs off           %9.1fx\n", onMs > 0 ? offMs / onMs : 0.0);
    std::printf("  live: stage 10000 pts in 1000 appends %7.2f ms; one flush + replot %7.2f ms\n", stageMs,
                flushMs);
    return 0;
}

// bench_timeline: paint time of the profile timeline at 100,000 spans, full view and zoomed
// into a few steps, with culling + sub-pixel merging (what the GUI uses) against a baseline
// that paints every span as its own rectangle, measured side by side in the same run. Reports
// medians and ratios; it fails only when the painted result is inconsistent, never on speed.
//
//   QT_QPA_PLATFORM=offscreen bench_timeline [--spans N] [--reps N]
#include <QApplication>
#include <QElapsedTimer>
#include <QImage>
#include <QPainter>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lathe/core/profile_analysis.h"
#include "lathe/widgets/profile_timeline.h"

using lathe::core::ProfileSpan;
using lathe::widgets::ProfileTimeline;
using lathe::widgets::TimelineLayout;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A training-like profile: per step four phases on thread 0 with nested ops (up to depth 3)
// of varied length, and a loader thread with short ops. Roughly 100 spans per step.
std::vector<ProfileSpan> makeSpans(int64_t target) {
    std::mt19937_64 rng(7);
    std::uniform_int_distribution<int> pick(0, 11);
    std::uniform_int_distribution<int64_t> len(800, 30000);
    const char* ops[] = {"aten::addmm", "aten::mm",     "aten::relu", "aten::add_",
                         "aten::mul_",  "aten::copy_",  "aten::t",    "aten::sum",
                         "aten::to",    "aten::linear", "aten::div",  "aten::empty"};
    const char* phases[] = {"data", "forward", "backward", "optimizer"};
    std::vector<ProfileSpan> out;
    out.reserve(size_t(target) + 200);
    auto add = [&](ProfileSpan::Kind k, const std::string& name, int64_t step, int64_t thread, int64_t start,
                   int64_t dur) {
        ProfileSpan s;
        s.kind = k;
        s.name = name;
        s.step = step;
        s.thread = thread;
        s.startNs = start;
        s.durationNs = dur;
        s.shapes = "[64, 128], [128, 128]";
        out.push_back(std::move(s));
    };
    int64_t t = 0;
    for (int64_t step = 1; int64_t(out.size()) < target; ++step) {
        int64_t lt = t + 500;
        for (int i = 0; i < 8; ++i, lt += 4000) add(ProfileSpan::Kind::Op, "aten::stack", step, 1, lt, 3000);
        for (const char* phase : phases) {
            const int64_t start = t;
            for (int i = 0; i < 22; ++i) {
                const int64_t d = len(rng);
                add(ProfileSpan::Kind::Op, ops[pick(rng)], step, 0, t, d);
                add(ProfileSpan::Kind::Op, ops[pick(rng)], step, 0, t + d / 8, d / 2);
                if (i % 3 == 0) add(ProfileSpan::Kind::Op, ops[pick(rng)], step, 0, t + d / 4, d / 5);
                t += d + 300;
            }
            add(ProfileSpan::Kind::Phase, phase, step, 0, start, t - start);
        }
        t += 2000;
    }
    return out;
}

// Median wall time of `reps` full paints of the widget into an image, in milliseconds.
double timePaints(ProfileTimeline& timeline, QImage& image, int reps, ProfileTimeline::PaintStats* stats) {
    for (int i = 0; i < 2; ++i) timeline.render(&image);
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        QElapsedTimer t;
        t.start();
        timeline.render(&image);
        ms.push_back(double(t.nsecsElapsed()) / 1e6);
    }
    if (stats) *stats = timeline.lastPaintStats();
    return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    int64_t spans = 100000;
    int reps = 9;
    for (int i = 1; i + 1 < argc; ++i) {
        if (!std::strcmp(argv[i], "--spans"))
            spans = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--reps"))
            reps = std::max(1, std::atoi(argv[++i]));
    }

    QElapsedTimer build;
    build.start();
    const auto layout = TimelineLayout::build(makeSpans(spans));
    const double buildMs = double(build.nsecsElapsed()) / 1e6;

    ProfileTimeline timeline;
    timeline.resize(1600, 420);
    timeline.setLayoutData(layout);
    QImage image(timeline.size(), QImage::Format_ARGB32_Premultiplied);

    struct Case {
        const char* name;
        double start, end;
    };
    const double s0 = double(layout->steps[layout->steps.size() / 2].startNs);
    const double s1 = double(layout->steps[layout->steps.size() / 2 + 3].startNs);
    timeline.fitAll();
    const Case cases[] = {{"full view", timeline.viewStart(), timeline.viewEnd()},
                          {"zoomed (3 steps)", s0, s1}};

    std::printf("bench_timeline: %zu spans in %zu rows, %dx%d px, median of %d paints\n",
                layout->spans.size(), layout->rows.size(), timeline.width(), timeline.height(), reps);
    std::printf("  layout (TimelineLayout::build)        %9.2f ms\n", buildMs);
    std::printf("  %-18s %14s %14s %9s %10s %10s\n", "view", "culled+merged", "every span", "speed-up",
                "rects", "baseline");
    int rc = 0;
    for (const Case& c : cases) {
        timeline.setViewRange(c.start, c.end);
        ProfileTimeline::PaintStats fast, slow;
        timeline.setCulling(true);
        const double fastMs = timePaints(timeline, image, reps, &fast);
        timeline.setCulling(false);
        const double slowMs = timePaints(timeline, image, reps, &slow);
        timeline.setCulling(true);
        std::printf("  %-18s %11.2f ms %11.2f ms %8.1fx %10d %10d\n", c.name, fastMs, slowMs,
                    fastMs > 0 ? slowMs / fastMs : 0.0, fast.rects, slow.rects);
        // The baseline draws every span; the full view must still account for all of them.
        if (slow.rects != int(layout->spans.size())) rc = 1;
        if (c.start == cases[0].start && fast.visibleSpans != int(layout->spans.size())) rc = 1;
    }
    if (rc) std::fprintf(stderr, "bench_timeline: paint statistics do not add up\n");
    return rc;
}

// Frame time while panning the Graph view over a 5,000-op graph (every scope expanded), zoomed
// out to an overview and at a readable 1:1, against the same layout drawn the plain
// QGraphicsView way (a path item per box with two text items, a path item per edge and arrow,
// no level of detail), side by side in one process on the offscreen platform. A frame is one
// synchronous repaint of the 1400×900 viewport after scrolling 40 pixels.
//   bench_graph_view [--out DIR] [--frames N] [--nodes N]
#include <QApplication>
#include <QElapsedTimer>
#include <QGraphicsPathItem>
#include <QGraphicsScene>
#include <QGraphicsSimpleTextItem>
#include <QGraphicsView>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTest>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "graph_fixture.h"
#include "lathe/core/graph_layout.h"
#include "lathe/widgets/graph_view.h"

using namespace lathe;

namespace {

// The plain way: standard items, text always drawn.
void buildPlainScene(QGraphicsScene& scene, const core::GraphView& view, const core::GraphLayout& layout) {
    for (size_t c = 0; c < layout.clusters.size(); ++c) {
        const auto& b = layout.clusters[c];
        QPainterPath p;
        p.addRoundedRect(QRectF(QPointF(b.x0, b.y0), QPointF(b.x1, b.y1)), 8, 8);
        scene.addPath(p, QPen(QColor("#b0b0b0")), QColor(0, 0, 0, 8));
        auto* t = scene.addSimpleText(QString::fromStdString(view.clusters[c].label));
        t->setPos(b.x0 + 6, b.y0 + 1);
    }
    for (const auto& e : layout.edges) {
        if (e.points.empty()) continue;
        QPainterPath p(QPointF(e.points[0].first, e.points[0].second));
        size_t k = 1;
        for (; k + 2 < e.points.size(); k += 3)
            p.cubicTo(QPointF(e.points[k].first, e.points[k].second),
                      QPointF(e.points[k + 1].first, e.points[k + 1].second),
                      QPointF(e.points[k + 2].first, e.points[k + 2].second));
        if (e.hasTip) p.lineTo(e.tip.first, e.tip.second);
        scene.addPath(p, QPen(QColor("#707070")));
        if (e.hasTip) {
            QPolygonF head;
            head << QPointF(e.tip.first, e.tip.second) << QPointF(e.tip.first - 3.5, e.tip.second - 6)
                 << QPointF(e.tip.first + 3.5, e.tip.second - 6);
            scene.addPolygon(head, QPen(QColor("#707070")), QColor("#707070"));
        }
    }
    for (size_t i = 0; i < layout.nodes.size(); ++i) {
        const auto& b = layout.nodes[i];
        const auto& n = view.nodes[i];
        QPainterPath p;
        const QRectF r(b.x - b.w / 2, b.y - b.h / 2, b.w, b.h);
        p.addRoundedRect(r, 6, 6);
        scene.addPath(p, QPen(QColor("#404040"), 0.8), QColor(core::graphCategoryColor(n.category)));
        auto* label = scene.addSimpleText(QString::fromStdString(n.label));
        QFont f = label->font();
        f.setPointSizeF(8.5);
        f.setBold(true);
        label->setFont(f);
        label->setPos(r.center().x() - label->boundingRect().width() / 2, r.top() + 2);
        auto* detail = scene.addSimpleText(QString::fromStdString(n.detail));
        f.setBold(false);
        f.setPointSizeF(7);
        detail->setFont(f);
        detail->setPos(r.center().x() - detail->boundingRect().width() / 2, r.center().y());
    }
}

struct Frames {
    double median = 0, p95 = 0;
};

// Pans `view` down by 40 px per frame (wrapping at the end), repainting synchronously each time.
Frames pan(QGraphicsView& view, int frames) {
    auto* bar = view.verticalScrollBar();
    bar->setValue(bar->minimum());
    view.viewport()->repaint();
    std::vector<double> ms;
    QElapsedTimer t;
    for (int i = 0; i < frames; ++i) {
        bar->setValue(bar->value() + 40 > bar->maximum() ? bar->minimum() : bar->value() + 40);
        t.start();
        view.viewport()->repaint();
        ms.push_back(static_cast<double>(t.nsecsElapsed()) / 1e6);
    }
    std::sort(ms.begin(), ms.end());
    return {ms[ms.size() / 2], ms[std::min(ms.size() - 1, ms.size() * 95 / 100)]};
}

}  // namespace

int main(int argc, char** argv) {
    qputenv("QT_QPA_PLATFORM",
            qgetenv("QT_QPA_PLATFORM").isEmpty() ? "offscreen" : qgetenv("QT_QPA_PLATFORM"));
    QApplication app(argc, argv);
    std::string outDir;
    int frames = 120;
    int64_t nodes = 5000;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            outDir = argv[++i];
        else if (a == "--frames" && i + 1 < argc)
            frames = std::max(10, std::atoi(argv[++i]));
        else if (a == "--nodes" && i + 1 < argc)
            nodes = std::max<int64_t>(100, std::atoll(argv[++i]));
        else {
            std::fprintf(stderr, "usage: bench_graph_view [--out DIR] [--frames N] [--nodes N]\n");
            return 2;
        }
    }
    const core::ModelGraph g = bench::encoderStack(nodes);

    widgets::GraphView ours;
    ours.resize(1400 + 300, 900 + 80);
    ours.show();
    QSignalSpy ready(&ours, &widgets::GraphView::layoutReady);
    ours.setGraph(g);
    if (!ready.wait(120000)) return std::fprintf(stderr, "bench_graph_view: no layout\n"), 1;
    ours.expandAll();
    if (!ready.wait(300000)) return std::fprintf(stderr, "bench_graph_view: no expanded layout\n"), 1;
    auto* canvas = ours.findChild<QGraphicsView*>(QStringLiteral("graphCanvas"));
    if (!canvas || ours.visibleBoxes() != static_cast<int>(g.nodes.size())) {
        std::fprintf(stderr, "bench_graph_view: the view did not expand (%d boxes)\n", ours.visibleBoxes());
        return 1;
    }
    const auto gv = core::buildGraphView(g);
    const auto layout = core::layoutGraphView(gv);
    QGraphicsScene plainScene;
    plainScene.setItemIndexMethod(QGraphicsScene::BspTreeIndex);
    buildPlainScene(plainScene, gv, layout);
    plainScene.setSceneRect(QRectF(-20, -20, layout.width + 40, layout.height + 40));
    QGraphicsView plain(&plainScene);
    plain.setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
    plain.setBackgroundBrush(Qt::white);
    plain.resize(canvas->size());
    plain.show();
    QTest::qWait(50);

    std::printf("%zu ops, %zu edges, viewport %dx%d, %d frames of a 40-pixel pan\n", g.nodes.size(),
                g.edges.size(), canvas->viewport()->width(), canvas->viewport()->height(), frames);
    std::printf("%-10s  %12s  %12s  %12s  %12s  %14s\n", "zoom", "lathe p50 ms", "lathe p95 ms",
                "plain p50 ms", "plain p95 ms", "plain ÷ lathe");
    nlohmann::json results = nlohmann::json::array();
    for (const double zoom : {0.2, 1.0}) {
        for (QGraphicsView* v : {canvas, &plain}) {
            v->resetTransform();
            v->scale(zoom, zoom);
        }
        // Alternate the two, twice, and keep each one's better half.
        Frames a = pan(*canvas, frames), b = pan(plain, frames);
        const Frames a2 = pan(*canvas, frames), b2 = pan(plain, frames);
        if (a2.median < a.median) a = a2;
        if (b2.median < b.median) b = b2;
        std::printf("%-10s  %12.2f  %12.2f  %12.2f  %12.2f  %13.1f×\n", zoom < 1 ? "overview" : "1:1",
                    a.median, a.p95, b.median, b.p95, b.median / a.median);
        results.push_back({{"zoom", zoom},
                           {"lathe_median_ms", a.median},
                           {"lathe_p95_ms", a.p95},
                           {"plain_median_ms", b.median},
                           {"plain_p95_ms", b.p95}});
    }
    if (!outDir.empty()) {
        std::ofstream out(outDir + "/bench_graph_view.json");
        out << nlohmann::json{{"bench", "graph_view_pan"}, {"nodes", g.nodes.size()}, {"results", results}}
                   .dump(2)
            << "\n";
    }
    return 0;
}

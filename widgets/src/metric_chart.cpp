#include "lathe/widgets/metric_chart.h"

#include <QTimer>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

// Tableau 10: distinct in colour and in greyscale order, readable on white.
const QColor kRunColors[] = {QColor(0x1f, 0x77, 0xb4), QColor(0xff, 0x7f, 0x0e), QColor(0x2c, 0xa0, 0x2c),
                             QColor(0xd6, 0x27, 0x28), QColor(0x94, 0x67, 0xbd), QColor(0x8c, 0x56, 0x4b),
                             QColor(0xe3, 0x77, 0xc2), QColor(0x7f, 0x7f, 0x7f), QColor(0xbc, 0xbd, 0x22),
                             QColor(0x17, 0xbe, 0xcf)};
constexpr int kRunColorCount = int(sizeof(kRunColors) / sizeof(kRunColors[0]));

constexpr double kHoverRadiusPx = 24.0;
// Bounds the hover search at a million points: checking every n-th point in a 2·radius
// pixel window is as good as exhaustive at screen resolution.
constexpr int kHoverMaxChecks = 4000;

}  // namespace

MetricChart::MetricChart(const QString& title, const QStringList& keys, QWidget* parent)
    : ChartPanel(QStringLiteral("<b>%1</b>").arg(title.toHtmlEscaped()), false,
                 tr("Save this chart as PNG or PDF"), QStringLiteral("plot"), QSize(200, 140), parent),
      m_title(title),
      m_keys(keys) {
    // Draw solid lines as polylines without per-segment joins: the difference between a
    // millisecond and a second per replot at a million noisy points.
    m_plot->setPlottingHint(QCP::phFastPolylines, true);
    m_plot->xAxis->setLabel(tr("step"));
    m_plot->yAxis->setLabel(title);
    styleLegend();
    m_plot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);

    m_tracer = new QCPItemTracer(m_plot);
    m_tracer->setStyle(QCPItemTracer::tsCircle);
    m_tracer->setSize(9);
    m_tracer->setPen(QPen(Qt::black, 1.5));
    m_tracer->setBrush(Qt::NoBrush);
    m_tracer->setInterpolating(false);
    m_tracer->setVisible(false);

    m_emptyHint = new QCPItemText(m_plot);
    m_emptyHint->position->setType(QCPItemPosition::ptAxisRectRatio);
    m_emptyHint->position->setCoords(0.5, 0.5);
    m_emptyHint->setText(tr("No data — select runs or start training"));
    m_emptyHint->setColor(QColor(0x90, 0x90, 0x90));
    m_emptyHint->setClipToAxisRect(false);

    updateEmptyHint();
}

MetricChart::~MetricChart() = default;

QColor MetricChart::runColor(int64_t runId) {
    auto it = m_runColorIndex.find(runId);
    if (it == m_runColorIndex.end()) it = m_runColorIndex.emplace(runId, int(m_runColorIndex.size())).first;
    return kRunColors[it->second % kRunColorCount];
}

int MetricChart::keyStyleIndex(const std::string& key) {
    const QString k = QString::fromStdString(key);
    int i = int(m_keys.indexOf(k));
    if (i < 0) {
        m_keys << k;
        i = int(m_keys.size()) - 1;
    }
    return i;
}

QCPGraph* MetricChart::graph(int64_t runId, const std::string& key) const {
    auto it = m_graphs.find({runId, key});
    return it == m_graphs.end() ? nullptr : it->second;
}

QCPGraph* MetricChart::ensureGraph(int64_t runId, const std::string& key) {
    if (QCPGraph* g = graph(runId, key)) return g;
    QCPGraph* g = m_plot->addGraph();
    const QColor color = runColor(runId);
    const int style = keyStyleIndex(key);
    QPen pen(color);
    // Train curves are dense and solid; validation curves are sparse (one point per epoch),
    // so they get a dashed line with markers to read the individual evaluations.
    switch (style % 4) {
        // Width 1 keeps QPainter on its fast path: wider pens stroke a million-point zig-zag
        // as one path with joins, which costs seconds per replot.
        case 0:
            pen.setWidthF(1.0);
            break;
        case 1:
            pen.setWidthF(2.0);
            pen.setStyle(Qt::DashLine);
            g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, color, Qt::white, 5));
            break;
        case 2:
            pen.setWidthF(1.6);
            pen.setStyle(Qt::DotLine);
            break;
        default:
            pen.setWidthF(1.6);
            pen.setStyle(Qt::DashDotLine);
            break;
    }
    g->setPen(pen);
    g->setName(QStringLiteral("run %1 · %2").arg(runId).arg(QString::fromStdString(key)));
    g->setAdaptiveSampling(m_adaptiveSampling);
    m_graphs[{runId, key}] = g;
    return g;
}

void MetricChart::setSeries(int64_t runId, const std::string& key,
                            const std::vector<core::MetricPoint>& points) {
    QCPGraph* g = ensureGraph(runId, key);
    QVector<double> keys(qsizetype(points.size())), values(qsizetype(points.size()));
    bool sorted = true;
    for (size_t i = 0; i < points.size(); ++i) {
        keys[qsizetype(i)] = double(points[i].step);
        values[qsizetype(i)] = points[i].value;
        if (i > 0 && points[i].step < points[i - 1].step) sorted = false;
    }
    g->setData(keys, values, sorted);

    // Staged live points already covered by the history would draw twice.
    auto st = m_staged.find({runId, key});
    if (st != m_staged.end() && !points.empty()) {
        const int64_t last = points.back().step;
        auto& v = st->second;
        const auto before = v.size();
        v.erase(
            std::remove_if(v.begin(), v.end(), [last](const core::MetricPoint& p) { return p.step <= last; }),
            v.end());
        m_stagedCount -= int(before - v.size());
    }
    if (m_follow) applyAutoRange();
    updateEmptyHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void MetricChart::appendPoints(int64_t runId, const std::string& key, std::vector<core::MetricPoint> points) {
    if (points.empty()) return;
    auto& staged = m_staged[{runId, key}];
    m_stagedCount += int(points.size());
    if (staged.empty())
        staged = std::move(points);
    else
        staged.insert(staged.end(), points.begin(), points.end());
    if (!m_flushTimer->isActive()) m_flushTimer->start();
}

void MetricChart::appendPoint(int64_t runId, const std::string& key, int64_t step, double value) {
    core::MetricPoint p;
    p.step = step;
    p.value = value;
    appendPoints(runId, key, {p});
}

void MetricChart::flushStaged() {
    m_flushTimer->stop();
    if (m_staged.empty()) return;
    int moved = 0;
    for (auto& [series, points] : m_staged) {
        if (points.empty()) continue;
        QCPGraph* g = ensureGraph(series.first, series.second);
        QVector<double> keys(qsizetype(points.size())), values(qsizetype(points.size()));
        bool sorted = g->data()->isEmpty() || double(points.front().step) >= (g->data()->constEnd() - 1)->key;
        for (size_t i = 0; i < points.size(); ++i) {
            keys[qsizetype(i)] = double(points[i].step);
            values[qsizetype(i)] = points[i].value;
            if (i > 0 && points[i].step < points[i - 1].step) sorted = false;
        }
        g->addData(keys, values, sorted);
        moved += int(points.size());
    }
    m_staged.clear();
    m_stagedCount = 0;
    ++m_flushCount;
    if (m_follow) applyAutoRange();
    updateEmptyHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
    Q_EMIT flushed(moved);
}

void MetricChart::removeRun(int64_t runId) {
    bool removed = false;
    for (auto it = m_graphs.begin(); it != m_graphs.end();) {
        if (it->first.first != runId) {
            ++it;
            continue;
        }
        // The tracer keeps a raw pointer to its graph.
        if (m_tracer->graph() == it->second) {
            m_tracer->setGraph(nullptr);
            m_tracer->setVisible(false);
        }
        m_plot->removeGraph(it->second);
        it = m_graphs.erase(it);
        removed = true;
    }
    for (auto it = m_staged.begin(); it != m_staged.end();) {
        if (it->first.first == runId) {
            m_stagedCount -= int(it->second.size());
            it = m_staged.erase(it);
        } else {
            ++it;
        }
    }
    if (removed) {
        updateEmptyHint();
        m_plot->replot(QCustomPlot::rpQueuedReplot);
    }
}

void MetricChart::clear() {
    m_tracer->setGraph(nullptr);
    m_tracer->setVisible(false);
    m_plot->clearGraphs();
    m_graphs.clear();
    m_staged.clear();
    m_stagedCount = 0;
    m_runColorIndex.clear();
    m_follow = true;
    m_hoverText.clear();
    updateEmptyHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

int MetricChart::pointCount(int64_t runId, const std::string& key) const {
    QCPGraph* g = graph(runId, key);
    return g ? g->data()->size() : 0;
}

int MetricChart::stagedCount() const { return m_stagedCount; }

int MetricChart::graphCount() const { return int(m_graphs.size()); }

int64_t MetricChart::lastStep(int64_t runId, const std::string& key) const {
    QCPGraph* g = graph(runId, key);
    if (!g || g->data()->isEmpty()) return std::numeric_limits<int64_t>::min();
    return int64_t((g->data()->constEnd() - 1)->key);
}

int MetricChart::flushInterval() const { return m_flushTimer->interval(); }

void MetricChart::setAdaptiveSampling(bool on) {
    m_adaptiveSampling = on;
    for (auto& [series, g] : m_graphs) g->setAdaptiveSampling(on);
}

void MetricChart::applyAutoRange() {
    if (m_graphs.empty()) return;
    m_plot->rescaleAxes(true);
    // A little headroom so the extreme points are not glued to the frame.
    const QCPRange y = m_plot->yAxis->range();
    const double pad = y.size() > 0 ? y.size() * 0.05 : std::max(std::abs(y.center()) * 0.05, 1e-3);
    m_plot->yAxis->setRange(y.lower - pad, y.upper + pad);
}

void MetricChart::rescale() {
    m_follow = true;
    applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void MetricChart::updateEmptyHint() {
    const bool empty = m_graphs.empty();
    m_emptyHint->setVisible(empty);
    m_plot->legend->setVisible(!empty);
}

QPointF MetricChart::pixelFor(double step, double value) const {
    return {m_plot->xAxis->coordToPixel(step), m_plot->yAxis->coordToPixel(value)};
}

QString MetricChart::hoverAt(const QPointF& pos) {
    QCPGraph* best = nullptr;
    double bestDist = kHoverRadiusPx;
    double bestKey = 0, bestValue = 0;
    const QRect area = m_plot->axisRect()->rect();
    if (area.contains(pos.toPoint())) {
        const double k0 = m_plot->xAxis->pixelToCoord(pos.x() - kHoverRadiusPx);
        const double k1 = m_plot->xAxis->pixelToCoord(pos.x() + kHoverRadiusPx);
        for (const auto& [series, g] : m_graphs) {
            if (!g->visible()) continue;
            auto data = g->data();
            auto begin = data->findBegin(std::min(k0, k1), true);
            auto end = data->findEnd(std::max(k0, k1), true);
            const auto n = end - begin;
            const auto stride = std::max<decltype(n)>(1, n / kHoverMaxChecks);
            for (auto it = begin; it < end; it += stride) {
                const double dx = g->keyAxis()->coordToPixel(it->key) - pos.x();
                const double dy = g->valueAxis()->coordToPixel(it->value) - pos.y();
                const double d = std::sqrt(dx * dx + dy * dy);
                if (d < bestDist) {
                    bestDist = d;
                    best = g;
                    bestKey = it->key;
                    bestValue = it->value;
                }
            }
        }
    }
    QString text;
    if (best) {
        text = QStringLiteral("%1\nstep %2\nvalue %3")
                   .arg(best->name())
                   .arg(qint64(bestKey))
                   .arg(bestValue, 0, 'g', 6);
        m_tracer->setGraph(best);
        m_tracer->setGraphKey(bestKey);
        m_tracer->setVisible(true);
    }
    showHover(pos, text, m_tracer);
    return text;
}

void MetricChart::exportDialog() {
    exportWithDialog(tr("Export %1 chart").arg(m_title), m_title + QStringLiteral(".png"));
}

void MetricChart::setLegendAlignment(Qt::Alignment alignment) {
    m_plot->axisRect()->insetLayout()->setInsetAlignment(0, alignment);
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

}  // namespace lathe::widgets

#include "lathe/widgets/metric_chart.h"

#include <QLabel>
#include <QLocale>
#include <QTimer>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/run_overlay.h"

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
    : ChartPanel(QStringLiteral("<b>%1</b>").arg(title.toHtmlEscaped()), true,
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

    // Many runs are one image on a layer of their own, under the graphs of live runs.
    m_plot->addLayer(QStringLiteral("runs"), m_plot->layer(QStringLiteral("main")), QCustomPlot::limBelow);
    m_overlayLayer = new RunOverlayLayer(m_plot, m_plot->axisRect(), QStringLiteral("runs"));
    m_renderPool.setMaxThreadCount(1);
    m_overlayTimer = new QTimer(this);
    m_overlayTimer->setSingleShot(true);
    m_overlayTimer->setInterval(30);
    connect(m_overlayTimer, &QTimer::timeout, this, &MetricChart::startOverlayRender);
    for (QCPAxis* axis : {m_plot->xAxis, m_plot->yAxis})
        connect(axis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), this, [this] {
            if (m_overlay) scheduleOverlayRender();
        });
    // A resize shows up as a new axis-rect size after a replot.
    connect(m_plot, &QCustomPlot::afterReplot, this, [this] {
        if (m_overlay && !m_rendering && !m_overlayTimer->isActive() &&
            m_overlayLayer->frame().size != m_overlayLayer->currentFrame().size)
            scheduleOverlayRender();
    });

    updateEmptyHint();
}

MetricChart::~MetricChart() {
    if (m_renderCancel) *m_renderCancel = true;
    m_renderPool.waitForDone();
}

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
    clearOverlay();
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
    const bool overlay = m_overlay && m_overlay->hasBounds;
    if (m_graphs.empty() && !overlay) return;
    if (!m_graphs.empty()) m_plot->rescaleAxes(true);
    if (overlay) {
        QCPRange x(m_overlay->xMin, m_overlay->xMax), y(m_overlay->yMin, m_overlay->yMax);
        if (!m_graphs.empty()) {
            x.expand(m_plot->xAxis->range());
            y.expand(m_plot->yAxis->range());
        }
        if (x.size() <= 0) x = QCPRange(x.lower - 0.5, x.upper + 0.5);
        m_plot->xAxis->setRange(x);
        m_plot->yAxis->setRange(y);
    }
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
    const bool empty = m_graphs.empty() && !m_overlay;
    m_emptyHint->setVisible(empty);
    m_plot->legend->setVisible(!m_graphs.empty());
    QString line = m_overlayStatus.isEmpty() ? m_overlayNote : m_overlayStatus;
    if (m_summary->text() != line) m_summary->setText(line);
}

void MetricChart::setOverlay(std::shared_ptr<const OverlayData> data, std::vector<QRgb> colors,
                             const QString& note) {
    if (m_renderCancel) *m_renderCancel = true;
    ++m_overlayGeneration;
    m_overlay = std::move(data);
    m_overlayColors = std::move(colors);
    m_overlayNote = note;
    m_overlayDirty = true;
    m_overlayLayer->clearImage();
    if (m_follow) applyAutoRange();
    updateEmptyHint();
    scheduleOverlayRender();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void MetricChart::setOverlayColors(std::vector<QRgb> colors, const QString& note) {
    if (!m_overlay) return;
    m_overlayColors = std::move(colors);
    m_overlayNote = note;
    m_overlayDirty = true;
    updateEmptyHint();
    scheduleOverlayRender();
}

void MetricChart::clearOverlay() {
    if (m_renderCancel) *m_renderCancel = true;
    ++m_overlayGeneration;
    m_overlay.reset();
    m_overlayColors.clear();
    m_overlayNote.clear();
    m_overlayStatus.clear();
    m_overlayTimer->stop();
    m_renderAgain = false;
    m_overlayDirty = false;
    m_overlayLayer->clearImage();
    updateEmptyHint();
}

QString MetricChart::headerNote() const { return m_summary->text(); }

void MetricChart::setOverlayStatus(const QString& text) {
    m_overlayStatus = text;
    updateEmptyHint();
}

bool MetricChart::overlayCurrent() const {
    if (!m_overlay) return true;
    if (m_rendering || m_renderAgain || m_overlayDirty || m_overlayTimer->isActive() ||
        !m_overlayLayer->hasImage())
        return false;
    const OverlayFrame now = m_overlayLayer->currentFrame(), shown = m_overlayLayer->frame();
    return now.size == shown.size && now.x == shown.x && now.y == shown.y;
}

void MetricChart::scheduleOverlayRender() {
    if (!m_overlay) return;
    if (m_rendering) {
        m_renderAgain = true;
        return;
    }
    m_overlayTimer->start();
}

void MetricChart::startOverlayRender() {
    if (!m_overlay) return;
    if (m_rendering) {
        m_renderAgain = true;
        return;
    }
    const OverlayFrame frame = m_overlayLayer->currentFrame();
    if (frame.size.isEmpty()) return;  // not laid out yet: afterReplot asks again
    // Live graphs refit the axes on every flush, through intermediate ranges that end where they
    // were: the same frame with the same data and colours needs no new image.
    const OverlayFrame shown = m_overlayLayer->frame();
    if (!m_overlayDirty && m_overlayLayer->hasImage() && shown.size == frame.size && shown.x == frame.x &&
        shown.y == frame.y) {
        m_renderAgain = false;
        return;
    }
    m_rendering = true;
    m_renderAgain = false;
    m_overlayDirty = false;
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    m_renderCancel = cancel;
    const uint64_t generation = m_overlayGeneration;
    // The pool is waited for in the destructor, so `this` outlives the task.
    m_renderPool.start([this, data = m_overlay, colors = m_overlayColors, frame, cancel, generation] {
        QImage image;
        try {
            image = renderOverlay(*data, colors, frame, cancel.get());
        } catch (const std::exception&) {  // out of memory: no image; the next pan or zoom tries again
        }
        QMetaObject::invokeMethod(
            this,
            [this, image = std::move(image), frame, generation] {
                m_rendering = false;
                if (generation == m_overlayGeneration && !image.isNull()) {
                    m_overlayLayer->setImage(image, frame);
                    ++m_overlayRenders;
                    m_plot->replot(QCustomPlot::rpQueuedReplot);
                }
                if (m_overlay && (m_renderAgain || generation != m_overlayGeneration)) startOverlayRender();
            },
            Qt::QueuedConnection);
    });
}

QString MetricChart::overlayHover(const QPointF& pos) {
    // The nearest point of any overlaid curve within the hover radius: a binary search per curve
    // for the steps under the radius, then a bounded look at each.
    const OverlayData& d = *m_overlay;
    const double k0 = m_plot->xAxis->pixelToCoord(pos.x() - kHoverRadiusPx);
    const double k1 = m_plot->xAxis->pixelToCoord(pos.x() + kHoverRadiusPx);
    double bestDist = kHoverRadiusPx, bestX = 0, bestY = 0;
    const OverlayCurve* best = nullptr;
    for (const auto& c : d.curves) {
        const size_t b =
            size_t(std::lower_bound(c.x.begin(), c.x.end(), float(std::min(k0, k1))) - c.x.begin());
        const size_t e =
            size_t(std::upper_bound(c.x.begin() + b, c.x.end(), float(std::max(k0, k1))) - c.x.begin());
        const size_t stride = std::max<size_t>(1, (e - b) / 64);
        for (size_t i = b; i < e; i += stride) {
            if (!std::isfinite(c.y[i])) continue;
            const double dx = m_plot->xAxis->coordToPixel(c.x[i]) - pos.x();
            const double dy = m_plot->yAxis->coordToPixel(c.y[i]) - pos.y();
            const double dist = std::sqrt(dx * dx + dy * dy);
            if (dist < bestDist) {
                bestDist = dist;
                best = &c;
                bestX = c.x[i];
                bestY = c.y[i];
            }
        }
    }
    if (!best) return {};
    return QStringLiteral("run %1 · %2\nstep %3\nvalue %4")
        .arg(best->runId)
        .arg(QString::fromStdString(best->key))
        .arg(qint64(bestX))
        .arg(bestY, 0, 'g', 6);
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
    if (!best && m_overlay && area.contains(pos.toPoint())) {
        text = overlayHover(pos);
        m_tracer->setVisible(false);
    }
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

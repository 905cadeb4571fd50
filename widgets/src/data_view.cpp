#include "lathe/widgets/data_view.h"

#include <QLabel>
#include <QStringList>
#include <QTimer>
#include <QToolTip>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

constexpr double kHoverRadiusPx = 20.0;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const char* const kMetricNames[DataView::kMetricCount] = {"wait_ms",  "samples_per_s", "hit_memory",
                                                          "hit_disk", "hit_redis",     "skipped"};
const DataView::Metric kHitLevels[] = {DataView::Metric::HitMemory, DataView::Metric::HitDisk,
                                       DataView::Metric::HitRedis};

int metricIndex(DataView::Metric m) { return static_cast<int>(m); }

// The name of a cache level in the legend, hover and summary.
QString levelName(DataView::Metric m) {
    switch (m) {
        case DataView::Metric::HitMemory:
            return DataView::tr("memory");
        case DataView::Metric::HitDisk:
            return DataView::tr("disk");
        case DataView::Metric::HitRedis:
            return DataView::tr("redis");
        default:
            return {};
    }
}

QColor metricColor(DataView::Metric m) {
    // Tableau 10, as the other charts; the hit levels keep the order memory, disk, redis.
    switch (m) {
        case DataView::Metric::WaitMs:
            return {0x8c, 0x56, 0x4b};
        case DataView::Metric::SamplesPerS:
            return {0x2c, 0xa0, 0x2c};
        case DataView::Metric::HitMemory:
            return {0x1f, 0x77, 0xb4};
        case DataView::Metric::HitDisk:
            return {0xff, 0x7f, 0x0e};
        case DataView::Metric::HitRedis:
            return {0xd6, 0x27, 0x28};
        default:
            return Qt::gray;
    }
}

double meanOf(const QCPGraph* g) {
    if (!g || g->data()->isEmpty()) return kNaN;
    double sum = 0;
    int n = 0;
    for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
        if (std::isfinite(it->value)) {
            sum += it->value;
            ++n;
        }
    return n ? sum / n : kNaN;
}

double lastOf(const QCPGraph* g) {
    if (!g || g->data()->isEmpty()) return kNaN;
    return (g->data()->constEnd() - 1)->value;
}

// The value at exactly `step`, NaN when the graph has none there.
double valueAt(const QCPGraph* g, double step) {
    if (!g) return kNaN;
    auto it = g->data()->findBegin(step, false);
    if (it == g->data()->constEnd() || it->key != step) return kNaN;
    return it->value;
}

QString formatRate(double samplesPerS) {
    if (!std::isfinite(samplesPerS)) return QStringLiteral("—");
    return QString::number(samplesPerS, 'f', samplesPerS < 100 ? 1 : 0);
}

QString formatShare(double rate) {
    return std::isfinite(rate) ? QStringLiteral("%1%").arg(100.0 * rate, 0, 'f', 0) : QStringLiteral("—");
}

}  // namespace

std::optional<DataView::Metric> DataView::parseKey(const std::string& key) {
    if (key.rfind("data/", 0) != 0) return std::nullopt;
    const std::string name = key.substr(5);
    for (int i = 0; i < kMetricCount; ++i)
        if (name == kMetricNames[i]) return static_cast<Metric>(i);
    return std::nullopt;
}

std::string DataView::keyFor(Metric metric) {
    return std::string("data/") + kMetricNames[metricIndex(metric)];
}

bool DataView::isHitRate(Metric metric) {
    return metric == Metric::HitMemory || metric == Metric::HitDisk || metric == Metric::HitRedis;
}

DataView::DataView(QWidget* parent)
    : ChartPanel(tr("<b>Data</b>"), true, tr("Save these charts as PNG or PDF"), QStringLiteral("dataPlot"),
                 QSize(240, 260), parent) {
    m_summary->setObjectName(QStringLiteral("dataSummary"));

    // Top: how long each step waited for its batch. Below: loader throughput, cache hit rates.
    const auto rects = stackStepRects({3, 2, 2});
    m_waitRect = rects[0];
    m_rateRect = rects[1];
    m_hitRect = rects[2];

    m_waitRect->axis(QCPAxis::atLeft)->setLabel(tr("batch wait ms"));
    m_rateRect->axis(QCPAxis::atLeft)->setLabel(tr("samples / s"));
    QCPAxis* hitY = m_hitRect->axis(QCPAxis::atLeft);
    hitY->setLabel(tr("cache hit rate"));
    hitY->setRange(0, 1.05);
    QSharedPointer<QCPAxisTickerFixed> share(new QCPAxisTickerFixed);
    share->setTickStep(0.25);
    hitY->setTicker(share);

    // The legend names the cache levels, so it sits in their rect (bottom: rates are mostly high).
    styleLegend();
    m_plot->axisRect()->insetLayout()->take(m_plot->legend);
    m_hitRect->insetLayout()->addElement(m_plot->legend, Qt::AlignBottom | Qt::AlignRight);

    m_hint = makeHint(m_rateRect, QColor(0x70, 0x70, 0x70), true);
    m_hitHint = makeHint(m_hitRect, QColor(0x70, 0x70, 0x70), false);

    updateHint();
}

DataView::~DataView() = default;

QCPGraph* DataView::ensureGraph(Metric metric) {
    QCPGraph*& graph = m_graphs[metricIndex(metric)];
    if (graph || metric == Metric::Skipped) return graph;
    QCPAxisRect* rect = isHitRate(metric) ? m_hitRect : metric == Metric::WaitMs ? m_waitRect : m_rateRect;
    graph = m_plot->addGraph(rect->axis(QCPAxis::atBottom), rect->axis(QCPAxis::atLeft));
    graph->setAdaptiveSampling(true);
    const QColor color = metricColor(metric);
    graph->setPen(QPen(color, 1.3));
    if (isHitRate(metric)) {
        graph->setName(levelName(metric));
    } else {
        graph->setName(metric == Metric::WaitMs ? tr("batch wait") : tr("samples/s"));
        graph->removeFromLegend();  // the legend is the cache levels'
    }
    if (metric == Metric::WaitMs) {
        // Mostly zero with spikes where the loader fell behind: filled, so a spike stands out.
        QColor fill = color;
        fill.setAlpha(60);
        graph->setBrush(fill);
    }
    // Hit levels in a fixed order in the legend, whatever order their keys came in.
    if (isHitRate(metric) && m_plot->legend) {
        std::vector<QCPGraph*> levels;
        for (Metric m : kHitLevels)
            if (m_graphs[metricIndex(m)]) levels.push_back(m_graphs[metricIndex(m)]);
        for (QCPGraph* g : levels) g->removeFromLegend();
        for (QCPGraph* g : levels) g->addToLegend();
    }
    return graph;
}

QCPGraph* DataView::graph(Metric metric) const { return m_graphs[metricIndex(metric)]; }

int DataView::pointCount(Metric metric) const {
    if (metric == Metric::Skipped) return int(m_skipped.size());
    QCPGraph* g = graph(metric);
    return g ? g->data()->size() : 0;
}

int DataView::graphCount() const {
    int n = 0;
    for (QCPGraph* g : m_graphs)
        if (g && !g->data()->isEmpty()) ++n;
    return n;
}

std::vector<DataView::Metric> DataView::hitLevels() const {
    std::vector<Metric> out;
    for (Metric m : kHitLevels)
        if (pointCount(m) > 0) out.push_back(m);
    return out;
}

bool DataView::hasDataMetrics() const { return graphCount() > 0 || !m_skipped.empty(); }

QString DataView::placeholderText() const { return m_hint->visible() ? m_hint->text() : QString(); }

QString DataView::hitPlaceholderText() const { return m_hitHint->visible() ? m_hitHint->text() : QString(); }

QString DataView::summaryText() const { return m_summary->text(); }

void DataView::clear() {
    m_runId = 0;
    // Graphs exist per metric the run recorded (a hit line per enabled cache level): drop them.
    for (QCPGraph*& g : m_graphs) {
        if (g) m_plot->removeGraph(g);
        g = nullptr;
    }
    m_skipped.clear();
    m_live.resetShown();
    m_follow = true;
    m_hoverText.clear();
    // Neutral ranges, so a placeholder never sits on the previous run's scales.
    m_waitRect->axis(QCPAxis::atBottom)->setRange(0, 10);
    m_waitRect->axis(QCPAxis::atLeft)->setRange(0, 1);
    m_rateRect->axis(QCPAxis::atLeft)->setRange(0, 1);
    m_titleLabel->setText(tr("<b>Data</b>"));
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString DataView::tabTitle() const { return tr("Data"); }

QString DataView::tabToolTip() const {
    return tr(
        "The training data loader of the first selected run: batch wait per step, samples/s and "
        "cache hit rates");
}

void DataView::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    const int64_t first = runIds.empty() ? 0 : runIds.front();
    if (first != 0 && first == m_runId) return;  // live points keep it current
    showRun(store, first);
}

void DataView::showRun(const core::Store& store, int64_t runId) {
    clear();
    m_runId = runId;
    if (runId <= 0) return;
    m_titleLabel->setText(tr("<b>Data · run %1</b>").arg(runId));
    std::vector<std::string> keys;
    for (const auto& key : store.metricKeys(runId))
        if (parseKey(key)) keys.push_back(key);
    // Live keys the store writer has not committed a first point of yet.
    for (const auto& key : m_live.liveKeys(runId))
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    for (const auto& key : keys) addPoints(*parseKey(key), m_live.load(store, runId, key));
    if (m_follow) applyAutoRange();
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void DataView::addPoints(Metric metric, const std::vector<core::MetricPoint>& points) {
    if (points.empty()) return;
    if (metric == Metric::Skipped) {
        // A count, not a line: kept by step for the summary and the hover.
        for (const auto& p : points) {
            const double step = double(p.step);
            auto it =
                std::lower_bound(m_skipped.begin(), m_skipped.end(), step,
                                 [](const std::pair<double, double>& a, double s) { return a.first < s; });
            if (it != m_skipped.end() && it->first == step)
                it->second = p.value;
            else
                m_skipped.insert(it, {step, p.value});
        }
        return;
    }
    QVector<double> keys, values;
    keys.reserve(qsizetype(points.size()));
    values.reserve(qsizetype(points.size()));
    for (const auto& p : points) {
        keys << double(p.step);
        values << (std::isfinite(p.value) ? p.value : kNaN);
    }
    ensureGraph(metric)->addData(keys, values, true);
}

double DataView::skippedAt(double step) const {
    // Recorded only once non-zero and cumulative: the last count at or before the step.
    auto it = std::upper_bound(m_skipped.begin(), m_skipped.end(), step,
                               [](double s, const std::pair<double, double>& a) { return s < a.first; });
    return it == m_skipped.begin() ? 0.0 : std::prev(it)->second;
}

void DataView::onEvents(int64_t runId, const std::vector<core::Event>& events) {
    m_live.add(runId, m_runId, events, [](const std::string& key) { return parseKey(key).has_value(); });
    if (m_live.stagedCount() > 0 && !m_flushTimer->isActive()) m_flushTimer->start();
}

void DataView::forgetLive(int64_t runId) { m_live.forget(runId); }

void DataView::flushStaged() {
    m_flushTimer->stop();
    if (m_live.stagedCount() == 0) return;
    const int moved = m_live.stagedCount();
    for (auto& [key, points] : m_live.takeStaged()) addPoints(*parseKey(key), points);
    ++m_flushCount;
    if (m_follow) applyAutoRange();
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
    Q_EMIT flushed(moved);
}

void DataView::applyAutoRange() {
    bool found = false;
    QCPRange keys;
    auto widen = [&](const QCPRange& r) {
        keys = found ? QCPRange(std::min(keys.lower, r.lower), std::max(keys.upper, r.upper)) : r;
        found = true;
    };
    for (QCPGraph* g : m_graphs) {
        if (!g) continue;
        bool ok = false;
        const QCPRange r = g->getKeyRange(ok);
        if (ok) widen(r);
    }
    if (!m_skipped.empty()) widen(QCPRange(m_skipped.front().first, m_skipped.back().first));
    if (!found) return;
    const double pad = std::max(1.0, keys.size() * 0.02);
    m_waitRect->axis(QCPAxis::atBottom)->setRange(keys.lower - pad, keys.upper + pad);

    // Waits and throughput start at zero, so a drop reads as a drop; a run that never waited
    // keeps a 0..1 ms axis rather than a degenerate one.
    auto fitFromZero = [](QCPGraph* g, QCPAxis* axis) {
        if (!g) return;
        bool ok = false;
        const QCPRange r = g->getValueRange(ok, QCP::sdBoth);
        if (ok) axis->setRange(0, r.upper > 0 ? r.upper * 1.1 : 1.0);
    };
    fitFromZero(graph(Metric::WaitMs), m_waitRect->axis(QCPAxis::atLeft));
    fitFromZero(graph(Metric::SamplesPerS), m_rateRect->axis(QCPAxis::atLeft));
    m_hitRect->axis(QCPAxis::atLeft)->setRange(0, 1.05);
}

void DataView::rescale() {
    m_follow = true;
    applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void DataView::updateHint() {
    QString hint;
    if (m_runId <= 0)
        hint = tr("No run selected");
    else if (!hasDataMetrics())
        hint = tr("Run %1 recorded no data-loader metrics (runs trained before this version of Lathe do "
                  "not have them).\nTrain it again to see its batch wait, samples/s and cache hit rates "
                  "per step.")
                   .arg(m_runId);
    else if (graphCount() == 0)
        hint = tr("Run %1 recorded only skipped samples, no per-step loader figures.").arg(m_runId);
    m_hint->setText(hint);
    m_hint->setVisible(!hint.isEmpty());
    m_plot->legend->setVisible(hint.isEmpty() && !hitLevels().empty());
    // Hit rates are recorded only for the cache levels a run enabled.
    const bool noCache = hint.isEmpty() && hitLevels().empty();
    m_hitHint->setText(noCache ? tr("No sample cache enabled in this run") : QString());
    m_hitHint->setVisible(noCache);

    QString summary;
    if (hasDataMetrics()) {
        QStringList parts;
        const double wait = meanOf(graph(Metric::WaitMs));
        if (std::isfinite(wait)) parts << tr("wait %1 ms/step").arg(wait, 0, 'f', 2);
        const double rate = meanOf(graph(Metric::SamplesPerS));
        if (std::isfinite(rate)) parts << tr("%1 samples/s").arg(formatRate(rate));
        QStringList hits;
        for (Metric m : hitLevels()) hits << tr("%1 %2").arg(levelName(m), formatShare(lastOf(graph(m))));
        if (!hits.isEmpty()) parts << tr("hits: %1").arg(hits.join(QStringLiteral(", ")));
        const double skipped = skippedCount();
        if (skipped > 0)
            parts << (skipped == 1 ? tr("1 sample skipped") : tr("%1 samples skipped").arg(qint64(skipped)));
        summary = parts.join(QStringLiteral(" · "));
    }
    m_summary->setText(summary);
}

QString DataView::hoverAt(const QPointF& pos) {
    QString text;
    QCPAxisRect* rect = nullptr;
    for (QCPAxisRect* r : {m_waitRect, m_rateRect, m_hitRect})
        if (r->rect().contains(pos.toPoint())) rect = r;
    std::vector<QCPGraph*> all;
    for (QCPGraph* g : m_graphs)
        if (g) all.push_back(g);
    if (rect && !all.empty()) {
        const double best = nearestKey(all, rect->axis(QCPAxis::atBottom), pos.x(), kHoverRadiusPx);
        if (std::isfinite(best)) {
            text = tr("run %1 · step %2").arg(m_runId).arg(qint64(best));
            const double wait = valueAt(graph(Metric::WaitMs), best);
            const double rate = valueAt(graph(Metric::SamplesPerS), best);
            if (std::isfinite(wait)) text += tr("\nwaited %1 ms for the batch").arg(wait, 0, 'f', 2);
            if (std::isfinite(rate)) text += tr("\n%1 samples/s").arg(formatRate(rate));
            QStringList hits;
            for (Metric m : hitLevels()) {
                const double v = valueAt(graph(m), best);
                if (std::isfinite(v)) hits << tr("%1 %2").arg(levelName(m), formatShare(v));
            }
            if (!hits.isEmpty()) text += tr("\nhits: %1").arg(hits.join(QStringLiteral(", ")));
            const double skipped = skippedAt(best);
            if (skipped > 0) text += tr("\n%1 skipped so far").arg(qint64(skipped));
        }
    }
    if (!text.isEmpty())
        QToolTip::showText(m_plot->mapToGlobal(pos.toPoint()), text, m_plot);
    else if (!m_hoverText.isEmpty())
        QToolTip::hideText();
    m_hoverText = text;
    return text;
}

void DataView::exportDialog() {
    exportWithDialog(tr("Export data-loader charts"),
                     m_runId ? QStringLiteral("run-%1-data.png").arg(m_runId) : QStringLiteral("data.png"));
}

}  // namespace lathe::widgets

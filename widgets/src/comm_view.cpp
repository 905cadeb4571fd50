#include "lathe/widgets/comm_view.h"

#include <QLabel>
#include <QTimer>
#include <QToolTip>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

constexpr double kHoverRadiusPx = 20.0;
// Bytes are drawn in KiB: the models trained here send kilobytes to megabytes per step, and
// a KiB axis keeps tick labels short without a unit switch mid-run.
constexpr double kBytesPerUnit = 1024.0;

const char* const kMetricNames[CommView::kMetricCount] = {
    "ms", "overlap", "bytes_sent", "compression_ratio", "bubble", "forward_ms", "backward_ms"};

int metricIndex(CommView::Metric m) { return static_cast<int>(m); }

bool isStage(int series) { return series >= CommView::kStageSeries; }

// The figures a rank's or a stage's series has.
bool hasMetric(int series, CommView::Metric m) {
    using M = CommView::Metric;
    if (isStage(series))
        return m == M::Bubble || m == M::ForwardMs || m == M::BackwardMs || m == M::BytesSent;
    return m == M::Ms || m == M::Overlap || m == M::BytesSent || m == M::CompressionRatio;
}

bool allDigits(const std::string& s) {
    return !s.empty() && s.size() <= 6 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

QString formatBytes(double b) {
    if (!std::isfinite(b)) return QStringLiteral("—");
    if (b >= 1024.0 * 1024.0) return QStringLiteral("%1 MiB").arg(b / (1024.0 * 1024.0), 0, 'f', 2);
    if (b >= 1024.0) return QStringLiteral("%1 KiB").arg(b / 1024.0, 0, 'f', 1);
    return QStringLiteral("%1 B").arg(b, 0, 'f', 0);
}

double meanOf(const QCPGraph* g) {
    if (!g || g->data()->isEmpty()) return std::numeric_limits<double>::quiet_NaN();
    double sum = 0;
    int n = 0;
    for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
        if (std::isfinite(it->value)) {
            sum += it->value;
            ++n;
        }
    return n ? sum / n : std::numeric_limits<double>::quiet_NaN();
}

// The value at exactly `step`, NaN when the graph has none there.
double valueAt(const QCPGraph* g, double step) {
    if (!g) return std::numeric_limits<double>::quiet_NaN();
    auto it = g->data()->findBegin(step, false);
    if (it == g->data()->constEnd() || it->key != step) return std::numeric_limits<double>::quiet_NaN();
    return it->value;
}

}  // namespace

std::optional<std::pair<int, CommView::Metric>> CommView::parseKey(const std::string& key) {
    if (key.rfind("pipe/stage", 0) == 0) {
        const size_t slash = key.find('/', 10);
        if (slash == std::string::npos || !allDigits(key.substr(10, slash - 10))) return std::nullopt;
        const int stage = std::stoi(key.substr(10, slash - 10));
        const std::string name = key.substr(slash + 1);
        for (Metric m : {Metric::Bubble, Metric::ForwardMs, Metric::BackwardMs, Metric::BytesSent})
            if (name == kMetricNames[metricIndex(m)]) return std::make_pair(kStageSeries + stage, m);
        return std::nullopt;
    }
    int rank = 0;
    std::string rest = key;
    if (key.rfind("rank", 0) == 0) {
        const size_t slash = key.find('/');
        if (slash == std::string::npos || slash == 4) return std::nullopt;
        const std::string digits = key.substr(4, slash - 4);
        if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
            digits.size() > 6)
            return std::nullopt;
        rank = std::stoi(digits);
        if (rank >= kStageSeries) return std::nullopt;
        rest = key.substr(slash + 1);
    }
    if (rest.rfind("comm/", 0) != 0) return std::nullopt;
    const std::string name = rest.substr(5);
    for (int i = 0; i < kMetricCount; ++i)
        if (name == kMetricNames[i] && hasMetric(rank, static_cast<Metric>(i)))
            return std::make_pair(rank, static_cast<Metric>(i));
    return std::nullopt;
}

std::string CommView::keyFor(int rank, Metric metric) {
    if (isStage(rank))
        return "pipe/stage" + std::to_string(rank - kStageSeries) + "/" + kMetricNames[metricIndex(metric)];
    std::string k = std::string("comm/") + kMetricNames[metricIndex(metric)];
    return rank == 0 ? k : "rank" + std::to_string(rank) + "/" + k;
}

QColor CommView::rankColor(int rank) {
    // Tableau 10: distinct on screen and in print; beyond ten ranks hues repeat darker.
    static const QColor palette[] = {
        {0x1f, 0x77, 0xb4}, {0xff, 0x7f, 0x0e}, {0x2c, 0xa0, 0x2c}, {0xd6, 0x27, 0x28}, {0x94, 0x67, 0xbd},
        {0x8c, 0x56, 0x4b}, {0xe3, 0x77, 0xc2}, {0x7f, 0x7f, 0x7f}, {0xbc, 0xbd, 0x22}, {0x17, 0xbe, 0xcf}};
    const int n = int(std::size(palette));
    const QColor c = palette[rank % n];
    return rank < n ? c : c.darker(100 + 30 * (rank / n));
}

CommView::CommView(QWidget* parent)
    : ChartPanel(tr("<b>Communication</b>"), true, tr("Save these charts as PNG or PDF"),
                 QStringLiteral("commPlot"), QSize(240, 260), parent) {
    m_summary->setObjectName(QStringLiteral("commSummary"));

    // Top: communication time per step. Bottom two: overlap share and bytes on the wire.
    const auto rects = stackStepRects({3, 2, 2});
    m_msRect = rects[0];
    m_overlapRect = rects[1];
    m_bytesRect = rects[2];
    // The right axis of every rect is shown so the margins line up with the bytes rect, whose
    // right axis carries the compression ratio.
    m_msRect->axis(QCPAxis::atRight)->setVisible(true);
    m_msRect->axis(QCPAxis::atRight)->setTickLabels(false);
    m_overlapRect->axis(QCPAxis::atRight)->setVisible(true);
    m_overlapRect->axis(QCPAxis::atRight)->setTickLabels(false);

    m_msRect->axis(QCPAxis::atLeft)->setLabel(tr("ms / step"));
    QCPAxis* overlapY = m_overlapRect->axis(QCPAxis::atLeft);
    overlapY->setLabel(tr("overlap · bubble"));
    overlapY->setRange(0, 1.05);
    QSharedPointer<QCPAxisTickerFixed> share(new QCPAxisTickerFixed);
    share->setTickStep(0.25);
    overlapY->setTicker(share);
    m_bytesRect->axis(QCPAxis::atLeft)->setLabel(tr("KiB sent / step"));
    QCPAxis* ratioY = m_bytesRect->axis(QCPAxis::atRight);
    ratioY->setVisible(true);
    ratioY->setLabel(tr("compression ×  (dashed)"));

    styleLegend();
    m_msRect->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignRight);

    m_hint = makeHint(m_overlapRect, QColor(0x70, 0x70, 0x70), true);

    updateHint();
}

CommView::~CommView() = default;

CommView::RankGraphs& CommView::ensureRank(int rank) {
    auto it = m_ranks.find(rank);
    if (it != m_ranks.end()) return it->second;
    RankGraphs g;
    const bool stage = isStage(rank);
    // Stages take the palette from its far end, so stage 0 and rank 0 differ in a run with both.
    const QColor color = stage ? rankColor(9 - (rank - kStageSeries) % 10) : rankColor(rank);
    const QString name = stage ? tr("stage %1").arg(rank - kStageSeries) : tr("rank %1").arg(rank);
    auto add = [&](Metric m, QCPAxisRect* r, QCPAxis::AxisType value) {
        g.graphs[metricIndex(m)] = m_plot->addGraph(r->axis(QCPAxis::atBottom), r->axis(value));
    };
    if (stage) {
        add(Metric::BackwardMs, m_msRect, QCPAxis::atLeft);
        add(Metric::ForwardMs, m_msRect, QCPAxis::atLeft);
        add(Metric::Bubble, m_overlapRect, QCPAxis::atLeft);
    } else {
        add(Metric::Ms, m_msRect, QCPAxis::atLeft);
        add(Metric::Overlap, m_overlapRect, QCPAxis::atLeft);
        add(Metric::CompressionRatio, m_bytesRect, QCPAxis::atRight);
    }
    add(Metric::BytesSent, m_bytesRect, QCPAxis::atLeft);
    // One legend entry per rank or stage (its colour is the same everywhere).
    const Metric legendMetric = stage ? Metric::BackwardMs : Metric::Ms;
    for (int i = 0; i < kMetricCount; ++i) {
        QCPGraph* graph = g.graphs[i];
        if (!graph) continue;
        graph->setName(stage && static_cast<Metric>(i) == Metric::BackwardMs
                           ? tr("%1 (backward; forward dotted)").arg(name)
                           : name);
        graph->setAdaptiveSampling(true);
        QPen pen(color, 1.3);
        if (static_cast<Metric>(i) == Metric::CompressionRatio) {
            pen.setStyle(Qt::DashLine);
            graph->setLineStyle(QCPGraph::lsStepLeft);  // the ratio is piecewise constant
        }
        if (static_cast<Metric>(i) == Metric::ForwardMs) pen.setStyle(Qt::DotLine);
        graph->setPen(pen);
        if (static_cast<Metric>(i) != legendMetric) graph->removeFromLegend();
    }
    return m_ranks.emplace(rank, g).first->second;
}

std::vector<int> CommView::ranks() const {
    std::vector<int> out;
    for (const auto& [rank, g] : m_ranks)
        if (!isStage(rank)) out.push_back(rank);
    return out;
}

std::vector<int> CommView::stages() const {
    std::vector<int> out;
    for (const auto& [series, g] : m_ranks)
        if (isStage(series)) out.push_back(series - kStageSeries);
    return out;
}

QCPGraph* CommView::graph(int rank, Metric metric) const {
    auto it = m_ranks.find(rank);
    return it == m_ranks.end() ? nullptr : it->second.graphs[metricIndex(metric)];
}

int CommView::pointCount(int rank, Metric metric) const {
    QCPGraph* g = graph(rank, metric);
    return g ? g->data()->size() : 0;
}

int CommView::graphCount() const {
    int n = 0;
    for (const auto& [rank, g] : m_ranks)
        for (QCPGraph* graph : g.graphs)
            if (graph && !graph->data()->isEmpty()) ++n;
    return n;
}

bool CommView::hasCommData() const { return graphCount() > 0; }

QString CommView::placeholderText() const { return m_hint->visible() ? m_hint->text() : QString(); }

QString CommView::summaryText() const { return m_summary->text(); }

void CommView::clear() {
    m_runId = 0;
    // Graphs are per rank and the next run may have another world size: drop them.
    for (auto& [rank, g] : m_ranks)
        for (QCPGraph* graph : g.graphs)
            if (graph) m_plot->removeGraph(graph);
    m_ranks.clear();
    m_live.resetShown();
    m_follow = true;
    m_hoverText.clear();
    // Neutral ranges, so a placeholder never sits on the previous run's scales.
    m_msRect->axis(QCPAxis::atBottom)->setRange(0, 10);
    m_msRect->axis(QCPAxis::atLeft)->setRange(0, 1);
    m_bytesRect->axis(QCPAxis::atLeft)->setRange(0, 1);
    m_bytesRect->axis(QCPAxis::atRight)->setRange(0, 1);
    m_titleLabel->setText(tr("<b>Communication</b>"));
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString CommView::tabTitle() const { return tr("Communication"); }

QString CommView::tabToolTip() const {
    return tr(
        "Communication per step of the first selected run: gradient exchange per rank (data parallel), "
        "compute, bubble and traffic per stage (pipeline parallel)");
}

void CommView::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    const int64_t first = runIds.empty() ? 0 : runIds.front();
    if (first != 0 && first == m_runId) return;  // live points keep it current
    showRun(store, first);
}

void CommView::showRun(const core::Store& store, int64_t runId) {
    clear();
    m_runId = runId;
    if (runId <= 0) return;
    m_titleLabel->setText(tr("<b>Communication · run %1</b>").arg(runId));
    std::vector<std::string> keys;
    for (const auto& key : store.metricKeys(runId))
        if (parseKey(key)) keys.push_back(key);
    // Live keys the store writer has not committed a first point of yet.
    for (const auto& key : m_live.liveKeys(runId))
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    for (const auto& key : keys) {
        const auto parsed = parseKey(key);
        addPoints(parsed->first, parsed->second, m_live.load(store, runId, key));
    }
    if (m_follow) applyAutoRange();
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void CommView::addPoints(int rank, Metric metric, const std::vector<core::MetricPoint>& points) {
    if (points.empty()) return;
    QVector<double> keys, values;
    keys.reserve(qsizetype(points.size()));
    values.reserve(qsizetype(points.size()));
    const double div = metric == Metric::BytesSent ? kBytesPerUnit : 1.0;
    for (const auto& p : points) {
        keys << double(p.step);
        values << (std::isfinite(p.value) ? p.value / div : std::numeric_limits<double>::quiet_NaN());
    }
    QCPGraph* g = ensureRank(rank).graphs[metricIndex(metric)];
    if (g) g->addData(keys, values, true);
}

void CommView::onEvents(int64_t runId, const std::vector<core::Event>& events) {
    m_live.add(runId, m_runId, events, [](const std::string& key) { return parseKey(key).has_value(); });
    if (m_live.stagedCount() > 0 && !m_flushTimer->isActive()) m_flushTimer->start();
}

void CommView::forgetLive(int64_t runId) { m_live.forget(runId); }

void CommView::flushStaged() {
    m_flushTimer->stop();
    if (m_live.stagedCount() == 0) return;
    const int moved = m_live.stagedCount();
    for (auto& [key, points] : m_live.takeStaged()) {
        const auto parsed = parseKey(key);
        addPoints(parsed->first, parsed->second, points);
    }
    ++m_flushCount;
    if (m_follow) applyAutoRange();
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
    Q_EMIT flushed(moved);
}

void CommView::applyAutoRange() {
    bool found = false;
    QCPRange keys;
    auto valueRange = [this](std::initializer_list<Metric> metrics, bool& any) {
        QCPRange out;
        any = false;
        for (const auto& [rank, g] : m_ranks)
            for (Metric m : metrics) {
                QCPGraph* graph = g.graphs[metricIndex(m)];
                if (!graph) continue;
                bool ok = false;
                const QCPRange r = graph->getValueRange(ok, QCP::sdBoth);
                if (!ok) continue;
                out = any ? QCPRange(std::min(out.lower, r.lower), std::max(out.upper, r.upper)) : r;
                any = true;
            }
        return out;
    };
    for (const auto& [rank, g] : m_ranks)
        for (QCPGraph* graph : g.graphs) {
            if (!graph) continue;
            bool ok = false;
            const QCPRange r = graph->getKeyRange(ok);
            if (!ok) continue;
            keys = found ? QCPRange(std::min(keys.lower, r.lower), std::max(keys.upper, r.upper)) : r;
            found = true;
        }
    if (!found) return;
    const double pad = std::max(1.0, keys.size() * 0.02);
    m_msRect->axis(QCPAxis::atBottom)->setRange(keys.lower - pad, keys.upper + pad);

    // Times, bytes and ratios start at zero so ranks compare by height.
    bool ok = false;
    QCPRange r = valueRange({Metric::Ms, Metric::ForwardMs, Metric::BackwardMs}, ok);
    if (ok) m_msRect->axis(QCPAxis::atLeft)->setRange(0, r.upper > 0 ? r.upper * 1.1 : 1.0);
    r = valueRange({Metric::BytesSent}, ok);
    if (ok) m_bytesRect->axis(QCPAxis::atLeft)->setRange(0, r.upper > 0 ? r.upper * 1.15 : 1.0);
    r = valueRange({Metric::CompressionRatio}, ok);
    if (ok) m_bytesRect->axis(QCPAxis::atRight)->setRange(0, std::max(1.0, r.upper) * 1.7);
    m_overlapRect->axis(QCPAxis::atLeft)->setRange(0, 1.05);
}

void CommView::rescale() {
    m_follow = true;
    applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void CommView::updateHint() {
    QString hint;
    if (m_runId <= 0)
        hint = tr("No run selected");
    else if (!hasCommData())
        hint = tr("Run %1 ran in one process — no gradient communication to show.\n"
                  "Set Processes > 1 (Distributed) to train data-parallel, or pipeline stages > 1.")
                   .arg(m_runId);
    m_hint->setText(hint);
    m_hint->setVisible(!hint.isEmpty());
    m_plot->legend->setVisible(hint.isEmpty());

    QString summary;
    if (hasCommData()) {
        // Means over all ranks: what an engineer compares between runs.
        double ms = 0, overlap = 0, bytes = 0, bubble = 0, stageBytes = 0;
        int nMs = 0, nOverlap = 0, nBytes = 0, nBubble = 0, nStageBytes = 0;
        double ratio = std::numeric_limits<double>::quiet_NaN();
        for (const auto& [rank, g] : m_ranks) {
            if (isStage(rank)) {
                const double b = meanOf(g.graphs[metricIndex(Metric::Bubble)]);
                const double kb = meanOf(g.graphs[metricIndex(Metric::BytesSent)]);
                if (std::isfinite(b)) bubble += b, ++nBubble;
                if (std::isfinite(kb)) stageBytes += kb, ++nStageBytes;
                continue;
            }
            const double m = meanOf(g.graphs[metricIndex(Metric::Ms)]);
            const double o = meanOf(g.graphs[metricIndex(Metric::Overlap)]);
            const double b = meanOf(g.graphs[metricIndex(Metric::BytesSent)]);
            if (std::isfinite(m)) ms += m, ++nMs;
            if (std::isfinite(o)) overlap += o, ++nOverlap;
            if (std::isfinite(b)) bytes += b, ++nBytes;
            const QCPGraph* rg = g.graphs[metricIndex(Metric::CompressionRatio)];
            if (rank == ranks().front() && !rg->data()->isEmpty())
                ratio = (rg->data()->constEnd() - 1)->value;
        }
        QStringList parts;
        const auto rankN = ranks().size(), stageN = stages().size();
        if (stageN > 0) {
            parts << tr("%1 stages").arg(stageN);
            if (nBubble) parts << tr("bubble %1%").arg(100.0 * bubble / nBubble, 0, 'f', 0);
            if (nStageBytes)
                parts << tr("%1/step between stages").arg(formatBytes(stageBytes * kBytesPerUnit));
        }
        if (rankN > 0) parts << (rankN == 1 ? tr("1 rank") : tr("%1 ranks").arg(rankN));
        if (nMs) parts << tr("comm %1 ms/step").arg(ms / nMs, 0, 'f', 2);
        if (nOverlap) parts << tr("%1% hidden").arg(100.0 * overlap / nOverlap, 0, 'f', 0);
        if (nBytes) parts << tr("%1/step").arg(formatBytes(bytes / nBytes * kBytesPerUnit));
        if (std::isfinite(ratio))
            parts << (std::abs(ratio - 1.0) < 0.005 ? tr("uncompressed")
                                                    : tr("%1× fewer bytes than fp32").arg(ratio, 0, 'f', 2));
        summary = parts.join(QStringLiteral(" · "));
    }
    m_summary->setText(summary);
}

QString CommView::hoverAt(const QPointF& pos) {
    QString text;
    QCPAxisRect* rect = nullptr;
    for (QCPAxisRect* r : {m_msRect, m_overlapRect, m_bytesRect})
        if (r->rect().contains(pos.toPoint())) rect = r;
    if (rect && !m_ranks.empty()) {
        QCPAxis* x = rect->axis(QCPAxis::atBottom);
        // The nearest step any rank reported.
        std::vector<QCPGraph*> all;
        for (const auto& [rank, g] : m_ranks)
            for (QCPGraph* graph : g.graphs)
                if (graph) all.push_back(graph);
        const double best = nearestKey(all, x, pos.x(), kHoverRadiusPx);
        if (std::isfinite(best)) {
            text = tr("run %1 · step %2").arg(m_runId).arg(qint64(best));
            for (const auto& [rank, g] : m_ranks) {
                if (isStage(rank)) {
                    const double bu = valueAt(g.graphs[metricIndex(Metric::Bubble)], best);
                    const double fw = valueAt(g.graphs[metricIndex(Metric::ForwardMs)], best);
                    const double bw = valueAt(g.graphs[metricIndex(Metric::BackwardMs)], best);
                    const double kb = valueAt(g.graphs[metricIndex(Metric::BytesSent)], best);
                    auto num = [](double v, int prec) {
                        return std::isfinite(v) ? QString::number(v, 'f', prec) : QStringLiteral("—");
                    };
                    text += tr("\nstage %1: forward %2 ms · backward %3 ms · bubble %4% · %5")
                                .arg(rank - kStageSeries)
                                .arg(num(fw, 3))
                                .arg(num(bw, 3))
                                .arg(num(100 * bu, 0))
                                .arg(formatBytes(kb * kBytesPerUnit));
                    continue;
                }
                const double ms = valueAt(g.graphs[metricIndex(Metric::Ms)], best);
                const double ov = valueAt(g.graphs[metricIndex(Metric::Overlap)], best);
                const double kb = valueAt(g.graphs[metricIndex(Metric::BytesSent)], best);
                const double cr = valueAt(g.graphs[metricIndex(Metric::CompressionRatio)], best);
                text += tr("\nrank %1: %2 ms · %3% hidden · %4 · %5×")
                            .arg(rank)
                            .arg(std::isfinite(ms) ? QString::number(ms, 'f', 3) : QStringLiteral("—"))
                            .arg(std::isfinite(ov) ? QString::number(100 * ov, 'f', 0) : QStringLiteral("—"))
                            .arg(formatBytes(kb * kBytesPerUnit))
                            .arg(std::isfinite(cr) ? QString::number(cr, 'f', 2) : QStringLiteral("—"));
            }
        }
    }
    if (!text.isEmpty())
        QToolTip::showText(m_plot->mapToGlobal(pos.toPoint()), text, m_plot);
    else if (!m_hoverText.isEmpty())
        QToolTip::hideText();
    m_hoverText = text;
    return text;
}

void CommView::exportDialog() {
    exportWithDialog(tr("Export communication charts"),
                     m_runId ? QStringLiteral("run-%1-communication.png").arg(m_runId)
                             : QStringLiteral("communication.png"));
}

}  // namespace lathe::widgets

#include "lathe/widgets/loss_scale_view.h"

#include <QLabel>
#include <QTimer>

#include <algorithm>
#include <cmath>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

constexpr double kHoverRadiusPx = 20.0;
const QColor kScaleColor(0x1f, 0x77, 0xb4);
const QColor kSkipColor(0xd6, 0x27, 0x28);
const QColor kNormColor(0x2c, 0x8c, 0x5a);

bool isKey(const std::string& key) {
    return key == LossScaleView::kScaleKey || key == LossScaleView::kSkippedKey ||
           key == LossScaleView::kGradNormKey;
}

QString formatScale(double v) {
    if (!std::isfinite(v)) return QStringLiteral("—");
    // Loss scales are powers of two most of the time: say so.
    const double l = std::log2(v);
    if (v >= 1 && std::abs(l - std::round(l)) < 1e-9)
        return QStringLiteral("%1 (2^%2)").arg(v, 0, 'f', 0).arg(int(std::round(l)));
    return QString::number(v, 'g', 6);
}

}  // namespace

LossScaleView::LossScaleView(QWidget* parent)
    : ChartPanel(tr("<b>Loss scale</b>"), true, tr("Save these charts as PNG or PDF"),
                 QStringLiteral("lossScalePlot"), QSize(240, 220), parent) {
    // Top: the loss scale on a log axis (it moves by factors of two).
    m_scaleRect = m_plot->axisRect();
    QCPAxis* scaleX = m_scaleRect->axis(QCPAxis::atBottom);
    QCPAxis* scaleY = m_scaleRect->axis(QCPAxis::atLeft);
    scaleY->setScaleType(QCPAxis::stLogarithmic);
    QSharedPointer<QCPAxisTickerLog> logTicker(new QCPAxisTickerLog);
    logTicker->setLogBase(2);
    logTicker->setSubTickCount(0);
    scaleY->setTicker(logTicker);
    scaleY->setNumberFormat(QStringLiteral("gb"));
    scaleY->setNumberPrecision(6);
    scaleY->setLabel(tr("loss scale (log)"));
    scaleY->setRange(1, 65536);
    scaleX->setTickLabels(false);  // the step labels sit under the lower chart

    // Bottom: the gradient norm, on its own axis rect with the same step axis.
    m_normRect = new QCPAxisRect(m_plot);
    m_plot->plotLayout()->addElement(1, 0, m_normRect);
    m_plot->plotLayout()->setRowStretchFactor(0, 3);
    m_plot->plotLayout()->setRowStretchFactor(1, 2);
    m_plot->plotLayout()->setRowSpacing(4);
    QCPAxis* normX = m_normRect->axis(QCPAxis::atBottom);
    QCPAxis* normY = m_normRect->axis(QCPAxis::atLeft);
    normX->setLabel(tr("step"));
    normY->setLabel(tr("grad norm"));
    auto* margins = new QCPMarginGroup(m_plot);
    m_scaleRect->setMarginGroup(QCP::msLeft | QCP::msRight, margins);
    m_normRect->setMarginGroup(QCP::msLeft | QCP::msRight, margins);
    // Linked step axes: a range change on either is copied to the other (setRange with an
    // equal range emits nothing, so this does not loop).
    connect(scaleX, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), normX,
            qOverload<const QCPRange&>(&QCPAxis::setRange));
    connect(normX, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), scaleX,
            qOverload<const QCPRange&>(&QCPAxis::setRange));

    m_scaleGraph = m_plot->addGraph(scaleX, scaleY);
    m_scaleGraph->setName(tr("loss scale"));
    m_scaleGraph->setLineStyle(QCPGraph::lsStepLeft);  // the scale holds until it changes
    m_scaleGraph->setPen(QPen(kScaleColor, 1.6));
    m_skippedGraph = m_plot->addGraph(scaleX, scaleY);
    m_skippedGraph->setName(tr("skipped step (inf/NaN grads)"));
    m_skippedGraph->setLineStyle(QCPGraph::lsNone);
    m_skippedGraph->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssTriangleInverted,
                                                    QPen(kSkipColor.darker(130), 1.0), kSkipColor, 9));
    m_normGraph = m_plot->addGraph(normX, normY);
    m_normGraph->setName(tr("gradient norm"));
    m_normGraph->setPen(QPen(kNormColor, 1.2));
    m_normGraph->setAdaptiveSampling(true);

    styleLegend();
    m_scaleRect->insetLayout()->setInsetAlignment(0, Qt::AlignBottom | Qt::AlignRight);
    // The norm graph's legend entry would sit in the upper chart, far from its curve; the
    // lower chart's axis label names it.
    m_normGraph->removeFromLegend();

    m_tracer = new QCPItemTracer(m_plot);
    m_tracer->setClipAxisRect(m_scaleRect);
    // Its graph is set on hover: QCustomPlot places a tracer as soon as it gets one and logs
    // "graph has no data" for the empty graph of a view that shows no run yet.
    m_tracer->setStyle(QCPItemTracer::tsCircle);
    m_tracer->setSize(9);
    m_tracer->setPen(QPen(Qt::black, 1.5));
    m_tracer->setInterpolating(false);
    m_tracer->setVisible(false);

    m_hint = makeHint(m_scaleRect, QColor(0x90, 0x90, 0x90), false);

    updateHint();
}

LossScaleView::~LossScaleView() = default;

void LossScaleView::clear() {
    m_runId = 0;
    m_steps.clear();
    m_live.resetShown();
    m_skipped = 0;
    m_follow = true;
    m_hoverText.clear();
    m_tracer->setVisible(false);
    m_scaleGraph->data()->clear();
    m_skippedGraph->data()->clear();
    m_normGraph->data()->clear();
    m_titleLabel->setText(tr("<b>Loss scale</b>"));
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString LossScaleView::tabTitle() const { return tr("Loss scale"); }

QString LossScaleView::tabToolTip() const {
    return tr("Loss scale, skipped steps and gradient norm of the first selected run");
}

void LossScaleView::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    const int64_t first = runIds.empty() ? 0 : runIds.front();
    if (first != 0 && first == m_runId) return;  // live points keep it current
    showRun(store, first);
}

void LossScaleView::showRun(const core::Store& store, int64_t runId) {
    clear();
    m_runId = runId;
    if (runId <= 0) return;
    m_titleLabel->setText(tr("<b>Loss scale · run %1</b>").arg(runId));
    for (const char* key : {kScaleKey, kSkippedKey, kGradNormKey})
        addPoints(key, m_live.load(store, runId, key));
    if (m_follow) applyAutoRange();
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void LossScaleView::addPoints(const std::string& key, const std::vector<core::MetricPoint>& points) {
    if (points.empty()) return;
    QVector<double> keys, values;
    keys.reserve(qsizetype(points.size()));
    values.reserve(qsizetype(points.size()));
    if (key == kScaleKey) {
        for (const auto& p : points) {
            m_steps[p.step].scale = p.value;
            // A log axis cannot show 0 or negative values; a scale is never either.
            if (std::isfinite(p.value) && p.value > 0) {
                keys << double(p.step);
                values << p.value;
            }
        }
        m_scaleGraph->addData(keys, values);
    } else if (key == kGradNormKey) {
        for (const auto& p : points) {
            m_steps[p.step].gradNorm = p.value;
            m_steps[p.step].hasGradNorm = true;
            keys << double(p.step);
            // A non-finite norm (a skipped step) leaves a gap in the line.
            values << (std::isfinite(p.value) ? p.value : std::numeric_limits<double>::quiet_NaN());
        }
        m_normGraph->addData(keys, values);
    } else if (key == kSkippedKey) {
        for (const auto& p : points) m_steps[p.step].skipped = p.value;
    }
    // Skip markers sit at the scale used at that step; the scale point may arrive later than
    // the skip flag, so they are rebuilt from the step table (skips are few).
    if (key == kSkippedKey || key == kScaleKey) {
        QVector<double> sk, sv;
        double lastScale = std::numeric_limits<double>::quiet_NaN();
        for (const auto& [step, v] : m_steps) {
            if (std::isfinite(v.scale) && v.scale > 0) lastScale = v.scale;
            if (v.skipped >= 0.5) {
                sk << double(step);
                sv << (std::isfinite(lastScale) ? lastScale : 1.0);
            }
        }
        m_skipped = int(sk.size());
        m_skippedGraph->setData(sk, sv, true);
    }
}

void LossScaleView::onEvents(int64_t runId, const std::vector<core::Event>& events) {
    m_live.add(runId, m_runId, events, [](const std::string& key) { return isKey(key); });
    if (m_live.stagedCount() > 0 && !m_flushTimer->isActive()) m_flushTimer->start();
}

void LossScaleView::forgetLive(int64_t runId) { m_live.forget(runId); }

void LossScaleView::flushStaged() {
    m_flushTimer->stop();
    if (m_live.stagedCount() == 0) return;
    const int moved = m_live.stagedCount();
    for (auto& [key, points] : m_live.takeStaged()) addPoints(key, points);
    ++m_flushCount;
    if (m_follow) applyAutoRange();
    updateHint();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
    Q_EMIT flushed(moved);
}

int LossScaleView::scalePointCount() const { return m_scaleGraph->data()->size(); }

int LossScaleView::skippedCount() const { return m_skipped; }

int LossScaleView::gradNormPointCount() const {
    int n = 0;
    for (auto it = m_normGraph->data()->constBegin(); it != m_normGraph->data()->constEnd(); ++it)
        if (std::isfinite(it->value)) ++n;
    return n;
}

void LossScaleView::applyAutoRange() {
    bool found = false;
    QCPRange keys;
    for (QCPGraph* g : {m_scaleGraph, m_normGraph}) {
        bool ok = false;
        const QCPRange r = g->getKeyRange(ok);
        if (!ok) continue;
        keys = found ? QCPRange(std::min(keys.lower, r.lower), std::max(keys.upper, r.upper)) : r;
        found = true;
    }
    if (!found) return;
    const double pad = std::max(1.0, keys.size() * 0.02);
    m_scaleRect->axis(QCPAxis::atBottom)->setRange(keys.lower - pad, keys.upper + pad);

    bool ok = false;
    const QCPRange scale = m_scaleGraph->getValueRange(ok, QCP::sdBoth);
    if (ok) {
        // One power of two of air on each side; a constant scale still gets a visible band.
        m_scaleRect->axis(QCPAxis::atLeft)->setRange(std::max(scale.lower / 2.0, 1e-30), scale.upper * 2.0);
    }
    ok = false;
    const QCPRange norm = m_normGraph->getValueRange(ok, QCP::sdBoth);
    if (ok) {
        const double upper = norm.upper > 0 ? norm.upper * 1.08 : 1.0;
        m_normRect->axis(QCPAxis::atLeft)->setRange(std::min(0.0, norm.lower), upper);
    }
}

void LossScaleView::rescale() {
    m_follow = true;
    applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void LossScaleView::updateHint() {
    QString hint;
    if (m_runId <= 0)
        hint = tr("No run selected");
    else if (m_scaleGraph->data()->isEmpty())
        hint = tr("Run %1 has no loss-scale data — it trains without loss scaling\n"
                  "(use precision fp16, or --loss-scale dynamic)")
                   .arg(m_runId);
    m_hint->setText(hint);
    m_hint->setVisible(!hint.isEmpty());
    m_plot->legend->setVisible(hint.isEmpty());

    QString summary;
    if (!m_steps.empty()) {
        double last = std::numeric_limits<double>::quiet_NaN();
        for (auto it = m_steps.rbegin(); it != m_steps.rend(); ++it)
            if (std::isfinite(it->second.scale)) {
                last = it->second.scale;
                break;
            }
        summary = tr("%n skipped step(s)", nullptr, m_skipped);
        if (std::isfinite(last)) summary += tr(" · current scale %1").arg(formatScale(last));
    }
    m_summary->setText(summary);
}

QString LossScaleView::hoverAt(const QPointF& pos) {
    QString text;
    QCPAxisRect* rect = nullptr;
    if (m_scaleRect->rect().contains(pos.toPoint()))
        rect = m_scaleRect;
    else if (m_normRect->rect().contains(pos.toPoint()))
        rect = m_normRect;
    if (rect && !m_steps.empty()) {
        QCPAxis* x = rect->axis(QCPAxis::atBottom);
        const double key = x->pixelToCoord(pos.x());
        auto it = m_steps.lower_bound(int64_t(std::ceil(key)));
        auto best = m_steps.end();
        double bestDist = kHoverRadiusPx;
        for (auto c : {it, it == m_steps.begin() ? m_steps.end() : std::prev(it)}) {
            if (c == m_steps.end()) continue;
            const double d = std::abs(x->coordToPixel(double(c->first)) - pos.x());
            if (d <= bestDist) {
                bestDist = d;
                best = c;
            }
        }
        if (best != m_steps.end()) {
            const StepValues& v = best->second;
            text = tr("run %1 · step %2").arg(m_runId).arg(best->first);
            text += tr("\nloss scale %1").arg(formatScale(v.scale));
            if (!std::isnan(v.skipped))
                text += v.skipped >= 0.5 ? tr("\nskipped: yes (inf/NaN gradients)") : tr("\nskipped: no");
            if (v.hasGradNorm)
                text += tr("\ngrad norm %1")
                            .arg(std::isfinite(v.gradNorm) ? QString::number(v.gradNorm, 'g', 5)
                                                           : tr("non-finite"));
            if (std::isfinite(v.scale) && v.scale > 0) {
                m_tracer->setGraph(m_scaleGraph);
                m_tracer->setGraphKey(double(best->first));
                m_tracer->setVisible(true);
            } else {
                m_tracer->setVisible(false);
            }
        }
    }
    showHover(pos, text, m_tracer);
    return text;
}

void LossScaleView::exportDialog() {
    exportWithDialog(tr("Export loss scale chart"), m_runId
                                                        ? QStringLiteral("run-%1-loss-scale.png").arg(m_runId)
                                                        : QStringLiteral("loss-scale.png"));
}

}  // namespace lathe::widgets

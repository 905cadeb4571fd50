#include "lathe/widgets/serving_chart.h"

#include <QDateTime>
#include <QLabel>
#include <QTimer>
#include <QToolTip>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/serving_tables.h"

namespace lathe::widgets {

namespace {

constexpr double kHoverRadiusPx = 16.0;
constexpr double kMinSpanS = 10.0;  // a fresh deployment still gets a readable time axis

struct SeriesStyle {
    const char* key;
    const char* name;
    QColor color;
    Qt::PenStyle style;
    double scale;  // stored value -> plotted value
};

// Index = ServingChart::Series.
const SeriesStyle kStyles[ServingChart::kSeriesCount] = {
    {"p50_ms", "P50", QColor(0x1f, 0x77, 0xb4), Qt::SolidLine, 1.0},
    {"p90_ms", "P90", QColor(0xff, 0x7f, 0x0e), Qt::SolidLine, 1.0},
    {"p99_ms", "P99", QColor(0xd6, 0x27, 0x28), Qt::SolidLine, 1.0},
    {"qps", "QPS", QColor(0x2c, 0xa0, 0x2c), Qt::SolidLine, 1.0},
    {"error_rate", "errors %", QColor(0xc6, 0x28, 0x28), Qt::SolidLine, 100.0},  // stored 0..1, shown in %
    {"queue_depth", "queue depth", QColor(0x94, 0x67, 0xbd), Qt::SolidLine, 1.0},
    {"batch_mean", "mean batch", QColor(0x8c, 0x56, 0x4b), Qt::DashLine, 1.0},
};

const QColor kDeployColor(0x15, 0x65, 0xc0);
const QColor kRollbackColor(0xef, 0x6c, 0x00);
const QColor kAlertColor(0xd6, 0x27, 0x28);

QString timeText(double t) {
    return QDateTime::fromMSecsSinceEpoch(qint64(t * 1000.0)).toString(QStringLiteral("hh:mm:ss"));
}

double valueAt(const QCPGraph* g, double key) {
    auto it = g->data()->findBegin(key, false);
    if (it == g->data()->constEnd() || it->key != key) return std::numeric_limits<double>::quiet_NaN();
    return it->value;
}

bool sameDeployments(const std::vector<core::Deployment>& a, const std::vector<core::Deployment>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].id != b[i].id || a[i].version != b[i].version || a[i].startedAt != b[i].startedAt ||
            a[i].action != b[i].action || a[i].actor != b[i].actor)
            return false;
    return true;
}

bool sameAlerts(const std::vector<core::AlertRecord>& a, const std::vector<core::AlertRecord>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].id != b[i].id || a[i].firedAt != b[i].firedAt || a[i].resolvedAt != b[i].resolvedAt ||
            a[i].rule != b[i].rule)
            return false;
    return true;
}

}  // namespace

const char* ServingChart::keyOf(Series s) { return kStyles[int(s)].key; }

ServingChart::ServingChart(QWidget* parent)
    : ChartPanel(tr("<b>Serving</b>"), true, tr("Save these charts as PNG or PDF"),
                 QStringLiteral("servingPlot"), QSize(320, 300), parent) {
    m_summary->setObjectName(QStringLiteral("servingSummary"));
    // A long summary is cut rather than widening the chart; the tooltip has all of it.
    m_summary->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);

    m_latencyRect = m_plot->axisRect();
    m_trafficRect = new QCPAxisRect(m_plot);
    m_queueRect = new QCPAxisRect(m_plot);
    m_plot->plotLayout()->addElement(1, 0, m_trafficRect);
    m_plot->plotLayout()->addElement(2, 0, m_queueRect);
    m_plot->plotLayout()->setRowStretchFactor(0, 3);
    m_plot->plotLayout()->setRowStretchFactor(1, 2);
    m_plot->plotLayout()->setRowStretchFactor(2, 2);
    m_plot->plotLayout()->setRowSpacing(4);
    // Alert spans sit under the grid and the curves.
    m_plot->addLayer(QStringLiteral("alerts"), m_plot->layer(QStringLiteral("grid")), QCustomPlot::limBelow);

    // Times are seconds since the epoch, which is what QCustomPlot's date-time ticker reads.
    QSharedPointer<QCPAxisTickerDateTime> ticker(new QCPAxisTickerDateTime);
    ticker->setDateTimeFormat(QStringLiteral("hh:mm:ss"));
    ticker->setDateTimeSpec(Qt::LocalTime);
    ticker->setTickCount(6);
    auto* margins = new QCPMarginGroup(m_plot);
    std::vector<QCPAxis*> times;
    for (QCPAxisRect* r : {m_latencyRect, m_trafficRect, m_queueRect}) {
        r->setMarginGroup(QCP::msLeft | QCP::msRight, margins);
        r->setRangeDrag(Qt::Horizontal);
        r->setRangeZoom(Qt::Horizontal);
        QCPAxis* x = r->axis(QCPAxis::atBottom);
        x->setTicker(ticker);
        x->setTickLabels(r == m_queueRect);
        times.push_back(x);
        // Right axes everywhere, so the margins line up with the rects that use theirs.
        r->axis(QCPAxis::atRight)->setVisible(true);
        r->axis(QCPAxis::atRight)->setTickLabels(r != m_latencyRect);
    }
    m_queueRect->axis(QCPAxis::atBottom)->setLabel(tr("time"));
    for (QCPAxis* from : times)
        for (QCPAxis* to : times)
            if (from != to)
                connect(from, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), to,
                        qOverload<const QCPRange&>(&QCPAxis::setRange));

    m_latencyRect->axis(QCPAxis::atLeft)->setLabel(tr("latency ms"));
    m_trafficRect->axis(QCPAxis::atLeft)->setLabel(tr("QPS"));
    m_trafficRect->axis(QCPAxis::atRight)->setLabel(tr("errors %"));
    m_trafficRect->axis(QCPAxis::atRight)->setLabelColor(kStyles[int(Series::ErrorRate)].color);
    m_queueRect->axis(QCPAxis::atLeft)->setLabel(tr("queue depth"));
    m_queueRect->axis(QCPAxis::atRight)->setLabel(tr("mean batch (dashed)"));

    for (int i = 0; i < kSeriesCount; ++i) {
        const auto s = Series(i);
        QCPAxisRect* rect = i <= int(Series::P99)         ? m_latencyRect
                            : i <= int(Series::ErrorRate) ? m_trafficRect
                                                          : m_queueRect;
        const bool right = s == Series::ErrorRate || s == Series::BatchMean;
        QCPGraph* g = m_plot->addGraph(rect->axis(QCPAxis::atBottom),
                                       rect->axis(right ? QCPAxis::atRight : QCPAxis::atLeft));
        g->setName(QString::fromLatin1(kStyles[i].name));
        QPen pen(kStyles[i].color, s == Series::P99 ? 1.8 : 1.3);
        pen.setStyle(kStyles[i].style);
        g->setPen(pen);
        g->setAdaptiveSampling(true);
        if (s == Series::QueueDepth) g->setLineStyle(QCPGraph::lsStepLeft);  // a sampled gauge
        m_graphs[i] = g;
    }

    // Only the percentiles need a legend; the other rects name their curves on the axes.
    styleLegend();
    for (int i = int(Series::Qps); i < kSeriesCount; ++i) m_graphs[i]->removeFromLegend();
    m_plot->legend->setFillOrder(QCPLegend::foColumnsFirst);
    m_latencyRect->insetLayout()->setInsetAlignment(0, Qt::AlignBottom | Qt::AlignLeft);

    m_hint = makeHint(m_trafficRect, QColor(0x70, 0x70, 0x70), true);
    setPlaceholder(tr("Select a model to see its serving metrics"));
    clear();
}

ServingChart::~ServingChart() = default;

void ServingChart::setTitle(const QString& html) { m_titleLabel->setText(html); }

void ServingChart::setSummaryText(const QString& text) {
    m_summary->setText(text);
    m_summary->setToolTip(text);
}

QString ServingChart::summaryText() const { return m_summary->text(); }

void ServingChart::setPlaceholder(const QString& text) {
    m_hint->setText(text);
    m_hint->setVisible(!text.isEmpty());
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString ServingChart::placeholderText() const { return m_hint->visible() ? m_hint->text() : QString(); }

int ServingChart::pointCount(Series s) const { return m_graphs[int(s)]->data()->size(); }

void ServingChart::clear() {
    for (QCPGraph* g : m_graphs) g->data()->clear();
    clearItems(m_markerItems);
    clearItems(m_alertItems);
    m_markerLabels.clear();
    m_deployments.clear();
    m_alerts.clear();
    m_alertSpans = 0;
    m_pending = false;
    m_follow = true;
    m_hoverText.clear();
    const double now = double(QDateTime::currentMSecsSinceEpoch()) / 1000.0;
    m_latencyRect->axis(QCPAxis::atBottom)->setRange(now - 60, now);
    for (QCPAxisRect* r : {m_latencyRect, m_trafficRect, m_queueRect}) {
        r->axis(QCPAxis::atLeft)->setRange(0, 1);
        r->axis(QCPAxis::atRight)->setRange(0, 1);
    }
    m_summary->clear();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void ServingChart::clearItems(std::vector<QCPAbstractItem*>& items) {
    for (QCPAbstractItem* item : items) m_plot->removeItem(item);
    items.clear();
}

void ServingChart::addPoints(const std::string& key, const std::vector<core::ServingPoint>& points) {
    if (points.empty()) return;
    int series = -1;
    for (int i = 0; i < kSeriesCount; ++i)
        if (key == kStyles[i].key) series = i;
    if (series < 0) return;
    QVector<double> keys, values;
    keys.reserve(qsizetype(points.size()));
    values.reserve(qsizetype(points.size()));
    for (const auto& p : points) {
        keys << p.t;
        values << p.value * kStyles[series].scale;
    }
    // Polls read only points after the last one, in time order: appending keeps the data sorted.
    m_graphs[series]->addData(keys, values, true);
    m_pending = true;
    if (!m_flushTimer->isActive()) m_flushTimer->start();
}

void ServingChart::flushStaged() {
    m_flushTimer->stop();
    if (!m_pending) return;
    m_pending = false;
    ++m_flushCount;
    if (m_follow) applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void ServingChart::addVerticalMarker(double t, const QString& label, const QColor& color,
                                     QCPAxisRect* labelRect, std::vector<QCPAbstractItem*>& into) {
    for (QCPAxisRect* r : {m_latencyRect, m_trafficRect, m_queueRect}) {
        auto* line = new QCPItemStraightLine(m_plot);
        line->setClipAxisRect(r);
        for (QCPItemPosition* p : {line->point1, line->point2}) {
            p->setAxes(r->axis(QCPAxis::atBottom), r->axis(QCPAxis::atLeft));
            p->setAxisRect(r);
            p->setTypeX(QCPItemPosition::ptPlotCoords);
            p->setTypeY(QCPItemPosition::ptAxisRectRatio);
        }
        line->point1->setCoords(t, 0);
        line->point2->setCoords(t, 1);
        line->setPen(QPen(color, 1.4, Qt::DashLine));
        line->setSelectable(false);
        into.push_back(line);
    }
    auto* text = timeLabel(t, labelRect, label, color.darker(120));
    text->setBrush(QColor(255, 255, 255, 200));
    text->setPadding(QMargins(3, 1, 3, 1));
    QFont f = font();
    f.setPointSizeF(std::max(7.0, f.pointSizeF() - 1.0));
    f.setBold(true);
    text->setFont(f);
    text->setSelectable(false);
    into.push_back(text);
}

QCPItemText* ServingChart::timeLabel(double t, QCPAxisRect* rect, const QString& label, const QColor& color) {
    auto* text = new QCPItemText(m_plot);
    text->setClipAxisRect(rect);
    text->position->setAxes(rect->axis(QCPAxis::atBottom), rect->axis(QCPAxis::atLeft));
    text->position->setAxisRect(rect);
    text->position->setTypeX(QCPItemPosition::ptPlotCoords);
    text->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    text->position->setCoords(t, 0.0);
    text->setPositionAlignment(Qt::AlignLeft | Qt::AlignTop);
    text->setText(label);
    text->setColor(color);
    return text;
}

void ServingChart::addShadedSpan(double t0, double t1, const QString& label, const QColor& color,
                                 QCPAxisRect* labelRect, std::vector<QCPAbstractItem*>& into) {
    QColor fill = color;
    fill.setAlpha(38);
    for (QCPAxisRect* r : {m_latencyRect, m_trafficRect, m_queueRect}) {
        auto* rect = new QCPItemRect(m_plot);
        rect->setLayer(QStringLiteral("alerts"));
        rect->setClipAxisRect(r);
        for (QCPItemPosition* p : {rect->topLeft, rect->bottomRight}) {
            p->setAxes(r->axis(QCPAxis::atBottom), r->axis(QCPAxis::atLeft));
            p->setAxisRect(r);
            p->setTypeX(QCPItemPosition::ptPlotCoords);
            p->setTypeY(QCPItemPosition::ptAxisRectRatio);
        }
        rect->topLeft->setCoords(t0, 0);
        rect->bottomRight->setCoords(t1, 1);
        rect->setPen(Qt::NoPen);
        rect->setBrush(fill);
        rect->setSelectable(false);
        into.push_back(rect);
    }
    auto* text = timeLabel(t0, labelRect, label, color.darker(130));
    // Under the deployment labels at the top, clear of the curves' usual low values.
    text->setPadding(QMargins(3, fontMetrics().height() + 4, 3, 1));
    QFont f = font();
    f.setPointSizeF(std::max(7.0, f.pointSizeF() - 1.0));
    text->setFont(f);
    text->setSelectable(false);
    into.push_back(text);
}

void ServingChart::setDeployments(const std::vector<core::Deployment>& deployments) {
    if (sameDeployments(deployments, m_deployments)) return;
    m_deployments = deployments;
    clearItems(m_markerItems);
    m_markerLabels.clear();
    std::vector<core::Deployment> ordered = deployments;
    std::sort(ordered.begin(), ordered.end(),
              [](const core::Deployment& a, const core::Deployment& b) { return a.startedAt < b.startedAt; });
    for (const auto& d : ordered) {
        const QString label = deploymentLabel(d);
        addVerticalMarker(d.startedAt, label, d.action == "rollback" ? kRollbackColor : kDeployColor,
                          m_latencyRect, m_markerItems);
        m_markerLabels << label;
    }
    if (m_follow) applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void ServingChart::setAlerts(const std::vector<core::AlertRecord>& alerts, double now) {
    bool firing = false;
    for (const auto& a : alerts) firing = firing || a.resolvedAt == 0;
    // A firing alert's span grows with time; a resolved set only changes with the registry.
    if (sameAlerts(alerts, m_alerts) && !firing && m_alertsNow != 0) return;
    m_alerts = alerts;
    m_alertsNow = now;
    clearItems(m_alertItems);
    m_alertSpans = 0;
    for (const auto& a : alerts) {
        const double end = a.resolvedAt > 0 ? a.resolvedAt : std::max(now, a.firedAt);
        // Label the span in the chart the rule is about.
        QCPAxisRect* rect = a.rule == "error_rate" ? m_trafficRect
                            : a.rule == "gpu_idle" ? m_queueRect
                                                   : m_latencyRect;
        const QString label = QStringLiteral("⚠ %1%2").arg(QString::fromStdString(a.rule),
                                                           a.resolvedAt > 0 ? QString() : tr(" (firing)"));
        addShadedSpan(a.firedAt, end, label, kAlertColor, rect, m_alertItems);
        ++m_alertSpans;
    }
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void ServingChart::applyAutoRange() {
    bool found = false;
    QCPRange keys;
    auto extend = [&](double lo, double hi) {
        keys = found ? QCPRange(std::min(keys.lower, lo), std::max(keys.upper, hi)) : QCPRange(lo, hi);
        found = true;
    };
    for (QCPGraph* g : m_graphs) {
        bool ok = false;
        const QCPRange r = g->getKeyRange(ok);
        if (ok) extend(r.lower, r.upper);
    }
    // Markers just outside the data (the deployment whose first scrape came a few seconds
    // later) belong in view; one from last week would only squash the curves. Without data the
    // markers are all there is to show.
    const bool haveData = found;
    const QCPRange data = keys;
    const double near = std::max(kMinSpanS, data.size() * 0.5);
    for (const auto& d : m_deployments)
        if (!haveData || (d.startedAt >= data.lower - near && d.startedAt <= data.upper + near))
            extend(d.startedAt, d.startedAt);
    if (!found) return;
    if (keys.size() < kMinSpanS) keys = QCPRange(keys.upper - kMinSpanS, keys.upper);
    const double pad = keys.size() * 0.02;
    m_latencyRect->axis(QCPAxis::atBottom)->setRange(keys.lower - pad, keys.upper + pad);

    auto fit = [this](std::initializer_list<Series> series, QCPAxis* axis, double minUpper) {
        double upper = minUpper;
        for (Series s : series) {
            bool ok = false;
            const QCPRange r = m_graphs[int(s)]->getValueRange(ok, QCP::sdBoth);
            if (ok) upper = std::max(upper, r.upper * 1.15);
        }
        axis->setRange(0, upper);
    };
    fit({Series::P50, Series::P90, Series::P99}, m_latencyRect->axis(QCPAxis::atLeft), 1.0);
    fit({Series::Qps}, m_trafficRect->axis(QCPAxis::atLeft), 1.0);
    fit({Series::ErrorRate}, m_trafficRect->axis(QCPAxis::atRight), 1.0);
    fit({Series::QueueDepth}, m_queueRect->axis(QCPAxis::atLeft), 1.0);
    fit({Series::BatchMean}, m_queueRect->axis(QCPAxis::atRight), 1.0);
    // The latency rect's right axis carries no curve: mirror the left one for the grid.
    m_latencyRect->axis(QCPAxis::atRight)->setRange(m_latencyRect->axis(QCPAxis::atLeft)->range());
}

void ServingChart::rescale() {
    m_follow = true;
    applyAutoRange();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QString ServingChart::hoverAt(const QPointF& pos) {
    QString text;
    QCPAxisRect* rect = nullptr;
    for (QCPAxisRect* r : {m_latencyRect, m_trafficRect, m_queueRect})
        if (r->rect().contains(pos.toPoint())) rect = r;
    if (rect) {
        QCPAxis* x = rect->axis(QCPAxis::atBottom);
        const double best = nearestKey(std::vector<QCPGraph*>(std::begin(m_graphs), std::end(m_graphs)), x,
                                       pos.x(), kHoverRadiusPx);
        if (std::isfinite(best)) {
            text = timeText(best);
            for (int i = 0; i < kSeriesCount; ++i) {
                const double v = valueAt(m_graphs[i], best);
                if (std::isfinite(v))
                    text += QStringLiteral("\n%1: %2")
                                .arg(QString::fromLatin1(kStyles[i].name))
                                .arg(v, 0, 'f', 2);
            }
        }
        for (const auto& d : m_deployments)
            if (std::abs(x->coordToPixel(d.startedAt) - pos.x()) <= kHoverRadiusPx) {
                if (!text.isEmpty()) text += QLatin1Char('\n');
                text += QStringLiteral("%1 at %2").arg(deploymentLabel(d), timeText(d.startedAt));
                if (!d.reason.empty()) text += QStringLiteral(": ") + QString::fromStdString(d.reason);
            }
        const double t = x->pixelToCoord(pos.x());
        for (const auto& a : m_alerts) {
            const double end = a.resolvedAt > 0 ? a.resolvedAt : m_alertsNow;
            if (t < a.firedAt || t > end) continue;
            if (!text.isEmpty()) text += QLatin1Char('\n');
            text += QStringLiteral("alert %1: %2")
                        .arg(QString::fromStdString(a.rule), QString::fromStdString(a.message));
        }
    }
    if (!text.isEmpty())
        QToolTip::showText(m_plot->mapToGlobal(pos.toPoint()), text, m_plot);
    else if (!m_hoverText.isEmpty())
        QToolTip::hideText();
    m_hoverText = text;
    return text;
}

void ServingChart::exportDialog() {
    exportWithDialog(tr("Export serving charts"), QStringLiteral("serving.png"));
}

}  // namespace lathe::widgets

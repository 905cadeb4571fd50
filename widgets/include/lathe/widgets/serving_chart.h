#pragma once
// The time charts of the deployment dashboard: latency percentiles (P50/P90/P99), traffic (QPS
// and error rate) and queueing (queue depth and mean batch size) in three axis rects with one
// linked date-time axis. Deployments and rollbacks are vertical markers labelled "v3 deploy" /
// "v2 rollback (auto)" across all three; alerts shade the span from firing to resolution. Points
// arrive about once a second from the dashboard's poller and are moved in with one queued
// replot per coalescing interval.
#include <QString>
#include <QStringList>

#include <map>
#include <string>
#include <vector>

#include "lathe/core/registry.h"
#include "lathe/widgets/chart_panel.h"

class QCPAbstractItem;
class QCPAxisRect;
class QCPGraph;
class QCPItemText;

namespace lathe::widgets {

class ServingChart : public ChartPanel {
    Q_OBJECT
public:
    enum class Series { P50 = 0, P90, P99, Qps, ErrorRate, QueueDepth, BatchMean };
    static constexpr int kSeriesCount = 7;
    /// The registry key a series is read from ("p99_ms", "error_rate", ...).
    static const char* keyOf(Series s);

    explicit ServingChart(QWidget* parent = nullptr);
    ~ServingChart() override;

    /// Forgets every point, marker and alert (another model is shown).
    void clear();
    void setTitle(const QString& html);
    void setSummaryText(const QString& text);
    QString summaryText() const;

    /// Appends points of one registry key (ignored unless it is one of the series); the replot
    /// follows on the next coalescing tick.
    void addPoints(const std::string& key, const std::vector<core::ServingPoint>& points);
    /// Deployments of the shown model (any order); markers are rebuilt when they changed.
    void setDeployments(const std::vector<core::Deployment>& deployments);
    /// Alerts of the shown model; a firing one is shaded up to `now`.
    void setAlerts(const std::vector<core::AlertRecord>& alerts, double now);

    // For tests and the status line.
    QCPGraph* graph(Series s) const { return m_graphs[int(s)]; }
    int pointCount(Series s) const;
    int markerCount() const { return int(m_markerLabels.size()); }
    QStringList markerLabels() const { return m_markerLabels; }
    int alertSpanCount() const { return m_alertSpans; }
    QCPAxisRect* latencyRect() const { return m_latencyRect; }
    QCPAxisRect* trafficRect() const { return m_trafficRect; }
    QCPAxisRect* queueRect() const { return m_queueRect; }
    /// The placeholder text shown over the charts; empty when data is shown.
    QString placeholderText() const;
    void setPlaceholder(const QString& text);

    QString hoverAt(const QPointF& pos) override;

public Q_SLOTS:
    void flushStaged() override;
    void rescale() override;
    void exportDialog() override;

private:
    void applyAutoRange();
    void clearItems(std::vector<QCPAbstractItem*>& items);
    /// A vertical span from t0 to t1 (t1 == t0: a line) in every rect, with a label in `labelRect`.
    void addVerticalMarker(double t, const QString& label, const QColor& color, QCPAxisRect* labelRect,
                           std::vector<QCPAbstractItem*>& into);
    /// A label at time t along the top of `rect` (deploy markers, alert spans).
    QCPItemText* timeLabel(double t, QCPAxisRect* rect, const QString& label, const QColor& color);
    void addShadedSpan(double t0, double t1, const QString& label, const QColor& color,
                       QCPAxisRect* labelRect, std::vector<QCPAbstractItem*>& into);

    QCPAxisRect* m_latencyRect = nullptr;
    QCPAxisRect* m_trafficRect = nullptr;
    QCPAxisRect* m_queueRect = nullptr;
    QCPGraph* m_graphs[kSeriesCount] = {};
    QCPItemText* m_hint = nullptr;
    bool m_pending = false;  // points added since the last flush

    std::vector<core::Deployment> m_deployments;  // as drawn
    std::vector<QCPAbstractItem*> m_markerItems;
    QStringList m_markerLabels;
    std::vector<core::AlertRecord> m_alerts;  // as drawn
    double m_alertsNow = 0;
    std::vector<QCPAbstractItem*> m_alertItems;
    int m_alertSpans = 0;
};

}  // namespace lathe::widgets

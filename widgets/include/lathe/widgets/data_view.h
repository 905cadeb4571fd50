#pragma once
// The training data loader of one run, per step: how long each step waited for its batch
// (data/wait_ms), the samples per second the loader delivered (data/samples_per_s), and the hit
// rate of each cache level the run enabled (data/hit_memory, data/hit_disk, data/hit_redis, 0..1
// over the epoch so far), with a summary that adds the corrupt samples skipped (data/skipped,
// cumulative). Three axis rects share one linked step axis; a hit-rate line exists only for a
// level the run recorded. Live points are staged and moved into the graphs by a ~40 ms timer
// with one queued replot, like CommView. The "Data" tab of the window (a RunView over the first
// selected run).
#include <QString>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "lathe/widgets/chart_panel.h"
#include "lathe/widgets/live_series.h"
#include "lathe/widgets/run_view.h"

class QCPAxisRect;
class QCPGraph;
class QCPItemText;

namespace lathe::widgets {

class DataView : public ChartPanel, public RunView {
    Q_OBJECT
public:
    /// The per-step figures the training loop records under `data/`.
    enum class Metric { WaitMs = 0, SamplesPerS, HitMemory, HitDisk, HitRedis, Skipped };
    static constexpr int kMetricCount = 6;

    /// "data/wait_ms" → WaitMs, "data/hit_disk" → HitDisk; anything else → nullopt.
    static std::optional<Metric> parseKey(const std::string& key);
    static std::string keyFor(Metric metric);
    /// Whether `metric` is a cache level's hit rate.
    static bool isHitRate(Metric metric);

    explicit DataView(QWidget* parent = nullptr);
    ~DataView() override;

    QWidget* widget() override { return this; }
    QString tabTitle() const override;
    QString tabToolTip() const override;

    /// Shows one run's history from the store (runId 0: nothing). Live points of this run
    /// received earlier are merged by step.
    void showRun(const core::Store& store, int64_t runId);
    /// The first of the runs (showRun), unless it is the run already shown.
    void showRuns(const core::Store& store, const std::vector<int64_t>& runIds) override;
    int64_t runId() const { return m_runId; }
    void clear() override;

    /// Live events of a running run; data metrics are staged, others ignored. Points of runs
    /// that are not shown are remembered for when they are selected.
    void onEvents(int64_t runId, const std::vector<core::Event>& events) override;
    void forgetLive(int64_t runId) override;

    // For tests and the status line.
    int graphCount() const;  // graphs holding data
    int pointCount(Metric metric) const;
    /// The graph of a metric (null until it has a point; Skipped has none: it is a count).
    QCPGraph* graph(Metric metric) const;
    /// The cache levels with a hit-rate line, in the order memory, disk, redis.
    std::vector<Metric> hitLevels() const;
    /// The last skipped count recorded (0 when none was).
    double skippedCount() const { return m_skipped.empty() ? 0.0 : m_skipped.back().second; }
    bool hasDataMetrics() const;
    /// The placeholder text shown over the charts; empty when data is shown.
    QString placeholderText() const;
    /// The note in the hit-rate chart of a run with loader metrics but no cache level; else empty.
    QString hitPlaceholderText() const;
    QString summaryText() const;
    int stagedCount() const { return m_live.stagedCount(); }

    QCPAxisRect* waitRect() const { return m_waitRect; }
    QCPAxisRect* rateRect() const { return m_rateRect; }
    QCPAxisRect* hitRect() const { return m_hitRect; }

    /// Shows the tooltip for the step nearest to `pos` (plot pixels); returns its text.
    QString hoverAt(const QPointF& pos) override;

public Q_SLOTS:
    void flushStaged() override;
    void rescale() override;
    void exportDialog() override;

Q_SIGNALS:
    void flushed(int points);

private:
    QCPGraph* ensureGraph(Metric metric);
    void addPoints(Metric metric, const std::vector<core::MetricPoint>& points);
    void applyAutoRange();
    void updateHint();
    double skippedAt(double step) const;

    QCPAxisRect* m_waitRect = nullptr;
    QCPAxisRect* m_rateRect = nullptr;
    QCPAxisRect* m_hitRect = nullptr;
    QCPItemText* m_hint = nullptr;
    QCPItemText* m_hitHint = nullptr;

    int64_t m_runId = 0;
    QCPGraph* m_graphs[kMetricCount] = {};             // Skipped stays null
    std::vector<std::pair<double, double>> m_skipped;  // (step, cumulative count), ascending steps
    LiveSeries m_live;  // live points of every run; the shown run's new ones staged
};

}  // namespace lathe::widgets

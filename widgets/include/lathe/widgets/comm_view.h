#pragma once
// Communication of one distributed run, per step: for data parallel, per rank, the time spent
// exchanging gradients (comm/ms), the share of it hidden under backward (comm/overlap, 0..1),
// and the bytes each rank put on the wire with the compression ratio beside them; for pipeline
// parallel, per stage, its forward and backward compute time, its bubble (idle share of the
// step, 0..1) and the activation and gradient bytes it sent. Three axis rects share one linked
// step axis; each rank or stage has one colour across all of them (rank 0's figures are the
// plain `comm/*` keys, rank N's are `rankN/comm/*`, stage S's `pipe/stageS/*`). Live points are staged
// and moved into the graphs by a ~40 ms timer with one queued replot, like LossScaleView. The
// "Communication" tab of the window (a RunView over the first selected run).
#include <QColor>
#include <QString>

#include <cstdint>
#include <map>
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

class CommView : public ChartPanel, public RunView {
    Q_OBJECT
public:
    /// The per-step communication figures a rank reports.
    /// The per-step figures: a rank's exchange (Ms, Overlap, BytesSent, CompressionRatio) or a
    /// pipeline stage's (Bubble, ForwardMs, BackwardMs, BytesSent).
    enum class Metric { Ms = 0, Overlap, BytesSent, CompressionRatio, Bubble, ForwardMs, BackwardMs };
    static constexpr int kMetricCount = 7;
    /// Series ids: a rank's is the rank, pipeline stage s's is kStageSeries + s.
    static constexpr int kStageSeries = 100000;

    /// "comm/ms" → (0, Ms); "rank3/comm/overlap" → (3, Overlap); "pipe/stage1/bubble" →
    /// (kStageSeries + 1, Bubble); anything else → nullopt.
    static std::optional<std::pair<int, Metric>> parseKey(const std::string& key);
    static std::string keyFor(int series, Metric metric);
    /// The colour of a rank in every chart of this view.
    static QColor rankColor(int rank);

    explicit CommView(QWidget* parent = nullptr);
    ~CommView() override;

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

    /// Live events of a running run; comm metrics are staged, others ignored. Points of runs
    /// that are not shown are remembered for when they are selected.
    void onEvents(int64_t runId, const std::vector<core::Event>& events) override;
    void forgetLive(int64_t runId) override;

    // For tests and the status line.
    int rankCount() const { return int(ranks().size()); }
    std::vector<int> ranks() const;
    int stageCount() const { return int(stages().size()); }
    std::vector<int> stages() const;  // stage numbers (0-based)
    int graphCount() const;           // graphs holding data
    int pointCount(int rank, Metric metric) const;
    QCPGraph* graph(int rank, Metric metric) const;
    bool hasCommData() const;
    /// The placeholder text shown over the charts; empty when data is shown.
    QString placeholderText() const;
    QString summaryText() const;
    int stagedCount() const { return m_live.stagedCount(); }

    QCPAxisRect* msRect() const { return m_msRect; }
    QCPAxisRect* overlapRect() const { return m_overlapRect; }
    QCPAxisRect* bytesRect() const { return m_bytesRect; }

    /// Shows the tooltip for the step nearest to `pos` (plot pixels); returns its text.
    QString hoverAt(const QPointF& pos) override;

public Q_SLOTS:
    void flushStaged() override;
    void rescale() override;
    void exportDialog() override;

Q_SIGNALS:
    void flushed(int points);

private:
    struct RankGraphs {
        QCPGraph* graphs[kMetricCount] = {};
    };
    RankGraphs& ensureRank(int rank);
    void addPoints(int rank, Metric metric, const std::vector<core::MetricPoint>& points);
    void applyAutoRange();
    void updateHint();

    QCPAxisRect* m_msRect = nullptr;
    QCPAxisRect* m_overlapRect = nullptr;
    QCPAxisRect* m_bytesRect = nullptr;
    QCPItemText* m_hint = nullptr;

    int64_t m_runId = 0;
    std::map<int, RankGraphs> m_ranks;
    LiveSeries m_live;  // live points of every run; the shown run's new ones staged
};

}  // namespace lathe::widgets

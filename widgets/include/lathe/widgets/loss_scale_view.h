#pragma once
// Mixed-precision health of one run: the loss scale over steps on a log axis with the skipped
// steps (inf/NaN gradients) marked in red, and the global gradient norm in a second axis rect
// below whose step axis is linked to the first, so zooming or panning one moves both. Live
// points are staged and moved into the graphs by a ~40 ms timer with one queued replot, like
// MetricChart. The "Loss scale" tab of the window (a RunView over the first selected run).
#include <QString>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "lathe/widgets/chart_panel.h"
#include "lathe/widgets/live_series.h"
#include "lathe/widgets/run_view.h"

class QCPAxisRect;
class QCPGraph;
class QCPItemText;
class QCPItemTracer;

namespace lathe::widgets {

class LossScaleView : public ChartPanel, public RunView {
    Q_OBJECT
public:
    static constexpr const char* kScaleKey = "amp/loss_scale";
    static constexpr const char* kSkippedKey = "amp/skipped";
    static constexpr const char* kGradNormKey = "train/grad_norm";

    explicit LossScaleView(QWidget* parent = nullptr);
    ~LossScaleView() override;

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

    /// Live events of a running run; metric events of the three keys are staged (others are
    /// ignored). Points of runs that are not shown are remembered for when they are selected.
    void onEvents(int64_t runId, const std::vector<core::Event>& events) override;
    /// Drops the remembered live points of a run (e.g. when another run starts).
    void forgetLive(int64_t runId) override;

    // Counts, for tests and the status line.
    int scalePointCount() const;
    int skippedCount() const;
    int gradNormPointCount() const;  // finite grad norms plotted
    int stagedCount() const { return m_live.stagedCount(); }

    QCPAxisRect* scaleRect() const { return m_scaleRect; }
    QCPAxisRect* normRect() const { return m_normRect; }
    QCPGraph* scaleGraph() const { return m_scaleGraph; }
    QCPGraph* skippedGraph() const { return m_skippedGraph; }
    QCPGraph* gradNormGraph() const { return m_normGraph; }

    /// Shows the tooltip for the step nearest to `pos` (plot pixels); returns its text.
    QString hoverAt(const QPointF& pos) override;
    QString hoverText() const { return m_hoverText; }

public Q_SLOTS:
    void flushStaged() override;
    void rescale() override;
    void exportDialog() override;

Q_SIGNALS:
    void flushed(int points);

private:
    struct StepValues {
        double scale = std::numeric_limits<double>::quiet_NaN();
        double skipped = std::numeric_limits<double>::quiet_NaN();
        double gradNorm = std::numeric_limits<double>::quiet_NaN();
        bool hasGradNorm = false;  // NaN is also a real (skipped-step) grad norm
    };
    void addPoints(const std::string& key, const std::vector<core::MetricPoint>& points);
    void applyAutoRange();
    void updateHint();

    QCPAxisRect* m_scaleRect = nullptr;
    QCPAxisRect* m_normRect = nullptr;
    QCPGraph* m_scaleGraph = nullptr;
    QCPGraph* m_skippedGraph = nullptr;
    QCPGraph* m_normGraph = nullptr;
    QCPItemTracer* m_tracer = nullptr;
    QCPItemText* m_hint = nullptr;

    int64_t m_runId = 0;
    // Everything the hover needs, by step (the graphs hold what is drawn).
    std::map<int64_t, StepValues> m_steps;
    LiveSeries m_live;  // live points of every run; the shown run's new ones staged
    int m_skipped = 0;
};

}  // namespace lathe::widgets

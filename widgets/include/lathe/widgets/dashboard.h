#pragma once
// The training dashboard: a loss chart above an accuracy chart for the selected runs. History
// comes from the store; the live run's points come from the event stream and are merged with
// the history by step, so selecting a run while it trains neither loses nor doubles points.
// The "Curves" tab of the window (a RunView).
//
// Beyond kOverlayAbove runs the selection is an overlay (run_overlay.h): a worker reads every
// series on a connection of its own and the charts draw them as one layer, coloured by run or by
// a chosen parameter, so that selecting 1,000 runs never holds up the GUI thread. Runs with live
// points stay ordinary graphs on top.
#include <QList>
#include <QString>
#include <QThreadPool>
#include <QWidget>

class QComboBox;

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/store.h"
#include "lathe/widgets/run_view.h"

namespace lathe::widgets {

class MetricChart;
struct OverlayData;

class Dashboard : public QWidget, public RunView {
    Q_OBJECT
public:
    /// More selected runs than this are overlaid rather than drawn as one graph per series.
    static constexpr size_t kOverlayAbove = 12;

    explicit Dashboard(QWidget* parent = nullptr);
    ~Dashboard() override;

    QWidget* widget() override { return this; }
    QString tabTitle() const override;

    MetricChart* lossChart() const { return m_loss; }
    MetricChart* accuracyChart() const { return m_accuracy; }
    /// The chart a metric key belongs to, or nullptr for keys the dashboard does not plot.
    MetricChart* chartFor(const std::string& key) const;

    /// Shows exactly these runs, loading their history from the store.
    void showRuns(const core::Store& store, const std::vector<int64_t>& runIds) override;
    std::vector<int64_t> shownRuns() const { return {m_shown.begin(), m_shown.end()}; }
    bool isShown(int64_t runId) const { return m_shown.count(runId) != 0; }
    void clear() override;

    /// Live events of a running run (metrics are plotted, other types ignored here).
    void onEvent(int64_t runId, const core::Event& event);
    void onEvents(int64_t runId, const std::vector<core::Event>& events) override;
    /// Drops the live cache of a run (e.g. when another run starts).
    void forgetLive(int64_t runId) override;

    /// Renders both charts stacked into one PNG or PDF (by suffix).
    bool exportCharts(const QString& path, int width = 1200, int height = 900);

    /// Whether an overlay is being read from the store.
    bool overlayLoading() const { return m_overlayLoading; }
    /// Colours the overlay by a parameter ("" : by run); false when no shown run has it.
    bool setOverlayColorKey(const QString& key);
    /// The params the colour selector offers (those that differ between the overlaid runs).
    QStringList overlayColorKeys() const;

Q_SIGNALS:
    /// The overlay's points are loaded and handed to the charts (which then render them).
    void overlayLoaded();
    /// The overlay of the workspace at `path` read these runs' points row by row: they have no
    /// packed series yet (recorded before workspaces had them). The window asks its Store to pack
    /// them (Store::packSeries), so that the next overlay of them reads a blob per series.
    void runsUnpacked(const QString& path, const QList<qint64>& runIds);

private:
    using SeriesKey = std::pair<int64_t, std::string>;
    using Params = std::map<int64_t, std::map<std::string, std::string>>;
    void plotLive(int64_t runId, const std::string& key, const core::MetricPoint& p);
    void plotFromStore(const core::Store& store, int64_t runId);
    void loadOverlay(const std::string& path, std::vector<int64_t> runIds);
    void applyOverlayColors();

    QComboBox* m_colorBy = nullptr;
    QWidget* m_overlayBar = nullptr;
    QThreadPool m_loadPool;  // one thread; waited for in the destructor
    std::atomic<uint64_t> m_loadGeneration{0};
    bool m_overlayLoading = false;
    std::shared_ptr<const OverlayData> m_lossOverlay, m_accuracyOverlay;
    std::vector<int64_t> m_overlayRuns;  // in selection order
    Params m_overlayParams;
    QString m_colorKey;  // the parameter chosen to colour by, kept from one overlay to the next

    MetricChart* m_loss = nullptr;
    MetricChart* m_accuracy = nullptr;
    std::set<int64_t> m_shown;
    // Every live point seen this session, so a run selected mid-training gets what the store
    // writer has not committed yet.
    std::map<SeriesKey, std::vector<core::MetricPoint>> m_live;
    // Last step plotted per series; live points at or before it are already on the chart.
    std::map<SeriesKey, int64_t> m_lastStep;
};

}  // namespace lathe::widgets

#pragma once
// The profile of one run: the span timeline on top, the heaviest ops and the per-step phase
// bars below. A run's spans are read and summarised on a worker thread; a generation counter
// drops the result of a load that a newer selection has superseded. The "Profile" tab of the
// window (a RunView over the first selected run, loaded only while the tab is showing).
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "lathe/core/profile_analysis.h"
#include "lathe/core/store.h"
#include "lathe/widgets/run_view.h"

class QLabel;
class QShowEvent;
class QSortFilterProxyModel;
class QSplitter;
class QStackedWidget;
class QTableView;
class QToolButton;

namespace lathe::widgets {

class ProfileTimeline;
class StepPhaseChart;
class TopOpsModel;
struct TimelineLayout;

class ProfileView : public QWidget, public RunView {
    Q_OBJECT
public:
    explicit ProfileView(QWidget* parent = nullptr);
    /// Waits for a load in flight: it reads the store the caller owns.
    ~ProfileView() override;

    QWidget* widget() override { return this; }
    QString tabTitle() const override;
    QString tabToolTip() const override;

    /// Loads a run's profile in the background now (runId 0 shows the "select a run" hint). The
    /// store must outlive the load: call clear() before destroying or replacing it.
    void showRun(const core::Store& store, int64_t runId);
    /// The first of the runs, loaded as showRun() does but only while the view is visible (a
    /// load reads every span of the run, so it waits until someone looks; showing the view
    /// loads it). A run already loaded is not read again unless it finished meanwhile.
    void showRuns(const core::Store& store, const std::vector<int64_t>& runIds) override;
    /// The profile of a run is complete only when it ends (spans are written as it goes): the
    /// run loaded before is read again, now or when the view is next shown.
    void onRunFinished(const core::Store& store, int64_t runId) override;
    /// Forgets the shown run and waits for any load in flight.
    void clear() override;

    int64_t runId() const { return m_runId; }
    bool isLoading() const { return m_loading; }
    /// Completed loads that were shown (stale ones are not counted).
    int loadCount() const { return m_loadCount; }
    int spanCount() const;
    /// The hint shown instead of the profile (empty while a profile is shown).
    QString placeholderText() const;
    bool isPlaceholderShown() const;

    ProfileTimeline* timeline() const { return m_timeline; }
    TopOpsModel* opsModel() const { return m_opsModel; }
    QSortFilterProxyModel* opsProxy() const { return m_opsProxy; }
    QTableView* opsTable() const { return m_opsTable; }
    StepPhaseChart* phaseChart() const { return m_phases; }

    /// Writes the shown profile as a Chrome trace (Perfetto, chrome://tracing).
    bool exportChromeTrace(const QString& path);

Q_SIGNALS:
    /// After a load was applied (spanCount 0: the run was not profiled).
    void loaded(qint64 runId, int spanCount);

protected:
    void showEvent(QShowEvent* event) override;

private:
    struct LoadResult;
    /// Loads the run showRuns() asked for when the view is visible and that run is not the one
    /// loaded (or it finished since).
    void catchUp();
    void applyResult(uint64_t generation, const std::shared_ptr<LoadResult>& result);
    void showPlaceholder(const QString& text);
    void exportTraceDialog();

    QStackedWidget* m_stack = nullptr;
    QSplitter* m_content = nullptr;
    QLabel* m_placeholder = nullptr;
    QLabel* m_title = nullptr;
    QLabel* m_summary = nullptr;
    QToolButton* m_fit = nullptr;
    QToolButton* m_export = nullptr;
    ProfileTimeline* m_timeline = nullptr;
    TopOpsModel* m_opsModel = nullptr;
    QSortFilterProxyModel* m_opsProxy = nullptr;
    QTableView* m_opsTable = nullptr;
    StepPhaseChart* m_phases = nullptr;

    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};
    int64_t m_runId = 0;
    // What showRuns() asked for; set while a store is given (cleared by clear()).
    const core::Store* m_wantedStore = nullptr;
    int64_t m_wantedRun = 0;
    bool m_stale = false;  // m_runId was loaded before its run finished
    bool m_loading = false;
    int m_loadCount = 0;
};

}  // namespace lathe::widgets

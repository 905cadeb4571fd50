#pragma once
// The profile of one run: the span timeline on top, the heaviest ops and the per-step phase
// bars below. A run's spans are read and summarised on a worker thread; a generation counter
// drops the result of a load that a newer selection has superseded.
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "lathe/core/profile_analysis.h"
#include "lathe/core/store.h"

class QLabel;
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

class ProfileView : public QWidget {
    Q_OBJECT
public:
    explicit ProfileView(QWidget* parent = nullptr);
    /// Waits for a load in flight: it reads the store the caller owns.
    ~ProfileView() override;

    /// Loads a run's profile in the background (runId 0 shows the "select a run" hint). The
    /// store must outlive the load: call clear() before destroying or replacing it.
    void showRun(const core::Store& store, int64_t runId);
    /// Forgets the shown run and waits for any load in flight.
    void clear();

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

private:
    struct LoadResult;
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
    bool m_loading = false;
    int m_loadCount = 0;
};

}  // namespace lathe::widgets

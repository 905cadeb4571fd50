#pragma once
// The Studies page: the workspace's hyper-parameter studies (core::Studies, what `lathectl tune`
// writes) in a list — algorithm (sampler + pruner), objective and direction, trials done of the
// total, best value, status — and for the selected study its trials in a sortable table (number,
// state, value, run, one column per parameter, pruned at, duration) beside four charts: the
// trials' values with the best so far, parallel coordinates of the parameters coloured by the
// objective, the parameters' importance (core::parameterImportance) and, for PPO studies, the
// learning rate and batch size the agent chose during each trial (`ppo/lr`, `ppo/batch`).
// Selecting trials emits runsSelected() with their runs, so the window can compare their curves.
//
// Studies and Store open their own SQLite connections; the view keeps one of each per workspace
// and uses them only from a one-thread pool; results come back by queued call, and a generation
// counter drops reads of a workspace switched away from (and study reads of a selection that
// moved on). While the page is shown and a study is running, it re-reads every few seconds.
#include <QHash>
#include <QList>
#include <QString>
#include <QStringList>
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

class QAbstractItemModel;
class QCPAxisRect;
class QCPBars;
class QCPGraph;
class QCustomPlot;
class QLabel;
class QPushButton;
class QStackedWidget;
class QStandardItemModel;
class QTabWidget;
class QTableView;
class QTimer;
class QTreeWidget;

namespace lathe::widgets {

class ImportanceChart;
class ParallelCoordinatesChart;
class PpoChoicesChart;
class StudyHistoryChart;
class TrialSortProxy;
struct StudyDetail;

class StudiesView : public QWidget {
    Q_OBJECT
public:
    /// Columns of the studies list.
    enum StudyColumn {
        ColStudy,
        ColAlgorithm,
        ColObjective,
        ColTrials,
        ColBest,
        ColStatus,
        StudyColumnCount
    };
    /// The trials table's first columns; one per parameter follows ColRun (paramColumn()), then
    /// prunedAtColumn() and durationColumn().
    enum TrialColumn { ColNumber, ColState, ColValue, ColRun, ColFirstParam };
    enum Role {
        StudyNameRole = Qt::UserRole + 1,  // studies list, column 0: the study's name
        RunIdRole,                         // trials table, every cell: the trial's run (0: none yet)
        TrialNumberRole,                   // trials table, every cell: the trial's number
        SortRole,                          // trials table: what a column sorts by (numbers as doubles)
    };

    explicit StudiesView(QWidget* parent = nullptr);
    /// Waits for a read in flight.
    ~StudiesView() override;

    /// The workspace file whose studies are shown (empty: none); read at once when shown.
    void setWorkspace(const QString& path);
    QString workspace() const { return m_path; }
    /// Re-reads the studies (and the selected study) in the background; refreshed() follows.
    /// Asked again while a read is in flight, it reads once more after it.
    void refresh();
    bool isRefreshing() const { return m_refreshing; }
    int refreshCount() const { return m_refreshCount; }
    /// Whether the selected study's trials are being read.
    bool isLoadingStudy() const { return m_studyLoading; }

    /// Selects the study NAME (none when there is no such study).
    void selectStudy(const QString& name);
    QString selectedStudy() const;
    /// The names of the studies of the last read, newest first.
    QStringList studyNames() const;
    /// The runs of the selected trials, ascending (trials without a run left out).
    QList<qint64> selectedRunIds() const;
    /// Selects the trials whose runs these are (what runsSelected() then reports).
    void selectTrialsOfRuns(const QList<qint64>& runIds);

    /// The trials table's column of parameter KEY (-1: none).
    int paramColumn(const QString& key) const;
    int prunedAtColumn() const;
    int durationColumn() const;

    QTreeWidget* studiesList() const { return m_list; }
    QTableView* trialsTable() const { return m_table; }
    /// What the table shows: the trials sorted by the header's column.
    QAbstractItemModel* trialsModel() const;
    QLabel* studyLabel() const { return m_studyLabel; }
    QLabel* emptyLabel() const { return m_empty; }
    QPushButton* refreshButton() const { return m_refresh; }
    /// New study… (newStudyRequested()), Stop (a study this window runs) and Resume (a study
    /// not completed that nothing here runs).
    QPushButton* newStudyButton() const { return m_new; }
    QPushButton* stopButton() const { return m_stop; }
    QPushButton* resumeButton() const { return m_resume; }
    /// The studies this window's `lathectl tune` processes run (Stop is offered for those).
    void setActiveStudies(const QStringList& names);
    QTabWidget* chartTabs() const { return m_charts; }
    /// Whether the page shows its empty state (the workspace has no study).
    bool isEmptyShown() const;
    /// The line beside Refresh (errors in red).
    QString statusText() const;

    // The charts, for export and tests.
    QCustomPlot* historyPlot() const;
    /// The best-so-far step line of the selected study (null: no complete trial yet).
    QCPGraph* bestSoFarGraph() const;
    QCustomPlot* parallelPlot() const;
    /// One polyline per trial with a value.
    int parallelLineCount() const;
    QCustomPlot* importancePlot() const;
    /// One bar per parameter (none with fewer than 4 complete trials).
    QCPBars* importanceBars() const;
    QCustomPlot* ppoPlot() const;
    /// The PPO chart's lines: learning rate (false) or batch size (true), one per trial run.
    int ppoLineCount(bool batch) const;
    /// Whether the PPO tab is offered (the selected study's sampler is "ppo").
    bool isPpoShown() const;

Q_SIGNALS:
    /// The user selected trials in the table: their runs, ascending (empty: none selected).
    void runsSelected(QList<qint64> runIds);
    /// A trial was double-clicked: show these runs (the selected trials') on the Runs page.
    void runsOpened(QList<qint64> runIds);
    /// New study… was clicked.
    void newStudyRequested();
    /// Stop or Resume was clicked for study NAME.
    void stopStudyRequested(const QString& name);
    void resumeStudyRequested(const QString& name);
    /// After a read of the studies list was applied (also after a failed one: see statusText()).
    void refreshed();
    /// The selected study's trials and charts are shown.
    void studyLoaded();

protected:
    void showEvent(QShowEvent* event) override;

private:
    struct Source;
    struct ListRead;
    void applyRefresh(uint64_t generation, const std::shared_ptr<ListRead>& read);
    void applyStudy(uint64_t generation, uint64_t request, const std::shared_ptr<StudyDetail>& read);
    /// Reads the selected study (again when `force`, else only when the selection moved).
    void loadStudy(bool force);
    void fillTrials(const StudyDetail& detail);
    void clearStudy(const QString& hint);
    void onTrialSelectionChanged();
    void setStatusText(const QString& text, bool error = false);
    void updateControls();

    QString m_path;
    std::shared_ptr<Source> m_source;  // used only on m_pool's one thread
    QStackedWidget* m_stack = nullptr;
    QTreeWidget* m_list = nullptr;
    QTableView* m_table = nullptr;
    QStandardItemModel* m_model = nullptr;
    TrialSortProxy* m_proxy = nullptr;
    QLabel* m_studyLabel = nullptr;
    QLabel* m_empty = nullptr;
    QLabel* m_status = nullptr;
    QPushButton* m_refresh = nullptr;
    QPushButton* m_new = nullptr;
    QPushButton* m_stop = nullptr;
    QPushButton* m_resume = nullptr;
    QStringList m_active;  // studies this window's processes run
    // Studies whose process ended, with m_readsStarted then: their listed status is stale until a
    // later read lands.
    QHash<QString, uint64_t> m_endedAt;
    uint64_t m_readsStarted = 0;
    QTabWidget* m_charts = nullptr;
    StudyHistoryChart* m_history = nullptr;
    ParallelCoordinatesChart* m_parallel = nullptr;
    ImportanceChart* m_importance = nullptr;
    PpoChoicesChart* m_ppo = nullptr;
    QTimer* m_poll = nullptr;

    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};    // bumped when the workspace changes: its reads are dropped
    std::atomic<uint64_t> m_studyRequest{0};  // only the latest selection's read is shown
    QString m_shownStudy;                     // what the trials and charts show (or are loading)
    QString m_tableStudy;                     // the study whose trials fill the table
    std::string m_shownFingerprint;           // of the read they show: an unchanged re-read is not redrawn
    QStringList m_paramKeys;                  // the table's parameter columns
    QList<qint64> m_lastEmitted;              // runsSelected() is not repeated for the same runs
    bool m_refreshing = false;
    bool m_refreshAgain = false;
    bool m_studyLoading = false;
    bool m_anyRunning = false;
    bool m_filling = false;  // the table is being rebuilt: its selection changes are not the user's
    int m_refreshCount = 0;
    bool m_selectedOnce = false;  // the first read picks a row; later ones keep the user's choice
};

}  // namespace lathe::widgets

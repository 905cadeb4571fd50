#pragma once
// The main window wires the run form, the runs table, the per-run views and the training
// session together; the work itself happens in those classes.
#include <QMainWindow>
#include <QPointer>
#include <QThreadPool>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/registry.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"
#include "lathe/widgets/run_view.h"

class QLabel;
class QLineEdit;
class QProgressBar;
class QTabWidget;
class QTableView;
class QTimer;

namespace lathe::widgets {
class CompressDialog;
class Dashboard;
class DataSetsView;
class GraphView;
class HostsView;
class ModelsView;
class RunForm;
class RunFilterProxy;
class RunListModel;
class StudiesView;
class StudyDialog;
}  // namespace lathe::widgets

namespace lathe::app {

class DeploySession;
struct DeployOutcome;
class StudyProcesses;
class TrainingSession;

class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(std::unique_ptr<core::Store> store, QWidget* parent = nullptr);
    ~MainWindow() override;

    core::Store& store() const { return *m_store; }
    widgets::RunForm* runForm() const { return m_form; }
    widgets::Dashboard* dashboard() const { return m_dashboard; }
    /// The per-run views, one tab each in this order: Curves, Loss scale, Profile, Communication,
    /// Data, Log, Graph.
    const std::vector<widgets::RunView*>& runViews() const { return m_runViews; }
    /// The per-run view of class View (runView<widgets::CommView>()), or null.
    template <class View>
    View* runView() const;
    QTabWidget* viewTabs() const { return m_tabs; }
    widgets::RunListModel* runModel() const { return m_runModel; }
    QTableView* runTable() const { return m_table; }
    QLineEdit* runFilter() const { return m_runFilter; }
    /// Re-reads the runs list every few seconds (a test stops it to count reads).
    QTimer* refreshTimer() const { return m_refreshTimer; }
    TrainingSession* session() const { return m_session.get(); }
    /// "Runs" (form, runs table, per-run views), "Models" (registry and deployments), "Hosts"
    /// (the workspace's SSH hosts), "Data sets" (versioned data sets and their lineage),
    /// "Studies" (hyper-parameter studies and their trials) and "Graph".
    QTabWidget* pageTabs() const { return m_pages; }
    widgets::ModelsView* modelsView() const { return m_models; }
    widgets::HostsView* hostsView() const { return m_hosts; }
    widgets::DataSetsView* dataSetsView() const { return m_dataSets; }
    /// Trials selected there are selected in the runs table (their curves on the Curves tab).
    widgets::StudiesView* studiesView() const { return m_studies; }
    /// The "Graph" page: a model file (File → Open Model…) or a registered version's graph.
    widgets::GraphView* graphPage() const { return m_graphPage; }
    /// Shows a TorchScript or ONNX file on the Graph page.
    void openModelFile(const QString& path, const QString& title = {});
    /// Shows a registered version's graph on the Graph page (false: not in the registry).
    bool showModelGraph(const QString& model, qint64 version);
    DeploySession* deploySession() const { return m_deploy.get(); }
    /// The workspace's model registry (same file as the store); null when it could not be opened.
    core::Registry* registry() const { return m_registry.get(); }
    /// The Compress dialog for NAME vV (what the Models page's Compress… opens): it runs
    /// core::quantizeModel on this workspace; the page refreshes when a version is registered.
    widgets::CompressDialog* openCompressDialog(const QString& model, qint64 version);
    /// The last one opened, while it is open.
    widgets::CompressDialog* compressDialog() const;
    /// The New Study dialog (Studies page → New study…) for the run form's configuration: on
    /// Start, a `lathectl tune` process runs the study (studyProcesses()) and the page shows it.
    /// Null, with the error shown, while the run form has errors.
    widgets::StudyDialog* openStudyDialog();
    /// The last one opened, while it is open.
    widgets::StudyDialog* studyDialog() const;
    /// The studies running from this window.
    StudyProcesses* studyProcesses() const { return m_studyProcs.get(); }
    /// The last error shown to the user (for tests and the status bar).
    QString lastError() const { return m_lastError; }

    /// Re-reads the runs list on a worker thread; the rows land in runModel() with
    /// runsRefreshed(), keeping selection and scroll position. Asked again while a read is in
    /// flight, it reads once more after that read (however often it was asked).
    void refreshRuns();
    /// Whether a refresh asked for has not landed in runModel() yet.
    bool isRefreshingRuns() const { return m_runsLanded < m_runsAsked; }
    /// Selects exactly these runs in the table (the views follow the selection).
    void selectRuns(const std::vector<int64_t>& runIds);
    /// selectRuns() once the refresh asked for last has landed (a new run's row exists only
    /// then), or now when none is pending. A later call replaces one still waiting.
    void selectRunsWhenRefreshed(const std::vector<int64_t>& runIds);
    void selectNewestRun();
    std::vector<int64_t> selectedRuns() const;
    /// Switches to another workspace file. Refused while training; errors are shown.
    bool openWorkspace(const QString& path);

Q_SIGNALS:
    /// A read of the runs list landed: runModel() holds it, unless the read failed (the status
    /// bar says why).
    void runsRefreshed();

protected:
    void closeEvent(QCloseEvent* event) override;

private:
    struct RunsRead;
    /// Gives the view a tab (title and tooltip from the view) and its share of every run event.
    void addRunView(widgets::RunView* view, const QString& objectName);
    void startRunsRead();
    void applyRunsRead(uint64_t generation, const std::shared_ptr<RunsRead>& read);
    /// Runs `then` once the refresh asked for last has landed (now when none is pending); dropped
    /// when that read fails or the workspace is switched.
    void whenRefreshed(std::function<void()> then);
    /// Drops the runs reads in flight and waiting calls: before the store goes.
    void stopRunsReads();
    /// Refreshes the runs list of a newly opened store; once it lands, selects the newest run
    /// (unless selectRunsWhenRefreshed() asked for others meanwhile) and says how many runs
    /// there are (and that `openedPath` was opened, when given).
    void showNewStore(const QString& openedPath);
    void buildMenus();
    void connectSession();
    /// Opens the registry of the current store and hands it to the Models page and a new
    /// deploy session; a failure is shown and leaves the page empty.
    void openRegistry();
    void connectDeploySession();
    void onDeployFinished(const DeployOutcome& outcome);
    void onStartRequested(const core::RunSpec& spec);
    void onStarted(qint64 runId);
    void onEvents(qint64 runId, const std::vector<core::Event>& events);
    void onFinished(qint64 runId, const QString& status, const QString& error);
    void onSelectionChanged();
    void openWorkspaceDialog();
    // The workspace's versioned data sets, offered in the run form's data field.
    void offerDataSets();
    void exportChartsDialog();
    void showError(const QString& title, const QString& message);
    void updateTitle();

    std::unique_ptr<core::Store> m_store;
    std::unique_ptr<TrainingSession> m_session;
    QPointer<widgets::CompressDialog> m_compressDialog;
    QPointer<widgets::StudyDialog> m_studyDialog;
    std::unique_ptr<StudyProcesses> m_studyProcs;
    std::shared_ptr<core::Registry> m_registry;
    widgets::GraphView* m_graphPage = nullptr;
    std::unique_ptr<DeploySession> m_deploy;
    QTabWidget* m_pages = nullptr;
    widgets::ModelsView* m_models = nullptr;
    widgets::HostsView* m_hosts = nullptr;
    widgets::DataSetsView* m_dataSets = nullptr;
    widgets::StudiesView* m_studies = nullptr;
    widgets::RunForm* m_form = nullptr;
    widgets::Dashboard* m_dashboard = nullptr;  // also in m_runViews; File → Export charts
    std::vector<widgets::RunView*> m_runViews;  // owned by m_tabs
    QTabWidget* m_tabs = nullptr;
    widgets::RunListModel* m_runModel = nullptr;
    widgets::RunFilterProxy* m_proxy = nullptr;
    QTableView* m_table = nullptr;
    QLineEdit* m_runFilter = nullptr;
    QLabel* m_progress = nullptr;
    QProgressBar* m_progressBar = nullptr;
    QTimer* m_refreshTimer = nullptr;
    int64_t m_liveRunId = 0;
    QString m_lastError;

    // The runs list is read on this pool's one thread from m_store (thread-safe: its read
    // connection is used under a lock), and applied on the GUI thread.
    QThreadPool m_runsPool;
    std::atomic<uint64_t> m_runsGeneration{0};  // bumped when the store goes: its reads are dropped
    uint64_t m_runsAsked = 0;                   // refreshRuns() calls
    uint64_t m_runsLanded = 0;                  // the calls the last landed read answered
    bool m_runsReading = false;
    std::vector<std::pair<uint64_t, std::function<void()>>> m_afterRuns;  // (call, then)
    uint64_t m_selectionAsked = 0;  // only the latest waiting selection is made
};

template <class View>
View* MainWindow::runView() const {
    for (widgets::RunView* view : m_runViews)
        if (auto* v = qobject_cast<View*>(view->widget())) return v;
    return nullptr;
}

}  // namespace lathe::app

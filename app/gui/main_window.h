#pragma once
// The main window wires the run form, the runs table, the dashboard and the training
// session together; the work itself happens in those classes.
#include <QMainWindow>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "lathe/core/events.h"
#include "lathe/core/registry.h"
#include "lathe/core/run_spec.h"
#include "lathe/core/store.h"

class QLabel;
class QProgressBar;
class QSortFilterProxyModel;
class QTabWidget;
class QTableView;
class QTimer;

namespace lathe::widgets {
class CommView;
class Dashboard;
class LossScaleView;
class ModelsView;
class ProfileView;
class RunForm;
class RunListModel;
}  // namespace lathe::widgets

namespace lathe::app {

class DeploySession;
struct DeployOutcome;
class TrainingSession;

class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(std::unique_ptr<core::Store> store, QWidget* parent = nullptr);
    ~MainWindow() override;

    core::Store& store() const { return *m_store; }
    widgets::RunForm* runForm() const { return m_form; }
    widgets::Dashboard* dashboard() const { return m_dashboard; }
    widgets::LossScaleView* lossScaleView() const { return m_lossScale; }
    widgets::ProfileView* profileView() const { return m_profile; }
    widgets::CommView* commView() const { return m_comm; }
    /// "Curves", "Loss scale", "Profile", "Communication".
    QTabWidget* viewTabs() const { return m_tabs; }
    widgets::RunListModel* runModel() const { return m_runModel; }
    QTableView* runTable() const { return m_table; }
    TrainingSession* session() const { return m_session.get(); }
    /// "Runs" (form, runs table, per-run views) and "Models" (registry and deployments).
    QTabWidget* pageTabs() const { return m_pages; }
    widgets::ModelsView* modelsView() const { return m_models; }
    DeploySession* deploySession() const { return m_deploy.get(); }
    /// The workspace's model registry (same file as the store); null when it could not be opened.
    core::Registry* registry() const { return m_registry.get(); }
    /// The last error shown to the user (for tests and the status bar).
    QString lastError() const { return m_lastError; }

    /// Re-reads the runs list; selection and scroll position are kept.
    void refreshRuns();
    /// Selects exactly these runs in the table (the dashboard follows the selection).
    void selectRuns(const std::vector<int64_t>& runIds);
    void selectNewestRun();
    std::vector<int64_t> selectedRuns() const;
    /// Switches to another workspace file. Refused while training; errors are shown.
    bool openWorkspace(const QString& path);

protected:
    void closeEvent(QCloseEvent* event) override;

private:
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
    /// Loads the first selected run into the Profile tab when that tab is showing (it reads
    /// every span of the run, so it waits until someone looks).
    void updateProfileTab(bool force = false);
    void openWorkspaceDialog();
    void exportChartsDialog();
    void showError(const QString& title, const QString& message);
    void updateTitle();

    std::unique_ptr<core::Store> m_store;
    std::unique_ptr<TrainingSession> m_session;
    std::shared_ptr<core::Registry> m_registry;
    std::unique_ptr<DeploySession> m_deploy;
    QTabWidget* m_pages = nullptr;
    widgets::ModelsView* m_models = nullptr;
    widgets::RunForm* m_form = nullptr;
    widgets::Dashboard* m_dashboard = nullptr;
    widgets::LossScaleView* m_lossScale = nullptr;
    widgets::ProfileView* m_profile = nullptr;
    widgets::CommView* m_comm = nullptr;
    QTabWidget* m_tabs = nullptr;
    int64_t m_profileRunShown = -1;  // run the Profile tab last loaded
    widgets::RunListModel* m_runModel = nullptr;
    QSortFilterProxyModel* m_proxy = nullptr;
    QTableView* m_table = nullptr;
    QLabel* m_progress = nullptr;
    QProgressBar* m_progressBar = nullptr;
    QTimer* m_refreshTimer = nullptr;
    int64_t m_liveRunId = 0;
    QString m_lastError;
};

}  // namespace lathe::app

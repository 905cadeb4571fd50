#pragma once
// The Models page: the registered models and their versions (ModelListModel in a tree), Deploy
// and Roll back buttons, and the deployment dashboard of the selected model below. A click asks
// for confirmation in words that name exactly what will change ("Deploy digits v3 to
// http://127.0.0.1:8500, replacing v2?") and then only emits a request: the deployment itself runs
// in the application's deploy session, which reports back through setBusy/setStatusText.
//
// The list is re-read from the registry every few seconds (deployments made by lathectl or the
// rollout controller show up) on a worker thread; a generation counter drops stale reads.
#include <QSet>
#include <QString>
#include <QStringList>
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "lathe/core/registry.h"

class QComboBox;
class QDialog;
class QLabel;
class QPushButton;
class QTimer;
class QTreeView;

namespace lathe::widgets {

class ModelListModel;
struct ModelEntry;
class RolloutView;
class ServingDashboard;

class ModelsView : public QWidget {
    Q_OBJECT
public:
    /// Asked before Deploy / Roll back act; true goes ahead. The default shows a question box.
    using ConfirmHook = std::function<bool(const QString& title, const QString& question)>;

    explicit ModelsView(QWidget* parent = nullptr);
    /// Waits for a list read in flight.
    ~ModelsView() override;

    /// The registry to show (nullptr: nothing); shared with the readers on worker threads.
    void setRegistry(std::shared_ptr<const core::Registry> registry);
    /// Re-reads the model list in the background; refreshed() follows.
    void refresh();
    void setRefreshInterval(int ms);
    /// nullptr restores the default question box.
    void setConfirmHook(ConfirmHook hook);
    /// Where a model without a live server is deployed on this machine (named in the confirmation).
    void setDeployTarget(const QString& host, int port);
    /// The workspace's hosts, offered beside "This machine" as where a new server runs. The choice
    /// is kept when it is still among them.
    void setTargetHosts(const QStringList& names);
    /// The host of the inventory a deploy of the selected version starts its server on; empty:
    /// this machine, or the selected model is live (a live model is hot-swapped where it runs).
    QString deployHost() const;

    /// While a deployment runs: buttons disabled, `text` shown as its progress.
    void setBusy(bool busy, const QString& text = {});
    bool isBusy() const { return m_busy; }
    /// The line beside the buttons (progress, the outcome, errors in red).
    void setStatusText(const QString& text, bool error = false);
    QString statusText() const;

    void selectModel(const QString& model, int64_t version = 0);
    QString selectedModel() const;
    /// The selected version; 0 when a model row (or nothing) is selected.
    int64_t selectedVersion() const;

    /// The confirmation texts the buttons would show now.
    QString deployQuestion(const QString& model, int64_t version) const;
    QString rollbackQuestion(const QString& model) const;

    ModelListModel* listModel() const { return m_model; }
    QTreeView* tree() const { return m_tree; }
    QPushButton* deployButton() const { return m_deploy; }
    QPushButton* rollbackButton() const { return m_rollback; }
    QPushButton* compressButton() const { return m_compress; }
    QPushButton* reportButton() const { return m_report; }
    QComboBox* targetBox() const { return m_target; }
    ServingDashboard* dashboard() const { return m_dashboard; }
    /// The selected model's rollout (A/B dashboard, Start/Pause/Resume/Abort), a tab beside the
    /// serving dashboard.
    RolloutView* rolloutView() const { return m_rollouts; }
    bool isRefreshing() const { return m_refreshing; }
    int refreshCount() const { return m_refreshCount; }

public Q_SLOTS:
    /// What the buttons do: confirm, then emit the request.
    void requestDeploy();
    void requestRollback();
    /// The selected compressed version's report against its parent, in a dialog of its own
    /// (returned; nullptr when the selection has no report).
    QDialog* showReport();

Q_SIGNALS:
    void deployRequested(const QString& model, qint64 version);
    void rollbackRequested(const QString& model, qint64 fromVersion, qint64 toVersion);
    /// Compress… on a selected version: the application opens its Compress dialog.
    void compressRequested(const QString& model, qint64 version);
    /// "Graph…": show the selected version's op graph.
    void graphRequested(const QString& model, qint64 version);
    /// After a list read was applied (also after a failed one: see statusText()).
    void refreshed();

protected:
    void showEvent(QShowEvent* event) override;

private:
    struct ReadResult;
    void applyRefresh(uint64_t generation, const std::shared_ptr<ReadResult>& result);
    void onSelectionChanged();
    void updateButtons();
    bool confirm(const QString& title, const QString& question);

    ModelListModel* m_model = nullptr;
    QTreeView* m_tree = nullptr;
    QPushButton* m_deploy = nullptr;
    QPushButton* m_rollback = nullptr;
    QPushButton* m_refresh = nullptr;
    QPushButton* m_compress = nullptr;
    QPushButton* m_graph = nullptr;
    QPushButton* m_report = nullptr;
    QComboBox* m_target = nullptr;
    QString m_chosenHost;  // the person's choice in m_target ("": this machine), kept while a live model
                           // shows its own
    QLabel* m_status = nullptr;
    ServingDashboard* m_dashboard = nullptr;
    RolloutView* m_rollouts = nullptr;
    QTimer* m_timer = nullptr;
    ConfirmHook m_confirm;
    QString m_host = QStringLiteral("127.0.0.1");
    int m_port = 8500;

    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};
    std::shared_ptr<const core::Registry> m_registry;
    bool m_refreshing = false;
    bool m_refreshAgain = false;
    int m_refreshCount = 0;
    bool m_busy = false;
    bool m_fitColumns = false;    // content changed since the columns were last widened
    bool m_selectedOnce = false;  // the first read picks a row; later ones keep the user's choice
    QString m_dashboardModel;
    QSet<QString> m_seenModels;  // models whose row was expanded once
};

}  // namespace lathe::widgets

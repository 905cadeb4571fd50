#pragma once
// The Hosts page: the workspace's SSH hosts (HostListModel in a table) with Add, Edit, Remove,
// Check and Trust key. Add/Edit open a HostDialog that writes through the store; Remove asks
// first. Check connects to each chosen host with the strict host-key policy and probes it
// (probeHost) on a pool, never on the GUI thread; each result lands in its row by queued call.
// Trust key looks at the key strictly on the pool, asks on the GUI thread whether to add the
// fingerprint it shows (default No), then connects again on the pool adding it, and re-checks
// the host. A changed key is shown, never added.
//
// The inventory is a few rows read and written synchronously through the store (Store's host
// calls commit before they return), so the dialog can show the store's own refusal.
#include <QSet>
#include <QString>
#include <QStringList>
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "lathe/core/store.h"
#include "lathe/widgets/host_probe.h"

class QLabel;
class QPushButton;
class QTableView;

namespace lathe::widgets {

class HostDialog;
class HostListModel;

class HostsView : public QWidget {
    Q_OBJECT
public:
    /// Asked before Remove and before a key is added; true goes ahead. The default shows a
    /// question box whose default button is No.
    using ConfirmHook = std::function<bool(const QString& title, const QString& question)>;

    explicit HostsView(QWidget* parent = nullptr);
    /// Cancels the probes in flight and waits for them (each ends within its SSH deadlines).
    ~HostsView() override;

    /// The workspace whose inventory is shown (not owned; nullptr: none). Results of checks
    /// still running for the previous one are dropped.
    void setStore(core::Store* store);
    /// Re-reads the inventory; hostsChanged() follows.
    void reload();
    void setConfirmHook(ConfirmHook hook);
    /// The lathectl whose version remote ones must match (empty: the one beside this program).
    void setLathectlProgram(const std::string& path);
    /// The known_hosts file checks and trust use (empty: ~/.ssh/known_hosts).
    void setKnownHostsFile(const std::string& path);
    void setConnectTimeout(int seconds);

    HostListModel* listModel() const { return m_model; }
    QTableView* table() const { return m_table; }
    QPushButton* addButton() const { return m_add; }
    QPushButton* editButton() const { return m_edit; }
    QPushButton* removeButton() const { return m_remove; }
    QPushButton* checkButton() const { return m_check; }
    QPushButton* trustButton() const { return m_trust; }
    /// The Add/Edit dialog while it is open, else null.
    HostDialog* dialog() const { return m_dialog; }

    void selectHost(const QString& name);
    QString selectedHost() const;  // the current row's host; empty: none
    QStringList selectedHosts() const;
    /// Checks or trust steps in flight.
    int busyCount() const { return m_busy; }
    /// The line beside the buttons (outcomes, errors in red).
    QString statusText() const;

public Q_SLOTS:
    /// Opens the Add dialog (window-modal, not blocking); an added host is selected.
    void addHost();
    /// Opens the Edit dialog for the selected host.
    void editHost();
    /// Asks, then removes the selected host from the workspace.
    void removeHost();
    /// Checks the selected hosts (all of them when none is selected) in the background.
    void checkSelected();
    void checkHost(const QString& name);
    /// Trust key for the selected host (see the file comment).
    void trustSelected();

Q_SIGNALS:
    /// The inventory changed (added, edited, removed) or was re-read.
    void hostsChanged();
    /// A check's result landed in the model.
    void checked(const QString& name);
    /// Trust ended: `trusted` says whether known_hosts now has the host's key (added now, or
    /// there already); `message` says what happened.
    void trustFinished(const QString& name, bool trusted, const QString& message);

protected:
    void showEvent(QShowEvent* event) override;

private:
    void openDialog(bool editing, const core::HostRecord& initial);
    void askTrust(const core::HostRecord& host, const KeyLook& look);
    void finishTrust(const QString& name, bool trusted, const QString& message);
    bool confirm(const QString& title, const QString& question);
    void setStatusText(const QString& text, bool error = false);
    void updateButtons();
    ProbeOptions probeOptions() const;
    /// Runs `work` on the pool and `then` with its result on the GUI thread, unless the store
    /// was switched meanwhile.
    template <class Result>
    void runInBackground(std::function<Result()> work, std::function<void(const Result&)> then);

    core::Store* m_store = nullptr;
    HostListModel* m_model = nullptr;
    QTableView* m_table = nullptr;
    QPushButton* m_add = nullptr;
    QPushButton* m_edit = nullptr;
    QPushButton* m_remove = nullptr;
    QPushButton* m_check = nullptr;
    QPushButton* m_trust = nullptr;
    QPushButton* m_refresh = nullptr;
    QLabel* m_status = nullptr;
    HostDialog* m_dialog = nullptr;
    ConfirmHook m_confirm;
    std::string m_lathectlProgram;
    std::string m_knownHosts;
    int m_connectTimeout = 10;

    QThreadPool m_pool;
    std::atomic<bool> m_cancel{false};
    std::atomic<uint64_t> m_generation{0};  // bumped when the store changes: results are dropped
    int m_busy = 0;
    QSet<QString> m_trusting;  // hosts with a Trust in progress
};

}  // namespace lathe::widgets

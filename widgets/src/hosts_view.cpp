#include "lathe/widgets/hosts_view.h"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QMetaObject>
#include <QPushButton>
#include <QTableView>
#include <QVBoxLayout>

#include <exception>
#include <memory>
#include <utility>

#include "lathe/core/error.h"
#include "lathe/widgets/host_dialog.h"
#include "lathe/widgets/host_list_model.h"

namespace lathe::widgets {

namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

// What one check hands back: the probe, and this build's version it was judged against.
struct CheckOutcome {
    HostProbe probe;
    std::string expected;      // "lathectl 0.1.0"; empty when it could not be told
    std::string versionError;  // why not
};

// "gpu-b (alice@10.0.0.3:2222)": how the page names a host in questions.
QString describe(const core::HostRecord& h) {
    QString where = q(h.address);
    if (!h.user.empty()) where = q(h.user) + QLatin1Char('@') + where;
    if (h.port != 0) where += QLatin1Char(':') + QString::number(h.port);
    return QStringLiteral("%1 (%2)").arg(q(h.name), where);
}

}  // namespace

HostsView::HostsView(QWidget* parent) : QWidget(parent) {
    // Each check holds one SSH connection for a few seconds; a handful at once is plenty.
    m_pool.setMaxThreadCount(4);

    m_model = new HostListModel(this);
    m_table = new QTableView(this);
    m_table->setObjectName(QStringLiteral("hostTable"));
    m_table->setModel(m_model);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_table->setAlternatingRowColors(true);
    m_table->setWordWrap(false);
    m_table->verticalHeader()->hide();
    m_table->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 6);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->setToolTip(tr("Double-click a host to edit it"));

    m_add = new QPushButton(tr("Add…"), this);
    m_add->setObjectName(QStringLiteral("addHostButton"));
    m_add->setToolTip(tr("Add an SSH host to this workspace (lathectl hosts add)"));
    m_edit = new QPushButton(tr("Edit…"), this);
    m_edit->setObjectName(QStringLiteral("editHostButton"));
    m_remove = new QPushButton(tr("Remove"), this);
    m_remove->setObjectName(QStringLiteral("removeHostButton"));
    m_check = new QPushButton(tr("Check"), this);
    m_check->setObjectName(QStringLiteral("checkHostButton"));
    m_check->setToolTip(
        tr("Connect (host key checked, never added) and report system, cores, memory, GPUs and "
           "lathectl: the selected hosts, or all of them"));
    m_trust = new QPushButton(tr("Trust key…"), this);
    m_trust->setObjectName(QStringLiteral("trustHostButton"));
    m_trust->setToolTip(
        tr("Show the selected host's key fingerprint and add it to known_hosts if you accept it"));
    m_refresh = new QPushButton(tr("Refresh"), this);
    m_refresh->setToolTip(
        tr("Re-read the hosts of this workspace (lathectl hosts add/remove change them too)"));
    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("hostsStatus"));
    m_status->setWordWrap(true);
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);

    auto* buttons = new QHBoxLayout;
    buttons->setContentsMargins(4, 2, 4, 2);
    buttons->addWidget(m_add);
    buttons->addWidget(m_edit);
    buttons->addWidget(m_remove);
    buttons->addSpacing(12);
    buttons->addWidget(m_check);
    buttons->addWidget(m_trust);
    buttons->addSpacing(12);
    buttons->addWidget(m_status, 1);
    buttons->addWidget(m_refresh);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addLayout(buttons);
    layout->addWidget(m_table, 1);

    connect(m_add, &QPushButton::clicked, this, &HostsView::addHost);
    connect(m_edit, &QPushButton::clicked, this, &HostsView::editHost);
    connect(m_remove, &QPushButton::clicked, this, &HostsView::removeHost);
    connect(m_check, &QPushButton::clicked, this, &HostsView::checkSelected);
    connect(m_trust, &QPushButton::clicked, this, &HostsView::trustSelected);
    connect(m_refresh, &QPushButton::clicked, this, &HostsView::reload);
    connect(m_table, &QTableView::doubleClicked, this, [this](const QModelIndex&) { editHost(); });
    connect(m_table->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &HostsView::updateButtons);
    connect(m_table->selectionModel(), &QItemSelectionModel::currentChanged, this, &HostsView::updateButtons);
    connect(m_model, &QAbstractItemModel::rowsInserted, this, &HostsView::updateButtons);
    connect(m_model, &QAbstractItemModel::rowsRemoved, this, &HostsView::updateButtons);
    updateButtons();
}

HostsView::~HostsView() {
    ++m_generation;
    m_cancel.store(true);
    m_pool.waitForDone();
}

void HostsView::setStore(core::Store* store) {
    ++m_generation;  // checks of the previous workspace's hosts land nowhere
    m_store = store;
    m_trusting.clear();
    m_model->setHosts({});
    setStatusText({});
    reload();
}

void HostsView::reload() {
    std::vector<core::HostRecord> hosts;
    if (m_store) {
        try {
            hosts = m_store->hosts();
        } catch (const std::exception& e) {
            setStatusText(tr("Could not read the hosts: %1").arg(QString::fromUtf8(e.what())), true);
            return;
        }
    }
    const bool grew = int(hosts.size()) != m_model->rowCount();
    m_model->setHosts(std::move(hosts));
    if (grew) m_table->resizeColumnsToContents();
    updateButtons();
    Q_EMIT hostsChanged();
}

void HostsView::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    reload();  // hosts added with lathectl meanwhile
}

void HostsView::setConfirmHook(ConfirmHook hook) { m_confirm = std::move(hook); }
void HostsView::setLathectlProgram(const std::string& path) { m_lathectlProgram = path; }
void HostsView::setKnownHostsFile(const std::string& path) { m_knownHosts = path; }
void HostsView::setConnectTimeout(int seconds) { m_connectTimeout = seconds; }

ProbeOptions HostsView::probeOptions() const {
    ProbeOptions o;
    o.knownHostsFile = m_knownHosts;
    o.connectTimeoutSec = m_connectTimeout;
    o.cancel = &m_cancel;
    return o;
}

QString HostsView::statusText() const { return m_status->text(); }

void HostsView::setStatusText(const QString& text, bool error) {
    m_status->setText(text);
    m_status->setStyleSheet(error ? QStringLiteral("color: #c62828;") : QString());
}

bool HostsView::confirm(const QString& title, const QString& question) {
    if (m_confirm) return m_confirm(title, question);
    return QMessageBox::question(this, title, question, QMessageBox::Yes | QMessageBox::No,
                                 QMessageBox::No) == QMessageBox::Yes;
}

void HostsView::selectHost(const QString& name) {
    const int row = m_model->rowOfHost(name);
    if (row < 0) return;
    m_table->selectionModel()->setCurrentIndex(
        m_model->index(row, 0), QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    m_table->scrollTo(m_model->index(row, 0));
}

QString HostsView::selectedHost() const {
    const QModelIndexList rows = m_table->selectionModel()->selectedRows();
    if (rows.size() == 1) return rows.front().data(HostListModel::NameRole).toString();
    const QModelIndex current = m_table->selectionModel()->currentIndex();
    if (current.isValid() && m_table->selectionModel()->isRowSelected(current.row(), {}))
        return current.data(HostListModel::NameRole).toString();
    return {};
}

QStringList HostsView::selectedHosts() const {
    QStringList names;
    for (int row = 0; row < m_model->rowCount(); ++row)
        if (m_table->selectionModel()->isRowSelected(row, {}))
            names << m_model->index(row, 0).data(HostListModel::NameRole).toString();
    return names;
}

void HostsView::updateButtons() {
    const bool store = m_store != nullptr;
    const QString selected = selectedHost();
    m_add->setEnabled(store);
    m_edit->setEnabled(store && !selected.isEmpty());
    m_remove->setEnabled(store && !selected.isEmpty());
    m_check->setEnabled(m_model->rowCount() > 0);
    m_trust->setEnabled(!selected.isEmpty() && !m_trusting.contains(selected));
}

template <class Result>
void HostsView::runInBackground(std::function<Result()> work, std::function<void(const Result&)> then) {
    const uint64_t generation = m_generation.load();
    ++m_busy;
    // `this` outlives the task: the destructor waits for the pool. A queued call to a deleted
    // view is discarded by Qt.
    m_pool.start([this, work = std::move(work), then = std::move(then), generation] {
        auto result = std::make_shared<Result>(work());
        QMetaObject::invokeMethod(
            this,
            [this, result, then, generation] {
                --m_busy;
                if (generation == m_generation.load()) then(*result);
                updateButtons();
            },
            Qt::QueuedConnection);
    });
}

// ---- add, edit, remove ---------------------------------------------------------------------

void HostsView::addHost() {
    if (!m_store) return;
    openDialog(false, core::HostRecord{});
}

void HostsView::editHost() {
    if (!m_store) return;
    const int row = m_model->rowOfHost(selectedHost());
    if (const core::HostRecord* h = m_model->hostAt(row)) openDialog(true, *h);
}

void HostsView::openDialog(bool editing, const core::HostRecord& initial) {
    if (m_dialog) {
        m_dialog->raise();
        return;
    }
    HostDialog::Commit commit = [this, editing](const core::HostRecord& h) -> QString {
        if (!m_store) return tr("No workspace is open.");
        if (editing) {
            m_store->updateHost(h);
        } else {
            if (m_store->host(h.name))
                return tr("Host '%1' already exists in this workspace; choose another name, or edit it.")
                    .arg(q(h.name));
            m_store->addHost(h);
        }
        return {};
    };
    auto* dialog = new HostDialog(editing, initial, std::move(commit), this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->setWindowModality(Qt::WindowModal);
    m_dialog = dialog;
    auto forget = [this, dialog] {
        if (m_dialog == dialog) m_dialog = nullptr;
    };
    connect(dialog, &QDialog::finished, this, forget);
    connect(dialog, &QObject::destroyed, this, forget);
    connect(dialog, &QDialog::accepted, this, [this, dialog, editing] {
        const QString name = dialog->nameEdit()->text().trimmed();
        reload();
        selectHost(name);
        const int row = m_model->rowOfHost(name);
        if (const core::HostRecord* h = m_model->hostAt(row))
            setStatusText((editing ? tr("Saved host %1, slots: %2") : tr("Added host %1, slots: %2"))
                              .arg(describe(*h), QString::number(h->slots)));
    });
    dialog->open();
}

void HostsView::removeHost() {
    if (!m_store) return;
    const QString name = selectedHost();
    const core::HostRecord* h = m_model->hostAt(m_model->rowOfHost(name));
    if (!h) return;
    const core::HostRecord host = *h;
    if (!confirm(tr("Remove host"),
                 tr("Remove host %1 from this workspace?\n\nRuns recorded on it keep their "
                    "logs and metrics; known_hosts is not changed.")
                     .arg(describe(host))))
        return;
    try {
        if (!m_store->removeHost(host.name)) {
            setStatusText(tr("Host %1 was not in the workspace any more").arg(name), true);
        } else {
            setStatusText(tr("Removed host %1").arg(name));
        }
    } catch (const std::exception& e) {
        setStatusText(tr("Could not remove host %1: %2").arg(name, QString::fromUtf8(e.what())), true);
    }
    reload();
}

// ---- check ---------------------------------------------------------------------------------

void HostsView::checkSelected() {
    QStringList names = selectedHosts();
    if (names.isEmpty())
        for (const auto& h : m_model->hosts()) names << q(h.name);
    for (const QString& name : names) checkHost(name);
}

void HostsView::checkHost(const QString& name) {
    const core::HostRecord* h = m_model->hostAt(m_model->rowOfHost(name));
    if (!h || m_model->state(name) == HostListModel::State::Checking) return;
    m_model->setChecking(name);
    setStatusText(tr("Checking %1…").arg(describe(*h)));
    const core::HostRecord host = *h;
    const ProbeOptions options = probeOptions();
    const std::string program = m_lathectlProgram;
    runInBackground<CheckOutcome>(
        [host, options, program] {
            CheckOutcome out;
            ProbeOptions o = options;
            try {
                out.expected = lathectlVersion(program);
            } catch (const std::exception& e) {
                out.versionError = e.what();
            }
            o.expectedVersion = out.expected;
            out.probe = probeHost(host, o);
            return out;
        },
        [this, name](const CheckOutcome& out) {
            if (!out.expected.empty()) m_model->setExpectedVersion(q(out.expected));
            m_model->setProbe(name, out.probe);
            const int row = m_model->rowOfHost(name);
            for (int c : {HostListModel::ColSystem, HostListModel::ColGpus, HostListModel::ColVersion,
                          HostListModel::ColHostKey})
                if (row >= 0) m_table->resizeColumnToContents(c);
            const auto state = m_model->state(name);
            const QString text = tr("%1: %2").arg(name, m_model->statusText(name));
            setStatusText(text, state == HostListModel::State::Failed);
            Q_EMIT checked(name);
        });
}

// ---- trust ---------------------------------------------------------------------------------

void HostsView::trustSelected() {
    const QString name = selectedHost();
    const core::HostRecord* h = m_model->hostAt(m_model->rowOfHost(name));
    if (!h || m_trusting.contains(name)) return;
    m_trusting.insert(name);
    updateButtons();
    setStatusText(tr("Looking at the host key of %1…").arg(describe(*h)));
    const core::HostRecord host = *h;
    const ProbeOptions options = probeOptions();
    runInBackground<KeyLook>([host, options] { return lookAtHostKey(host, options); },
                             [this, host](const KeyLook& look) { askTrust(host, look); });
}

void HostsView::askTrust(const core::HostRecord& host, const KeyLook& look) {
    const QString name = q(host.name);
    if (look.result == KeyLook::Result::Trusted) {
        finishTrust(name, true, q(look.message));
        return;
    }
    if (look.result == KeyLook::Result::Refused) {
        finishTrust(name, false, q(look.message));
        // Window-modal but not blocking: a changed key is for a person to resolve on the host.
        auto* box = new QMessageBox(QMessageBox::Warning, tr("Host key not trusted"), q(look.message),
                                    QMessageBox::Ok, this);
        box->setAttribute(Qt::WA_DeleteOnClose);
        box->open();
        return;
    }
    const QString question = tr("Host %1 is not in %2.\n\nIt offers this key:\n\n    %3\n\nCompare it with "
                                "the host's own (on the host: "
                                "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub). Add it to known_hosts?")
                                 .arg(describe(host), q(look.knownHostsFile), q(look.fingerprint));
    if (!confirm(tr("Trust host key of %1?").arg(name), question)) {
        finishTrust(name, false, tr("Key of %1 not added").arg(name));
        return;
    }
    setStatusText(tr("Adding the key of %1…").arg(name));
    const ProbeOptions options = probeOptions();
    const std::string offered = look.fingerprint;
    runInBackground<TrustResult>(
        [host, offered, options] { return trustHostKey(host, offered, options); },
        [this, name](const TrustResult& r) {
            finishTrust(name, r.added, q(r.note.empty() ? r.message : r.message + " (but " + r.note + ")"));
            if (r.added) {
                checkHost(name);
                return;
            }
            auto* box = new QMessageBox(QMessageBox::Warning, tr("Key not added"), q(r.message),
                                        QMessageBox::Ok, this);
            box->setAttribute(Qt::WA_DeleteOnClose);
            box->open();
        });
}

void HostsView::finishTrust(const QString& name, bool trusted, const QString& message) {
    m_trusting.remove(name);
    setStatusText(message, !trusted);
    updateButtons();
    Q_EMIT trustFinished(name, trusted, message);
}

}  // namespace lathe::widgets

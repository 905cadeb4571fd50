#pragma once
// Table model of the workspace's host inventory (the Hosts page): one row per host with how it is
// reached, and what the last check found (system, cores, memory, GPUs, lathectl and whether it is
// this build's version, host key, status). Check results belong to a host's name and connection:
// they survive a re-read of the inventory, and are dropped when the host's address, port, user,
// identity or lathectl path change.
#include <QAbstractTableModel>
#include <QString>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/widgets/host_probe.h"

namespace lathe::widgets {

class HostListModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column {
        ColName = 0,
        ColAddress,
        ColPort,
        ColUser,
        ColSlots,
        ColLathectl,  // the path configured for the host
        ColSystem,    // OS and architecture
        ColCores,
        ColMemory,
        ColGpus,
        ColVersion,  // the lathectl version found there, and whether it matches
        ColHostKey,
        ColStatus,
        ColumnCount
    };
    enum Role {
        NameRole = Qt::UserRole + 1,  // the host's name (every column)
        StateRole,                    // State as int (every column)
    };
    enum class State {
        Unchecked,
        Checking,
        Ok,          // reachable, lathectl found and of this build's version
        Warning,     // reachable, but lathectl missing or another version, or fewer cores than slots
        UnknownKey,  // the host key is not in known_hosts: Trust may add it
        Failed,      // not reachable, changed key, authentication, …
    };

    explicit HostListModel(QObject* parent = nullptr);

    /// The inventory (ordered by name, as Store::hosts()). Rows are diffed by name.
    void setHosts(std::vector<core::HostRecord> hosts);
    const std::vector<core::HostRecord>& hosts() const { return m_hosts; }
    const core::HostRecord* hostAt(int row) const;
    int rowOfHost(const QString& name) const;

    /// This build's `lathectl --version` ("lathectl 0.1.0"), for the version column; empty:
    /// unknown (versions are shown without a verdict).
    void setExpectedVersion(const QString& version);
    QString expectedVersion() const { return m_expected; }

    void setChecking(const QString& name);
    /// The result of a check of `name` (dropped when the host is gone).
    void setProbe(const QString& name, const HostProbe& probe);
    std::optional<HostProbe> probe(const QString& name) const;
    State state(const QString& name) const;
    /// The Status column's text of a host ("ok", "checking…", the problem, …).
    QString statusText(const QString& name) const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    struct Check {
        State state = State::Unchecked;
        std::optional<HostProbe> probe;
        core::HostRecord checked;  // the record as it was checked
    };
    State stateOf(const core::HostRecord& host, const Check* check) const;
    const Check* checkOf(const std::string& name) const;
    QVariant display(const core::HostRecord& host, const Check* check, int column) const;
    QString tooltip(const core::HostRecord& host, const Check* check, int column) const;
    void emitRowChanged(const QString& name);

    std::vector<core::HostRecord> m_hosts;
    std::map<std::string, Check> m_checks;  // by host name
    QString m_expected;
};

}  // namespace lathe::widgets

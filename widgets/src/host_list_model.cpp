#include "lathe/widgets/host_list_model.h"

#include <QBrush>
#include <QColor>
#include <QStringList>

#include <algorithm>
#include <set>

namespace lathe::widgets {

namespace {

// What a check depends on: a change of any of these makes an earlier result stale.
bool sameConnection(const core::HostRecord& a, const core::HostRecord& b) {
    return a.address == b.address && a.port == b.port && a.user == b.user && a.identity == b.identity &&
           a.lathectl == b.lathectl;
}

bool sameRecord(const core::HostRecord& a, const core::HostRecord& b) {
    return a.name == b.name && sameConnection(a, b) && a.slots == b.slots && a.addedAt == b.addedAt;
}

QString q(const std::string& s) { return QString::fromStdString(s); }

QString gib(int64_t kb) { return QStringLiteral("%1 GiB").arg(double(kb) / (1 << 20), 0, 'f', 1); }

}  // namespace

HostListModel::HostListModel(QObject* parent) : QAbstractTableModel(parent) {}

void HostListModel::setHosts(std::vector<core::HostRecord> hosts) {
    std::sort(hosts.begin(), hosts.end(),
              [](const core::HostRecord& a, const core::HostRecord& b) { return a.name < b.name; });
    hosts.erase(
        std::unique(hosts.begin(), hosts.end(),
                    [](const core::HostRecord& a, const core::HostRecord& b) { return a.name == b.name; }),
        hosts.end());
    std::set<std::string> names;
    for (const auto& h : hosts) names.insert(h.name);

    // Vanished hosts go, with their check results.
    for (int row = int(m_hosts.size()) - 1; row >= 0; --row) {
        if (names.count(m_hosts[size_t(row)].name)) continue;
        beginRemoveRows({}, row, row);
        m_checks.erase(m_hosts[size_t(row)].name);
        m_hosts.erase(m_hosts.begin() + row);
        endRemoveRows();
    }
    // Both lists are sorted by name and the old one is now a subset of the new one.
    for (int row = 0; row < int(hosts.size()); ++row) {
        core::HostRecord& want = hosts[size_t(row)];
        if (row < int(m_hosts.size()) && m_hosts[size_t(row)].name == want.name) {
            core::HostRecord& have = m_hosts[size_t(row)];
            if (sameRecord(have, want)) continue;
            if (!sameConnection(have, want)) {
                auto it = m_checks.find(want.name);
                // A check in flight stays: setProbe drops its result as stale.
                if (it != m_checks.end() && it->second.state != State::Checking) m_checks.erase(it);
            }
            have = std::move(want);
            Q_EMIT dataChanged(index(row, 0), index(row, ColumnCount - 1));
            continue;
        }
        beginInsertRows({}, row, row);
        m_hosts.insert(m_hosts.begin() + row, std::move(want));
        endInsertRows();
    }
}

const core::HostRecord* HostListModel::hostAt(int row) const {
    return row >= 0 && row < int(m_hosts.size()) ? &m_hosts[size_t(row)] : nullptr;
}

int HostListModel::rowOfHost(const QString& name) const {
    const std::string n = name.toStdString();
    for (size_t i = 0; i < m_hosts.size(); ++i)
        if (m_hosts[i].name == n) return int(i);
    return -1;
}

void HostListModel::setExpectedVersion(const QString& version) {
    if (version == m_expected) return;
    m_expected = version;
    // Verdicts were made against the version at check time; re-judge them.
    for (auto& [name, check] : m_checks)
        if (check.probe)
            check.probe->lathectlMatches =
                !check.probe->lathectlVersion.empty() && q(check.probe->lathectlVersion) == m_expected;
    if (!m_hosts.empty()) Q_EMIT dataChanged(index(0, 0), index(rowCount() - 1, ColumnCount - 1));
}

void HostListModel::emitRowChanged(const QString& name) {
    const int row = rowOfHost(name);
    if (row >= 0) Q_EMIT dataChanged(index(row, 0), index(row, ColumnCount - 1));
}

void HostListModel::setChecking(const QString& name) {
    const int row = rowOfHost(name);
    if (row < 0) return;
    Check& c = m_checks[name.toStdString()];
    c.state = State::Checking;
    c.checked = m_hosts[size_t(row)];
    emitRowChanged(name);
}

void HostListModel::setProbe(const QString& name, const HostProbe& probe) {
    const int row = rowOfHost(name);
    if (row < 0) return;
    Check& c = m_checks[name.toStdString()];
    // A result for the connection the host had when the check started; edited since: stale.
    if (c.state == State::Checking && !sameConnection(c.checked, m_hosts[size_t(row)])) {
        m_checks.erase(name.toStdString());
        emitRowChanged(name);
        return;
    }
    c.probe = probe;
    c.state = State::Ok;  // judged in stateOf
    c.checked = m_hosts[size_t(row)];
    emitRowChanged(name);
}

std::optional<HostProbe> HostListModel::probe(const QString& name) const {
    const Check* c = checkOf(name.toStdString());
    return c ? c->probe : std::nullopt;
}

const HostListModel::Check* HostListModel::checkOf(const std::string& name) const {
    auto it = m_checks.find(name);
    return it == m_checks.end() ? nullptr : &it->second;
}

HostListModel::State HostListModel::state(const QString& name) const {
    const int row = rowOfHost(name);
    if (row < 0) return State::Unchecked;
    return stateOf(m_hosts[size_t(row)], checkOf(name.toStdString()));
}

HostListModel::State HostListModel::stateOf(const core::HostRecord& host, const Check* check) const {
    if (!check) return State::Unchecked;
    if (check->state == State::Checking) return State::Checking;
    if (!check->probe) return State::Unchecked;
    const HostProbe& p = *check->probe;
    if (!p.reachable) return p.key == HostKeyState::Unknown ? State::UnknownKey : State::Failed;
    if (p.exitStatus != 0) return State::Failed;
    if (p.lathectlVersion.empty()) return State::Warning;
    if (!m_expected.isEmpty() && !p.lathectlMatches) return State::Warning;
    if (p.cores > 0 && host.slots > p.cores) return State::Warning;
    return State::Ok;
}

QString HostListModel::statusText(const QString& name) const {
    const int row = rowOfHost(name);
    if (row < 0) return {};
    const core::HostRecord& host = m_hosts[size_t(row)];
    const Check* check = checkOf(host.name);
    const State st = stateOf(host, check);
    switch (st) {
        case State::Unchecked:
            return tr("not checked");
        case State::Checking:
            return tr("checking…");
        case State::UnknownKey:
            return tr("host key not in known_hosts: Trust key… to add it");
        case State::Failed:
            return q(check->probe->problem);
        case State::Ok:
            return tr("ok (%1 s)").arg(check->probe->seconds, 0, 'f', 1);
        case State::Warning: {
            const HostProbe& p = *check->probe;
            QStringList why;
            if (p.lathectlVersion.empty())
                why << (host.lathectl.empty() ? tr("no lathectl on its PATH")
                                              : tr("no lathectl at %1").arg(q(host.lathectl)));
            else if (!m_expected.isEmpty() && !p.lathectlMatches)
                why << tr("lathectl is %1, this is %2").arg(q(p.lathectlVersion), m_expected);
            if (p.cores > 0 && host.slots > p.cores)
                why << tr("%1 slots but %2 cores").arg(host.slots).arg(p.cores);
            return tr("reachable; ") + why.join(QStringLiteral("; "));
        }
    }
    return {};
}

int HostListModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : int(m_hosts.size());
}

int HostListModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant HostListModel::display(const core::HostRecord& host, const Check* check, int column) const {
    const HostProbe* p = check && check->state != State::Checking && check->probe ? &*check->probe : nullptr;
    const bool probed = p && p->reachable;
    switch (column) {
        case ColName:
            return q(host.name);
        case ColAddress:
            return q(host.address);
        case ColPort:
            return host.port == 0 ? QStringLiteral("—") : QString::number(host.port);
        case ColUser:
            return host.user.empty() ? QStringLiteral("—") : q(host.user);
        case ColSlots:
            return host.slots;
        case ColLathectl:
            return host.lathectl.empty() ? tr("(on PATH)") : q(host.lathectl);
        case ColSystem:
            if (!probed) return {};
            return (q(p->os) + QLatin1Char(' ') + q(p->arch)).trimmed();
        case ColCores:
            return probed && p->cores > 0 ? QVariant(p->cores) : QVariant();
        case ColMemory:
            return probed && p->memoryKb > 0 ? QVariant(gib(p->memoryKb)) : QVariant();
        case ColGpus:
            if (!probed) return {};
            if (p->gpus.empty()) return tr("none");
            if (p->gpus.size() == 1) return q(p->gpus.front());
            return tr("%1 × %2").arg(p->gpus.size()).arg(q(p->gpus.front()));
        case ColVersion:
            if (!probed) return {};
            if (p->lathectlVersion.empty()) return tr("missing");
            if (m_expected.isEmpty()) return q(p->lathectlVersion);
            return q(p->lathectlVersion) + (p->lathectlMatches ? tr(" ✓") : tr(" (differs)"));
        case ColHostKey:
            return p ? q(p->fingerprint) : QString();
        case ColStatus:
            return statusText(q(host.name));
        default:
            return {};
    }
}

QString HostListModel::tooltip(const core::HostRecord& host, const Check* check, int column) const {
    const HostProbe* p = check && check->state != State::Checking && check->probe ? &*check->probe : nullptr;
    switch (column) {
        case ColName:
        case ColAddress: {
            QString t = tr("%1: %2").arg(q(host.name), q(host.address));
            if (host.port) t += tr("\nport %1").arg(host.port);
            if (!host.user.empty()) t += tr("\nuser %1").arg(q(host.user));
            t += tr("\nidentity: %1")
                     .arg(host.identity.empty() ? tr("ssh-agent, then ~/.ssh keys") : q(host.identity));
            if (p && !p->address.empty()) t += tr("\nreached at %1").arg(q(p->address));
            return t;
        }
        case ColGpus:
            if (p && !p->gpus.empty()) {
                QStringList lines;
                for (const auto& g : p->gpus) lines << q(g);
                return lines.join(QLatin1Char('\n'));
            }
            return p && p->reachable ? tr("no nvidia-smi on the host") : QString();
        case ColVersion:
            return m_expected.isEmpty() ? tr("this build's lathectl version is not known")
                                        : tr("this build: %1").arg(m_expected);
        case ColHostKey:
            if (!p || p->fingerprint.empty()) return {};
            if (p->key == HostKeyState::Unknown) return tr("offered, not in known_hosts yet");
            if (p->key == HostKeyState::Changed) return tr("differs from the key in known_hosts!");
            return tr("verified against known_hosts");
        case ColStatus: {
            QString t = statusText(q(host.name));
            if (p && !p->probeStderr.empty()) t += QLatin1Char('\n') + q(p->probeStderr);
            return t;
        }
        default:
            return {};
    }
}

QVariant HostListModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid() || index.row() >= int(m_hosts.size())) return {};
    const core::HostRecord& host = m_hosts[size_t(index.row())];
    const Check* check = checkOf(host.name);
    switch (role) {
        case Qt::DisplayRole:
            return display(host, check, index.column());
        case Qt::ToolTipRole:
            return tooltip(host, check, index.column());
        case NameRole:
            return q(host.name);
        case StateRole:
            return static_cast<int>(stateOf(host, check));
        case Qt::TextAlignmentRole:
            if (index.column() == ColPort || index.column() == ColSlots || index.column() == ColCores ||
                index.column() == ColMemory)
                return int(Qt::AlignRight | Qt::AlignVCenter);
            return {};
        case Qt::ForegroundRole: {
            if (index.column() != ColStatus && index.column() != ColVersion) return {};
            switch (stateOf(host, check)) {
                case State::Ok:
                    return QBrush(QColor(0x2e, 0x7d, 0x32));
                case State::Warning:
                case State::UnknownKey:
                    return QBrush(QColor(0xe6, 0x51, 0x00));
                case State::Failed:
                    return QBrush(QColor(0xc6, 0x28, 0x28));
                case State::Checking:
                    return QBrush(QColor(0x15, 0x65, 0xc0));
                default:
                    return {};
            }
        }
        default:
            return {};
    }
}

QVariant HostListModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColName:
            return tr("Name");
        case ColAddress:
            return tr("Address");
        case ColPort:
            return tr("Port");
        case ColUser:
            return tr("User");
        case ColSlots:
            return tr("Slots");
        case ColLathectl:
            return tr("lathectl path");
        case ColSystem:
            return tr("System");
        case ColCores:
            return tr("Cores");
        case ColMemory:
            return tr("Memory");
        case ColGpus:
            return tr("GPUs");
        case ColVersion:
            return tr("lathectl version");
        case ColHostKey:
            return tr("Host key");
        case ColStatus:
            return tr("Status");
        default:
            return {};
    }
}

}  // namespace lathe::widgets

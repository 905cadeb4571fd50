#include "lathe/widgets/serving_tables.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>

namespace lathe::widgets {

namespace {

// Today's times without the date: the history of a live deployment is mostly from today.
QString formatTime(double secs) {
    if (secs <= 0) return {};
    const QDateTime when = QDateTime::fromMSecsSinceEpoch(qint64(secs * 1000.0));
    return when.toString(when.date() == QDate::currentDate() ? QStringLiteral("hh:mm:ss")
                                                             : QStringLiteral("yyyy-MM-dd hh:mm:ss"));
}

bool sameDeployment(const core::Deployment& a, const core::Deployment& b) {
    return a.id == b.id && a.version == b.version && a.url == b.url && a.pid == b.pid && a.actor == b.actor &&
           a.action == b.action && a.reason == b.reason && a.startedAt == b.startedAt &&
           a.endedAt == b.endedAt && a.endReason == b.endReason && a.target == b.target;
}

bool sameAlert(const core::AlertRecord& a, const core::AlertRecord& b) {
    return a.id == b.id && a.rule == b.rule && a.message == b.message && a.value == b.value &&
           a.firedAt == b.firedAt && a.resolvedAt == b.resolvedAt;
}

template <typename T, typename Same>
bool sameList(const std::vector<T>& a, const std::vector<T>& b, Same same) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (!same(a[i], b[i])) return false;
    return true;
}

const QColor kLive(0x2e, 0x7d, 0x32);
const QColor kFiring(0xc6, 0x28, 0x28);

}  // namespace

QString deploymentLabel(const core::Deployment& d) {
    QString label = QStringLiteral("v%1 %2").arg(d.version).arg(QString::fromStdString(d.action));
    // "user" is the default and says nothing; an automatic action is worth flagging.
    if (d.actor.rfind("auto", 0) == 0)
        label += QStringLiteral(" (auto)");
    else if (!d.actor.empty() && d.actor != "user")
        label += QStringLiteral(" (%1)").arg(QString::fromStdString(d.actor));
    return label;
}

// ---- deployments ---------------------------------------------------------------------------

DeploymentTableModel::DeploymentTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void DeploymentTableModel::setDeployments(std::vector<core::Deployment> deployments) {
    if (sameList(m_rows, deployments, sameDeployment)) return;
    beginResetModel();
    m_rows = std::move(deployments);
    endResetModel();
}

int DeploymentTableModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : int(m_rows.size());
}

int DeploymentTableModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant DeploymentTableModel::data(const QModelIndex& index, int role) const {
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
    const core::Deployment& d = m_rows[size_t(index.row())];
    const int col = index.column();
    if (role == DeploymentIdRole) return QVariant::fromValue<qint64>(d.id);
    if (role == Qt::ForegroundRole && col == ColState && d.live()) return QBrush(kLive);
    if (role == Qt::ToolTipRole) {
        QString tip =
            deploymentLabel(d) +
            QStringLiteral(" · %1 · %2").arg(QString::fromStdString(d.target), QString::fromStdString(d.url));
        if (d.pid > 0) tip += QStringLiteral("\nserver pid %1").arg(d.pid);
        if (!d.logPath.empty()) tip += QStringLiteral("\nlog: ") + QString::fromStdString(d.logPath);
        if (!d.reason.empty()) tip += QStringLiteral("\nreason: ") + QString::fromStdString(d.reason);
        if (!d.live()) tip += QStringLiteral("\nended: ") + QString::fromStdString(d.endReason);
        return tip;
    }
    if (role != Qt::DisplayRole && role != SortRole) return {};
    const bool sort = role == SortRole;
    switch (col) {
        case ColVersion:
            return sort ? QVariant::fromValue<qint64>(d.version)
                        : QVariant(QStringLiteral("v%1").arg(d.version));
        case ColAction:
            return QString::fromStdString(d.action);
        case ColActor:
            return QString::fromStdString(d.actor);
        case ColReason:
            return QString::fromStdString(d.reason);
        case ColFrom:
            return sort ? QVariant(d.startedAt) : QVariant(formatTime(d.startedAt));
        case ColTo:
            return sort ? QVariant(d.endedAt) : QVariant(formatTime(d.endedAt));
        case ColState:
            if (d.live()) return tr("live");
            return d.endReason.empty() ? tr("ended")
                                       : tr("ended: %1").arg(QString::fromStdString(d.endReason));
        default:
            return {};
    }
}

QVariant DeploymentTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColVersion:
            return tr("Version");
        case ColAction:
            return tr("Action");
        case ColActor:
            return tr("Actor");
        case ColReason:
            return tr("Reason");
        case ColFrom:
            return tr("From");
        case ColTo:
            return tr("To");
        case ColState:
            return tr("State");
        default:
            return {};
    }
}

// ---- alerts --------------------------------------------------------------------------------

AlertTableModel::AlertTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void AlertTableModel::setAlerts(std::vector<core::AlertRecord> alerts) {
    if (sameList(m_rows, alerts, sameAlert)) return;
    beginResetModel();
    m_rows = std::move(alerts);
    endResetModel();
}

int AlertTableModel::firingCount() const {
    int n = 0;
    for (const auto& a : m_rows)
        if (a.resolvedAt == 0) ++n;
    return n;
}

int AlertTableModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : int(m_rows.size());
}

int AlertTableModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant AlertTableModel::data(const QModelIndex& index, int role) const {
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
    const core::AlertRecord& a = m_rows[size_t(index.row())];
    const int col = index.column();
    const bool firing = a.resolvedAt == 0;
    if (role == AlertIdRole) return QVariant::fromValue<qint64>(a.id);
    if (role == Qt::ForegroundRole && firing && (col == ColRule || col == ColResolved))
        return QBrush(kFiring);
    if (role == Qt::ToolTipRole) return QString::fromStdString(a.message);
    if (role == Qt::TextAlignmentRole && col == ColValue) return int(Qt::AlignRight | Qt::AlignVCenter);
    if (role != Qt::DisplayRole && role != SortRole) return {};
    const bool sort = role == SortRole;
    switch (col) {
        case ColRule:
            return QString::fromStdString(a.rule);
        case ColMessage:
            return QString::fromStdString(a.message);
        case ColValue:
            return sort ? QVariant(a.value) : QVariant(QString::number(a.value, 'g', 4));
        case ColFired:
            return sort ? QVariant(a.firedAt) : QVariant(formatTime(a.firedAt));
        case ColResolved:
            if (sort) return firing ? QVariant(1e300) : QVariant(a.resolvedAt);
            return firing ? tr("firing") : formatTime(a.resolvedAt);
        default:
            return {};
    }
}

QVariant AlertTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColRule:
            return tr("Rule");
        case ColMessage:
            return tr("Message");
        case ColValue:
            return tr("Value");
        case ColFired:
            return tr("Fired");
        case ColResolved:
            return tr("Resolved");
        default:
            return {};
    }
}

}  // namespace lathe::widgets

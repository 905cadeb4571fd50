#include "lathe/widgets/run_list_model.h"

#include <QBrush>
#include <QColor>

#include <cmath>
#include <ctime>
#include <unordered_map>
#include <unordered_set>

namespace lathe::widgets {

RunListModel::RunListModel(QObject* parent) : QAbstractTableModel(parent) {}

bool RunListModel::sameRow(const Row& a, const Row& b) {
    const auto& x = a.run;
    const auto& y = b.run;
    return x.id == y.id && x.experiment == y.experiment && x.name == y.name && x.status == y.status &&
           x.model == y.model && x.data == y.data && x.error == y.error && x.createdAt == y.createdAt &&
           x.startedAt == y.startedAt && x.endedAt == y.endedAt && x.host == y.host &&
           a.hasValAccuracy == b.hasValAccuracy && a.valAccuracy == b.valAccuracy;
}

void RunListModel::setRuns(std::vector<core::RunRecord> runs, std::map<int64_t, double> valAccuracy) {
    std::vector<Row> next;
    next.reserve(runs.size());
    std::unordered_set<int64_t> nextIds;
    for (auto& r : runs) {
        if (!nextIds.insert(r.id).second) continue;  // a duplicate id would break the diff
        Row row;
        row.run = std::move(r);
        auto it = valAccuracy.find(row.run.id);
        if (it != valAccuracy.end()) {
            row.hasValAccuracy = true;
            row.valAccuracy = it->second;
        }
        next.push_back(std::move(row));
    }

    // 1. Remove vanished runs, bottom-up in contiguous blocks so row numbers stay valid.
    for (int i = int(m_rows.size()) - 1; i >= 0;) {
        if (nextIds.count(m_rows[size_t(i)].run.id)) {
            --i;
            continue;
        }
        int last = i;
        while (i >= 0 && !nextIds.count(m_rows[size_t(i)].run.id)) --i;
        const int first = i + 1;
        beginRemoveRows({}, first, last);
        m_rows.erase(m_rows.begin() + first, m_rows.begin() + last + 1);
        endRemoveRows();
    }

    // 2. Walk the new order: keep, move or insert each row at its target position.
    for (int target = 0; target < int(next.size()); ++target) {
        Row& want = next[size_t(target)];
        int current = -1;
        for (int j = target; j < int(m_rows.size()); ++j) {
            if (m_rows[size_t(j)].run.id == want.run.id) {
                current = j;
                break;
            }
        }
        if (current < 0) {
            beginInsertRows({}, target, target);
            m_rows.insert(m_rows.begin() + target, std::move(want));
            endInsertRows();
            continue;
        }
        if (current != target) {
            // current > target here: rows before `target` are already final.
            beginMoveRows({}, current, current, {}, target);
            Row moved = std::move(m_rows[size_t(current)]);
            m_rows.erase(m_rows.begin() + current);
            m_rows.insert(m_rows.begin() + target, std::move(moved));
            endMoveRows();
        }
        if (!sameRow(m_rows[size_t(target)], want)) {
            m_rows[size_t(target)] = std::move(want);
            Q_EMIT dataChanged(index(target, 0), index(target, ColumnCount - 1));
        }
    }
}

int64_t RunListModel::runIdAt(int row) const {
    return row >= 0 && row < int(m_rows.size()) ? m_rows[size_t(row)].run.id : 0;
}

int RunListModel::rowOfRun(int64_t runId) const {
    for (int i = 0; i < int(m_rows.size()); ++i)
        if (m_rows[size_t(i)].run.id == runId) return i;
    return -1;
}

const core::RunRecord* RunListModel::runAt(int row) const {
    return row >= 0 && row < int(m_rows.size()) ? &m_rows[size_t(row)].run : nullptr;
}

const core::RunRecord* RunListModel::runById(int64_t runId) const { return runAt(rowOfRun(runId)); }

int RunListModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : int(m_rows.size());
}

int RunListModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

// Local time, "yyyy-MM-dd hh:mm:ss". By the C library rather than QDateTime: 10,000 rows' worth
// (the runs filter's texts) took ~35 ms more through QDateTime's local-time conversion.
static QString formatTime(double secs) {
    if (secs <= 0) return {};
    const std::time_t t = static_cast<std::time_t>(std::floor(secs));
    std::tm local{};
    if (!localtime_r(&t, &local)) return {};
    char text[32];
    const size_t n = std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &local);
    return QString::fromLatin1(text, qsizetype(n));
}

static QColor statusColor(core::RunStatus status) {
    using S = core::RunStatus;
    if (status == S::Failed) return QColor(0xc6, 0x28, 0x28);
    if (status == S::Running) return QColor(0x15, 0x65, 0xc0);
    if (status == S::Completed) return QColor(0x2e, 0x7d, 0x32);
    if (status == S::Stopped) return QColor(0xef, 0x6c, 0x00);
    if (status == S::Interrupted) return QColor(0x6a, 0x1b, 0x9a);
    return {};
}

QVariant RunListModel::data(const QModelIndex& index, int role) const {
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
    const Row& row = m_rows[size_t(index.row())];
    const core::RunRecord& r = row.run;
    const int col = index.column();

    if (role == RunIdRole) return QVariant::fromValue<qint64>(r.id);
    if (role == Qt::DisplayRole || role == SortRole) {
        const bool sort = role == SortRole;
        switch (col) {
            case ColId:
                return sort ? QVariant::fromValue<qint64>(r.id) : QVariant(QString::number(r.id));
            case ColName:
                return QString::fromStdString(r.name);
            case ColExperiment:
                return QString::fromStdString(r.experiment);
            case ColStatus:
                return QString::fromLatin1(core::toString(r.status));
            case ColModel:
                return QString::fromStdString(r.model);
            case ColData:
                return QString::fromStdString(r.data);
            case ColCreated:
                return sort ? QVariant(r.createdAt) : QVariant(formatTime(r.createdAt));
            case ColValAccuracy:
                if (!row.hasValAccuracy) return sort ? QVariant(-1.0) : QVariant();
                // Stored as a fraction; engineers read percentages.
                return sort ? QVariant(row.valAccuracy)
                            : QVariant(QString::number(row.valAccuracy * 100.0, 'f', 2) + QLatin1Char('%'));
            default:
                return {};
        }
    }
    if (role == Qt::ForegroundRole && col == ColStatus) {
        const QColor c = statusColor(r.status);
        return c.isValid() ? QVariant(QBrush(c)) : QVariant();
    }
    if (role == Qt::TextAlignmentRole && (col == ColId || col == ColValAccuracy))
        return QVariant(int(Qt::AlignRight | Qt::AlignVCenter));
    if (role == Qt::ToolTipRole) {
        QString tip = QStringLiteral("run %1 · %2\nhost: %3")
                          .arg(r.id)
                          .arg(QString::fromLatin1(core::toString(r.status)), QString::fromStdString(r.host));
        if (r.status == core::RunStatus::Interrupted)
            tip += QStringLiteral("\n") + QString::fromStdString(core::interruptedHint(r.id));
        if (r.startedAt > 0) tip += QStringLiteral("\nstarted: ") + formatTime(r.startedAt);
        if (r.endedAt > 0) tip += QStringLiteral("\nended: ") + formatTime(r.endedAt);
        if (!r.error.empty()) tip += QStringLiteral("\nerror: ") + QString::fromStdString(r.error);
        return tip;
    }
    return {};
}

QVariant RunListModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColId:
            return tr("ID");
        case ColName:
            return tr("Name");
        case ColExperiment:
            return tr("Experiment");
        case ColStatus:
            return tr("Status");
        case ColModel:
            return tr("Model");
        case ColData:
            return tr("Data");
        case ColCreated:
            return tr("Created");
        case ColValAccuracy:
            return tr("Val acc.");
        default:
            return {};
    }
}

const QString& RunListModel::searchText(int row) const {
    const Row& r = m_rows.at(size_t(row));
    if (!r.searchMade) {
        QString text;
        for (int c = 0; c < ColumnCount; ++c) {
            if (c) text += QChar(0x1f);  // the unit separator: no typed text matches across columns
            text += data(index(row, c), Qt::DisplayRole).toString();
        }
        r.search = text.toCaseFolded();
        r.searchMade = true;
    }
    return r.search;
}

RunFilterProxy::RunFilterProxy(QObject* parent) : QSortFilterProxyModel(parent) {}

void RunFilterProxy::setSourceModel(QAbstractItemModel* model) {
    m_runs = qobject_cast<const RunListModel*>(model);
    QSortFilterProxyModel::setSourceModel(model);
}

void RunFilterProxy::setFilterText(const QString& text) {
    const QString needle = text.toCaseFolded();
    if (needle == m_needle) return;
    m_needle = needle;
    invalidateFilter();
}

bool RunFilterProxy::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const {
    if (m_needle.isEmpty() || !m_runs || sourceParent.isValid()) return true;
    return m_runs->searchText(sourceRow).contains(m_needle);
}

}  // namespace lathe::widgets

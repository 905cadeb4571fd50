#include "lathe/widgets/top_ops_model.h"

#include <QBrush>
#include <QColor>

#include "lathe/widgets/profile_timeline.h"

namespace lathe::widgets {

TopOpsModel::TopOpsModel(QObject* parent) : QAbstractTableModel(parent) {}

void TopOpsModel::setOps(std::vector<core::OpSummary> ops) {
    beginResetModel();
    m_ops = std::move(ops);
    endResetModel();
}

bool TopOpsModel::hasDeviceTimes() const {
    for (const auto& op : m_ops)
        if (op.cudaTotalNs >= 0) return true;
    return false;
}

int TopOpsModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : int(m_ops.size());
}

int TopOpsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant TopOpsModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid() || index.row() >= int(m_ops.size()) || index.column() >= ColumnCount) return {};
    const auto& op = m_ops[size_t(index.row())];
    if (role == SortRole) {
        switch (index.column()) {
            case ColName:
                return QString::fromStdString(op.name);
            case ColCalls:
                return qlonglong(op.calls);
            case ColSelfMs:
                return qlonglong(op.selfNs);
            case ColTotalMs:
                return qlonglong(op.totalNs);
            case ColShare:
                return op.share;
            case ColCudaSelfMs:
                return qlonglong(op.cudaSelfNs);
            case ColCudaTotalMs:
                return qlonglong(op.cudaTotalNs);
        }
    }
    if (role == Qt::DisplayRole) {
        switch (index.column()) {
            case ColName:
                return QString::fromStdString(op.name);
            case ColCalls:
                return qlonglong(op.calls);
            case ColSelfMs:
                return QString::number(double(op.selfNs) / 1e6, 'f', 3);
            case ColTotalMs:
                return QString::number(double(op.totalNs) / 1e6, 'f', 3);
            case ColShare:
                return QString::number(op.share * 100.0, 'f', 1);
            case ColCudaSelfMs:
                return op.cudaSelfNs < 0 ? QStringLiteral("–")
                                         : QString::number(double(op.cudaSelfNs) / 1e6, 'f', 3);
            case ColCudaTotalMs:
                return op.cudaTotalNs < 0 ? QStringLiteral("–")
                                          : QString::number(double(op.cudaTotalNs) / 1e6, 'f', 3);
        }
    }
    if (role == Qt::TextAlignmentRole && index.column() != ColName)
        return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
    // The swatch matches the op's colour in the timeline.
    if (role == Qt::DecorationRole && index.column() == ColName) return ProfileTimeline::opColor(op.name);
    if (role == Qt::ToolTipRole && index.column() == ColName) {
        return tr("%1\n%2 calls · self %3 ms · total %4 ms")
            .arg(QString::fromStdString(op.name))
            .arg(op.calls)
            .arg(double(op.selfNs) / 1e6, 0, 'f', 3)
            .arg(double(op.totalNs) / 1e6, 0, 'f', 3);
    }
    return {};
}

QVariant TopOpsModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColName:
            return tr("op");
        case ColCalls:
            return tr("calls");
        case ColSelfMs:
            return tr("self ms");
        case ColTotalMs:
            return tr("total ms");
        case ColShare:
            return tr("share %");
        case ColCudaSelfMs:
            return tr("CUDA self ms");
        case ColCudaTotalMs:
            return tr("CUDA total ms");
    }
    return {};
}

}  // namespace lathe::widgets

#pragma once
// Table model over core::topOps(): one row per op name with calls, self and total time and the
// share of all self time. Sort through a QSortFilterProxyModel on SortRole (raw numbers).
#include <QAbstractTableModel>

#include <vector>

#include "lathe/core/profile_analysis.h"

namespace lathe::widgets {

class TopOpsModel : public QAbstractTableModel {
    Q_OBJECT
public:
    // The CUDA columns hold device times of runs on a GPU ("–" where an op has none).
    enum Column {
        ColName,
        ColCalls,
        ColSelfMs,
        ColTotalMs,
        ColShare,
        ColCudaSelfMs,
        ColCudaTotalMs,
        ColumnCount
    };
    enum Role { SortRole = Qt::UserRole + 1 };

    explicit TopOpsModel(QObject* parent = nullptr);

    void setOps(std::vector<core::OpSummary> ops);
    /// Whether any op has a device time (the view shows the CUDA columns only then).
    bool hasDeviceTimes() const;
    const std::vector<core::OpSummary>& ops() const { return m_ops; }

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    std::vector<core::OpSummary> m_ops;
};

}  // namespace lathe::widgets

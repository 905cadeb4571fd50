#pragma once
// Table model over the runs of a workspace. Refreshes are diffed by run id (remove, insert,
// move, dataChanged) instead of a model reset, so selections and persistent indexes held by
// views survive a refresh while a run is training.
#include <QAbstractTableModel>
#include <QSortFilterProxyModel>
#include <QString>

#include <cstdint>
#include <map>
#include <vector>

#include "lathe/core/store.h"

namespace lathe::widgets {

class RunListModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column {
        ColId,
        ColName,
        ColExperiment,
        ColStatus,
        ColModel,
        ColData,
        ColCreated,
        ColValAccuracy,
        ColumnCount
    };
    enum Role {
        RunIdRole = Qt::UserRole + 1,  // qint64 run id, same in every column
        SortRole,                      // raw value for QSortFilterProxyModel
    };

    explicit RunListModel(QObject* parent = nullptr);

    /// Replaces the contents with `runs` (in display order, usually newest first).
    /// `valAccuracy` holds the final val/accuracy of the runs that have one.
    void setRuns(std::vector<core::RunRecord> runs, std::map<int64_t, double> valAccuracy = {});

    int64_t runIdAt(int row) const;
    int rowOfRun(int64_t runId) const;  // -1 when absent
    const core::RunRecord* runAt(int row) const;
    const core::RunRecord* runById(int64_t runId) const;
    /// Row `row`'s text in every column, case-folded: what the runs filter searches. Made the
    /// first time it is asked for and kept until the row changes.
    const QString& searchText(int row) const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    struct Row {
        core::RunRecord run;
        bool hasValAccuracy = false;
        double valAccuracy = 0.0;
        mutable QString search;  // searchText(), once asked for
        mutable bool searchMade = false;
    };
    static bool sameRow(const Row& a, const Row& b);

    std::vector<Row> m_rows;
};

/// The runs list's sort and filter proxy. The filter matches a fixed string, ignoring case,
/// against every column at once through RunListModel::searchText, one substring search per row,
/// rather than QSortFilterProxyModel's data() and a match per column and row (10,000 runs: see
/// tests/bench/README.md).
class RunFilterProxy : public QSortFilterProxyModel {
    Q_OBJECT
public:
    explicit RunFilterProxy(QObject* parent = nullptr);
    void setSourceModel(QAbstractItemModel* model) override;
    /// Shows the rows whose text contains `text` (case-insensitive); empty shows all.
    void setFilterText(const QString& text);
    QString filterText() const { return m_needle; }

protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

private:
    const RunListModel* m_runs = nullptr;
    QString m_needle;  // case-folded
};

}  // namespace lathe::widgets

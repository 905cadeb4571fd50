#pragma once
// The two small tables under the deployment dashboard: a model's deployment history (what
// served when, who or what put it there and why it ended) and its alerts. Contents are replaced
// as a whole (a reset) only when the registry's answer differs from what is shown.
#include <QAbstractTableModel>

#include <vector>

#include "lathe/core/registry.h"

namespace lathe::widgets {

/// "v3 deploy", "v2 rollback (auto)": how a deployment is named on the chart and in the table.
QString deploymentLabel(const core::Deployment& d);

class DeploymentTableModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { ColVersion, ColAction, ColActor, ColFrom, ColTo, ColState, ColReason, ColumnCount };
    enum Role { DeploymentIdRole = Qt::UserRole + 1, SortRole };

    explicit DeploymentTableModel(QObject* parent = nullptr);
    /// Newest first, as Registry::deployments.
    void setDeployments(std::vector<core::Deployment> deployments);
    const std::vector<core::Deployment>& deployments() const { return m_rows; }

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    std::vector<core::Deployment> m_rows;
};

class AlertTableModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { ColRule, ColFired, ColResolved, ColValue, ColMessage, ColumnCount };
    enum Role { AlertIdRole = Qt::UserRole + 1, SortRole };

    explicit AlertTableModel(QObject* parent = nullptr);
    /// Newest first, as Registry::alerts.
    void setAlerts(std::vector<core::AlertRecord> alerts);
    const std::vector<core::AlertRecord>& alerts() const { return m_rows; }
    int firingCount() const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    std::vector<core::AlertRecord> m_rows;
};

}  // namespace lathe::widgets

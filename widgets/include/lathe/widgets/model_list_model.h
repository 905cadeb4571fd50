#pragma once
// Tree model over the model registry: one top-level row per registered model, its versions as
// children (newest first) with lineage (run, data set, parent version), checksum, size, metrics,
// aliases and whether the version is live. Refreshes are diffed by model name and version number
// (insert, remove, dataChanged), never a reset, so the selection and expanded state of a view
// survive the periodic re-read while a deployment runs.
#include <QAbstractItemModel>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lathe/core/registry.h"

namespace lathe::widgets {

/// What the registry holds about one model, read in one go (off the GUI thread).
struct ModelEntry {
    core::ModelSummary summary;
    std::vector<core::ModelVersion> versions;   // oldest first, as Registry::versions
    std::vector<core::Deployment> deployments;  // newest first, as Registry::deployments

    /// The live deployment, if any.
    const core::Deployment* live() const;
    /// The version a rollback would go back to: the one that served before the live
    /// deployment (the newest earlier deployment of another version); 0 when there is none.
    int64_t rollbackVersion() const;
    const core::ModelVersion* version(int64_t v) const;
};

/// Reads every model of the registry with its versions and deployments. Throws what Registry throws.
std::vector<ModelEntry> readModelEntries(const core::Registry& registry);

class ModelListModel : public QAbstractItemModel {
    Q_OBJECT
public:
    enum Column {
        ColName,    // model name / "v3"
        ColStatus,  // "live · http://…" / "v3 live"
        ColAliases,
        ColCreated,
        ColSource,  // "run 12" / "file …"; on model rows "%n versions"
        ColData,
        ColParent,
        ColValAccuracy,
        ColSha,  // first 12 hex digits
        ColSize,
        ColumnCount
    };
    enum Role {
        ModelNameRole = Qt::UserRole + 1,  // QString, same on a model row and its versions
        VersionRole,                       // qint64; 0 on a model row
        LiveRole,                          // bool: this version (or, on a model row, any) is live
        SortRole,
    };

    explicit ModelListModel(QObject* parent = nullptr);
    ~ModelListModel() override;

    /// Replaces the contents (sorted by model name; versions shown newest first).
    void setModels(std::vector<ModelEntry> models);

    const ModelEntry* entry(const QString& model) const;
    /// The model row, or the row of one version when version > 0; invalid when absent.
    QModelIndex indexOf(const QString& model, int64_t version = 0, int column = 0) const;
    int modelCount() const { return int(m_nodes.size()); }

    QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
    QModelIndex parent(const QModelIndex& child) const override;
    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

    /// "12.3 MiB", "512 B".
    static QString formatSize(int64_t bytes);

private:
    // One per model, heap-allocated: version rows point at their model's node, which must not
    // move when other models are inserted or removed.
    struct Node {
        ModelEntry entry;
        std::vector<const core::ModelVersion*> shown;  // into entry.versions, newest first
        int64_t liveVersion = 0;
        std::string liveUrl;
    };
    static void prepare(Node& node);
    void updateVersions(const QModelIndex& parentIndex, Node& node, ModelEntry next);
    int rowOf(const Node* node) const;
    QVariant modelData(const Node& node, int column, int role) const;
    QVariant versionData(const Node& node, const core::ModelVersion& v, int column, int role) const;

    std::vector<std::unique_ptr<Node>> m_nodes;
};

}  // namespace lathe::widgets

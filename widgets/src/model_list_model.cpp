#include "lathe/widgets/model_list_model.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QFont>
#include <QStringList>

#include <algorithm>
#include <cmath>
#include <set>

namespace lathe::widgets {

namespace {

QString formatTime(double secs) {
    if (secs <= 0) return {};
    return QDateTime::fromMSecsSinceEpoch(qint64(secs * 1000.0))
        .toString(QStringLiteral("yyyy-MM-dd hh:mm:ss"));
}

bool sameVersion(const core::ModelVersion& a, const core::ModelVersion& b) {
    return a.name == b.name && a.version == b.version && a.path == b.path && a.sha256 == b.sha256 &&
           a.sizeBytes == b.sizeBytes && a.metrics == b.metrics && a.runId == b.runId && a.data == b.data &&
           a.parentVersion == b.parentVersion && a.source == b.source && a.createdAt == b.createdAt &&
           a.aliases == b.aliases;
}

bool sameSummary(const core::ModelSummary& a, const core::ModelSummary& b) {
    return a.name == b.name && a.versions == b.versions && a.latestVersion == b.latestVersion &&
           a.aliases == b.aliases && a.createdAt == b.createdAt;
}

QString shapeText(const std::vector<int64_t>& shape) {
    QStringList parts;
    for (int64_t d : shape) parts << (d < 0 ? QStringLiteral("N") : QString::number(d));
    return QLatin1Char('[') + parts.join(QStringLiteral(", ")) + QLatin1Char(']');
}

const QColor kLiveColor(0x2e, 0x7d, 0x32);

// Plain English plurals: the project ships no translations, so tr()'s %n would print "(s)".
QString versionsText(int64_t n) {
    return n == 1 ? QStringLiteral("1 version") : QStringLiteral("%1 versions").arg(n);
}

}  // namespace

// ---- ModelEntry ----------------------------------------------------------------------------

const core::Deployment* ModelEntry::live() const {
    for (const auto& d : deployments)
        if (d.live()) return &d;
    return nullptr;
}

int64_t ModelEntry::rollbackVersion() const {
    // As core::rollback: the live deployment is the newest one, and the target is the newest
    // earlier deployment of another version.
    if (deployments.empty() || !deployments.front().live()) return 0;
    const int64_t current = deployments.front().version;
    for (size_t i = 1; i < deployments.size(); ++i)
        if (deployments[i].version != current) return deployments[i].version;
    return 0;
}

const core::ModelVersion* ModelEntry::version(int64_t v) const {
    for (const auto& mv : versions)
        if (mv.version == v) return &mv;
    return nullptr;
}

std::vector<ModelEntry> readModelEntries(const core::Registry& registry) {
    std::vector<ModelEntry> out;
    for (auto& summary : registry.listModels()) {
        ModelEntry e;
        e.versions = registry.versions(summary.name);
        e.deployments = registry.deployments(summary.name);
        e.summary = std::move(summary);
        out.push_back(std::move(e));
    }
    return out;
}

// ---- ModelListModel ------------------------------------------------------------------------

ModelListModel::ModelListModel(QObject* parent) : QAbstractItemModel(parent) {}

ModelListModel::~ModelListModel() = default;

QString ModelListModel::formatSize(int64_t bytes) {
    const double b = double(bytes);
    if (b >= 1024.0 * 1024.0 * 1024.0)
        return QStringLiteral("%1 GiB").arg(b / (1024.0 * 1024.0 * 1024.0), 0, 'f', 2);
    if (b >= 1024.0 * 1024.0) return QStringLiteral("%1 MiB").arg(b / (1024.0 * 1024.0), 0, 'f', 1);
    if (b >= 1024.0) return QStringLiteral("%1 KiB").arg(b / 1024.0, 0, 'f', 1);
    return QStringLiteral("%1 B").arg(bytes);
}

void ModelListModel::prepare(Node& node) {
    // The rows show versions newest first: the one just registered is the one to deploy.
    std::sort(node.entry.versions.begin(), node.entry.versions.end(),
              [](const core::ModelVersion& a, const core::ModelVersion& b) { return a.version > b.version; });
    const core::Deployment* live = node.entry.live();
    node.liveVersion = live ? live->version : 0;
    node.liveUrl = live ? live->url : std::string();
    // Where it runs, when that is not this machine: "http://10.0.0.7:8500 on gpu-a".
    if (live && live->target.rfind("ssh:", 0) == 0) node.liveUrl += " on " + live->target.substr(4);
}

void ModelListModel::setModels(std::vector<ModelEntry> models) {
    std::sort(models.begin(), models.end(),
              [](const ModelEntry& a, const ModelEntry& b) { return a.summary.name < b.summary.name; });
    models.erase(std::unique(models.begin(), models.end(),
                             [](const ModelEntry& a, const ModelEntry& b) {
                                 return a.summary.name == b.summary.name;
                             }),
                 models.end());
    std::set<std::string> names;
    for (const auto& m : models) names.insert(m.summary.name);

    // 1. Remove vanished models, bottom-up in contiguous blocks.
    for (int i = int(m_nodes.size()) - 1; i >= 0;) {
        if (names.count(m_nodes[size_t(i)]->entry.summary.name)) {
            --i;
            continue;
        }
        const int last = i;
        while (i >= 0 && !names.count(m_nodes[size_t(i)]->entry.summary.name)) --i;
        beginRemoveRows({}, i + 1, last);
        m_nodes.erase(m_nodes.begin() + i + 1, m_nodes.begin() + last + 1);
        endRemoveRows();
    }

    // 2. Both lists are sorted by name and the old one is now a subsequence of the new one:
    // each target row either is the same model (update) or a new one (insert).
    for (int target = 0; target < int(models.size()); ++target) {
        ModelEntry& want = models[size_t(target)];
        if (target < int(m_nodes.size()) &&
            m_nodes[size_t(target)]->entry.summary.name == want.summary.name) {
            updateVersions(index(target, 0), *m_nodes[size_t(target)], std::move(want));
            continue;
        }
        auto node = std::make_unique<Node>();
        node->entry = std::move(want);
        prepare(*node);
        beginInsertRows({}, target, target);
        m_nodes.insert(m_nodes.begin() + target, std::move(node));
        endInsertRows();
    }
}

void ModelListModel::updateVersions(const QModelIndex& parentIndex, Node& node, ModelEntry next) {
    Node fresh;
    fresh.entry = std::move(next);
    prepare(fresh);
    auto& rows = node.entry.versions;
    const auto& want = fresh.entry.versions;
    std::set<int64_t> wanted;
    for (const auto& v : want) wanted.insert(v.version);

    for (int i = int(rows.size()) - 1; i >= 0;) {
        if (wanted.count(rows[size_t(i)].version)) {
            --i;
            continue;
        }
        const int last = i;
        while (i >= 0 && !wanted.count(rows[size_t(i)].version)) --i;
        beginRemoveRows(parentIndex, i + 1, last);
        rows.erase(rows.begin() + i + 1, rows.begin() + last + 1);
        endRemoveRows();
    }
    for (int target = 0; target < int(want.size()); ++target) {
        const core::ModelVersion& w = want[size_t(target)];
        if (target < int(rows.size()) && rows[size_t(target)].version == w.version) {
            if (!sameVersion(rows[size_t(target)], w)) {
                rows[size_t(target)] = w;
                Q_EMIT dataChanged(index(target, 0, parentIndex),
                                   index(target, ColumnCount - 1, parentIndex));
            }
            continue;
        }
        beginInsertRows(parentIndex, target, target);
        rows.insert(rows.begin() + target, w);
        endInsertRows();
    }

    const bool liveChanged = node.liveVersion != fresh.liveVersion || node.liveUrl != fresh.liveUrl;
    const bool summaryChanged = !sameSummary(node.entry.summary, fresh.entry.summary);
    node.entry.summary = std::move(fresh.entry.summary);
    node.entry.deployments = std::move(fresh.entry.deployments);
    node.liveVersion = fresh.liveVersion;
    node.liveUrl = std::move(fresh.liveUrl);
    if (liveChanged || summaryChanged)
        Q_EMIT dataChanged(parentIndex.siblingAtColumn(0), parentIndex.siblingAtColumn(ColumnCount - 1));
    if (liveChanged && !rows.empty())
        Q_EMIT dataChanged(index(0, ColStatus, parentIndex),
                           index(int(rows.size()) - 1, ColStatus, parentIndex));
}

const ModelEntry* ModelListModel::entry(const QString& model) const {
    const std::string name = model.toStdString();
    for (const auto& n : m_nodes)
        if (n->entry.summary.name == name) return &n->entry;
    return nullptr;
}

QModelIndex ModelListModel::indexOf(const QString& model, int64_t version, int column) const {
    const std::string name = model.toStdString();
    for (int row = 0; row < int(m_nodes.size()); ++row) {
        const Node& n = *m_nodes[size_t(row)];
        if (n.entry.summary.name != name) continue;
        const QModelIndex parentIndex = index(row, 0);
        if (version <= 0) return parentIndex.siblingAtColumn(column);
        for (int v = 0; v < int(n.entry.versions.size()); ++v)
            if (n.entry.versions[size_t(v)].version == version) return index(v, column, parentIndex);
        return {};
    }
    return {};
}

int ModelListModel::rowOf(const Node* node) const {
    for (int i = 0; i < int(m_nodes.size()); ++i)
        if (m_nodes[size_t(i)].get() == node) return i;
    return -1;
}

QModelIndex ModelListModel::index(int row, int column, const QModelIndex& parent) const {
    if (row < 0 || column < 0 || column >= ColumnCount) return {};
    if (!parent.isValid()) {
        if (row >= int(m_nodes.size())) return {};
        return createIndex(row, column, nullptr);
    }
    // Only model rows have children.
    if (parent.internalPointer() != nullptr || parent.row() >= int(m_nodes.size())) return {};
    Node* node = m_nodes[size_t(parent.row())].get();
    if (row >= int(node->entry.versions.size())) return {};
    return createIndex(row, column, node);
}

QModelIndex ModelListModel::parent(const QModelIndex& child) const {
    if (!child.isValid() || child.internalPointer() == nullptr) return {};
    const int row = rowOf(static_cast<const Node*>(child.internalPointer()));
    return row < 0 ? QModelIndex() : createIndex(row, 0, nullptr);
}

int ModelListModel::rowCount(const QModelIndex& parent) const {
    if (!parent.isValid()) return int(m_nodes.size());
    if (parent.column() != 0 || parent.internalPointer() != nullptr || parent.row() >= int(m_nodes.size()))
        return 0;
    return int(m_nodes[size_t(parent.row())]->entry.versions.size());
}

int ModelListModel::columnCount(const QModelIndex&) const { return ColumnCount; }

QVariant ModelListModel::data(const QModelIndex& idx, int role) const {
    if (!checkIndex(idx, CheckIndexOption::IndexIsValid)) return {};
    if (idx.internalPointer() == nullptr) return modelData(*m_nodes[size_t(idx.row())], idx.column(), role);
    const Node& node = *static_cast<const Node*>(idx.internalPointer());
    return versionData(node, node.entry.versions[size_t(idx.row())], idx.column(), role);
}

QVariant ModelListModel::modelData(const Node& node, int column, int role) const {
    const core::ModelSummary& s = node.entry.summary;
    switch (role) {
        case ModelNameRole:
            return QString::fromStdString(s.name);
        case VersionRole:
            return QVariant::fromValue<qint64>(0);
        case LiveRole:
            return node.liveVersion > 0;
        case Qt::FontRole: {
            QFont f;
            f.setBold(true);
            return f;
        }
        case Qt::ToolTipRole: {
            QString tip = QStringLiteral("%1 · %2 · latest v%3")
                              .arg(QString::fromStdString(s.name), versionsText(s.versions))
                              .arg(s.latestVersion);
            if (node.liveVersion > 0)
                tip += QStringLiteral("\nv%1 live at %2")
                           .arg(node.liveVersion)
                           .arg(QString::fromStdString(node.liveUrl));
            const int64_t back = node.entry.rollbackVersion();
            if (back > 0) tip += QStringLiteral("\nRoll back would go to v%1").arg(back);
            return tip;
        }
        case Qt::ForegroundRole:
            return column == ColStatus && node.liveVersion > 0 ? QVariant(QBrush(kLiveColor)) : QVariant();
        case Qt::DisplayRole:
        case SortRole:
            break;
        default:
            return {};
    }
    const bool sort = role == SortRole;
    switch (column) {
        case ColName:
            return QString::fromStdString(s.name);
        case ColStatus:
            if (node.liveVersion > 0) return tr("v%1 live").arg(node.liveVersion);
            return sort ? QString() : tr("not deployed");
        case ColAliases: {
            QStringList parts;
            for (const auto& [alias, version] : s.aliases)
                parts << QStringLiteral("%1→v%2").arg(QString::fromStdString(alias)).arg(version);
            return parts.join(QStringLiteral(", "));
        }
        case ColCreated:
            return sort ? QVariant(s.createdAt) : QVariant(formatTime(s.createdAt));
        case ColSource:
            return sort ? QVariant::fromValue<qint64>(s.versions) : QVariant(versionsText(s.versions));
        default:
            return {};
    }
}

QVariant ModelListModel::versionData(const Node& node, const core::ModelVersion& v, int column,
                                     int role) const {
    const bool live = node.liveVersion == v.version;
    switch (role) {
        case ModelNameRole:
            return QString::fromStdString(node.entry.summary.name);
        case VersionRole:
            return QVariant::fromValue<qint64>(v.version);
        case LiveRole:
            return live;
        case Qt::ForegroundRole:
            return live && (column == ColStatus || column == ColName) ? QVariant(QBrush(kLiveColor))
                                                                      : QVariant();
        case Qt::TextAlignmentRole:
            return column == ColSize || column == ColValAccuracy
                       ? QVariant(int(Qt::AlignRight | Qt::AlignVCenter))
                       : QVariant();
        case Qt::ToolTipRole: {
            QString tip = QStringLiteral("%1 v%2\n%3\nsha256 %4\n%5")
                              .arg(QString::fromStdString(v.name))
                              .arg(v.version)
                              .arg(QString::fromStdString(v.path), QString::fromStdString(v.sha256))
                              .arg(formatSize(v.sizeBytes));
            if (!v.source.empty()) tip += QStringLiteral("\nsource: ") + QString::fromStdString(v.source);
            for (const auto& t : v.signature.inputs)
                tip += QStringLiteral("\ninput %1 %2 %3")
                           .arg(QString::fromStdString(t.name), QString::fromStdString(t.datatype),
                                shapeText(t.shape));
            for (const auto& t : v.signature.outputs)
                tip += QStringLiteral("\noutput %1 %2 %3")
                           .arg(QString::fromStdString(t.name), QString::fromStdString(t.datatype),
                                shapeText(t.shape));
            for (const auto& [k, val] : v.metrics)
                tip += QStringLiteral("\n%1 = %2").arg(QString::fromStdString(k)).arg(val, 0, 'g', 5);
            if (live) tip += QStringLiteral("\nlive at ") + QString::fromStdString(node.liveUrl);
            return tip;
        }
        case Qt::DisplayRole:
        case SortRole:
            break;
        default:
            return {};
    }
    const bool sort = role == SortRole;
    switch (column) {
        case ColName:
            return sort ? QVariant::fromValue<qint64>(v.version)
                        : QVariant(QStringLiteral("v%1").arg(v.version));
        case ColStatus:
            return live ? tr("live · %1").arg(QString::fromStdString(node.liveUrl)) : QString();
        case ColAliases: {
            QStringList parts;
            for (const auto& a : v.aliases) parts << QString::fromStdString(a);
            return parts.join(QStringLiteral(", "));
        }
        case ColCreated:
            return sort ? QVariant(v.createdAt) : QVariant(formatTime(v.createdAt));
        case ColSource:
            if (!v.source.empty()) return QString::fromStdString(v.source);
            return v.runId > 0 ? tr("run %1").arg(v.runId) : QString();
        case ColData:
            return QString::fromStdString(v.data);
        case ColParent:
            if (v.parentVersion <= 0) return sort ? QVariant::fromValue<qint64>(0) : QVariant();
            return sort ? QVariant::fromValue<qint64>(v.parentVersion)
                        : QVariant(QStringLiteral("v%1").arg(v.parentVersion));
        case ColValAccuracy: {
            auto it = v.metrics.find("val/accuracy");
            if (it == v.metrics.end() || !std::isfinite(it->second))
                return sort ? QVariant(-1.0) : QVariant();
            // Stored as a fraction; engineers read percentages (as in the runs table).
            return sort ? QVariant(it->second)
                        : QVariant(QString::number(it->second * 100.0, 'f', 2) + QLatin1Char('%'));
        }
        case ColSha:
            return QString::fromStdString(v.sha256.substr(0, 12));
        case ColSize:
            return sort ? QVariant::fromValue<qint64>(v.sizeBytes) : QVariant(formatSize(v.sizeBytes));
        default:
            return {};
    }
}

QVariant ModelListModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
        case ColName:
            return tr("Model / version");
        case ColStatus:
            return tr("Serving");
        case ColAliases:
            return tr("Aliases");
        case ColCreated:
            return tr("Created");
        case ColSource:
            return tr("Source");
        case ColData:
            return tr("Data");
        case ColParent:
            return tr("Parent");
        case ColValAccuracy:
            return tr("Val acc.");
        case ColSha:
            return tr("SHA-256");
        case ColSize:
            return tr("Size");
        default:
            return {};
    }
}

}  // namespace lathe::widgets

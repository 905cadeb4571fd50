#include "lathe/widgets/data_sets_view.h"

#include <QDateTime>
#include <QFont>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QMetaObject>
#include <QPalette>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSplitter>
#include <QStackedWidget>
#include <QTreeWidget>
#include <QVBoxLayout>

#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/data_versions.h"

namespace lathe::widgets {

namespace {

// A version's manifest can hold tens of thousands of files; the list shows the first ones.
constexpr size_t kMaxFilesShown = 1000;

QString q(const std::string& s) { return QString::fromStdString(s); }

QString timeText(double secs) {
    if (secs <= 0) return {};
    return QDateTime::fromMSecsSinceEpoch(qint64(secs * 1000.0)).toString(QStringLiteral("yyyy-MM-dd hh:mm"));
}

QString megabytes(int64_t bytes) {
    // Small CSV files would all read "0.0".
    return QString::number(double(bytes) / 1e6, 'f', bytes >= 100000 ? 1 : 3);
}

QString filesText(int64_t n) { return n == 1 ? QObject::tr("1 file") : QObject::tr("%1 files").arg(n); }

}  // namespace

// The workspace's DataSets, opened on first use; only ever used from the pool's one thread.
struct DataSetsView::Source {
    std::string path;
    std::unique_ptr<core::DataSets> sets;
    core::DataSets& open() {
        if (!sets) sets = std::make_unique<core::DataSets>(path);
        return *sets;
    }
};

struct DataSetsView::ListRead {
    struct Set {
        core::DataVersion current;
        std::vector<core::DataVersion> versions;  // oldest first
    };
    std::vector<Set> sets;
    std::string error;
};

struct DataSetsView::LineageRead {
    core::DataVersion version;
    std::vector<core::DataFile> files;  // the first kMaxFilesShown
    size_t totalFiles = 0;
    std::vector<core::LineageRun> runs;
    std::vector<core::LineageModel> models;
    std::string error;
};

DataSetsView::DataSetsView(QWidget* parent) : QWidget(parent) {
    // One thread: DataSets is safe from one thread at a time.
    m_pool.setMaxThreadCount(1);

    m_tree = new QTreeWidget(this);
    m_tree->setObjectName(QStringLiteral("dataSetsTree"));
    m_tree->setColumnCount(ColumnCount);
    m_tree->setHeaderLabels({tr("Data set / version"), tr("Kind"), tr("Current"), tr("Root hash"),
                             tr("Files"), tr("Size (MB)"), tr("Created"), tr("Message")});
    m_tree->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_tree->setSelectionMode(QAbstractItemView::SingleSelection);
    m_tree->setAlternatingRowColors(true);
    m_tree->setUniformRowHeights(true);
    m_tree->setAllColumnsShowFocus(true);
    m_tree->setWordWrap(false);
    m_tree->header()->setStretchLastSection(true);
    m_tree->setToolTip(tr("Select a version to see what was trained on it"));

    m_version = new QLabel(this);
    m_version->setObjectName(QStringLiteral("dataVersionSummary"));
    m_version->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_version->setWordWrap(true);

    m_lineage = new QTreeWidget(this);
    m_lineage->setObjectName(QStringLiteral("lineageView"));
    m_lineage->setColumnCount(2);
    m_lineage->setHeaderLabels({tr("Lineage"), tr("Details")});
    m_lineage->setUniformRowHeights(true);
    m_lineage->setWordWrap(false);
    m_lineage->header()->setStretchLastSection(true);
    m_lineage->setToolTip(
        tr("Data set version → runs that trained on it → model versions registered from them → their "
           "deployments (double-click a run or a model to show it)"));

    m_files = new QTreeWidget(this);
    m_files->setObjectName(QStringLiteral("dataFilesList"));
    m_files->setColumnCount(3);
    m_files->setHeaderLabels({tr("File"), tr("Size (bytes)"), tr("SHA-256")});
    m_files->setRootIsDecorated(false);
    m_files->setUniformRowHeights(true);
    m_files->setAlternatingRowColors(true);
    m_files->setWordWrap(false);
    m_files->header()->setStretchLastSection(true);

    auto* details = new QSplitter(Qt::Vertical, this);
    details->addWidget(m_lineage);
    details->addWidget(m_files);
    details->setStretchFactor(0, 2);
    details->setStretchFactor(1, 1);
    details->setChildrenCollapsible(false);
    auto* right = new QWidget(this);
    auto* rightLayout = new QVBoxLayout(right);
    rightLayout->setContentsMargins(0, 0, 0, 0);
    rightLayout->addWidget(m_version);
    rightLayout->addWidget(details, 1);

    auto* split = new QSplitter(Qt::Horizontal, this);
    split->addWidget(m_tree);
    split->addWidget(right);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    split->setChildrenCollapsible(false);

    m_empty = new QLabel(this);
    m_empty->setObjectName(QStringLiteral("dataSetsEmpty"));
    m_empty->setAlignment(Qt::AlignCenter);
    m_empty->setWordWrap(true);
    m_empty->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_empty->setText(
        tr("<p>No data sets in this workspace yet.</p>"
           "<p>Version one (an image folder, a CSV file or an IDX folder) with<br>"
           "<code>lathectl data add NAME PATH</code></p>"
           "<p>To make an example image folder first: <code>lathectl data example DIR</code></p>"
           "<p>A run on <code>dataset:NAME</code> then shows here under the version it trained on.</p>"));

    m_stack = new QStackedWidget(this);
    m_stack->addWidget(split);
    m_stack->addWidget(m_empty);

    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("dataSetsStatus"));
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_refresh = new QPushButton(tr("Refresh"), this);
    m_refresh->setObjectName(QStringLiteral("refreshDataSetsButton"));
    m_refresh->setToolTip(tr("Re-read the data sets of this workspace (lathectl data add changes them)"));
    m_refresh->setEnabled(false);

    auto* buttons = new QHBoxLayout;
    buttons->setContentsMargins(4, 2, 4, 2);
    buttons->addWidget(m_status, 1);
    buttons->addWidget(m_refresh);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addLayout(buttons);
    layout->addWidget(m_stack, 1);

    connect(m_refresh, &QPushButton::clicked, this, &DataSetsView::refresh);
    connect(m_tree->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            [this] { loadLineage(false); });
    connect(m_lineage, &QTreeWidget::itemDoubleClicked, this, [this](QTreeWidgetItem* item) {
        const QString kind = item->data(0, KindRole).toString();
        if (kind == QLatin1String("run"))
            Q_EMIT runRequested(item->data(0, RunIdRole).toLongLong());
        else if (kind == QLatin1String("model"))
            Q_EMIT modelRequested(item->data(0, ModelNameRole).toString(),
                                  item->data(0, ModelVersionRole).toLongLong());
    });
    m_stack->setCurrentWidget(m_empty);
    clearDetails();
}

DataSetsView::~DataSetsView() {
    ++m_generation;
    m_pool.waitForDone();
}

void DataSetsView::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    refresh();  // data sets added with lathectl meanwhile
}

void DataSetsView::setWorkspace(const QString& path) {
    ++m_generation;
    m_path = path;
    m_source.reset();
    if (!path.isEmpty()) {
        m_source = std::make_shared<Source>();
        m_source->path = path.toStdString();
    }
    m_refreshing = false;
    m_refreshAgain = false;
    m_lineageLoading = false;
    m_selectedOnce = false;
    m_seen.clear();
    {
        const QSignalBlocker block(m_tree->selectionModel());
        m_tree->clear();
    }
    m_lineageName.clear();
    m_lineageVersion = 0;
    ++m_lineageRequest;
    clearDetails();
    // The empty state only once a read says so (no flash of it while the first read runs).
    m_stack->setCurrentIndex(m_source ? 0 : 1);
    setStatusText(m_source ? tr("Reading the data sets…") : QString());
    m_refresh->setEnabled(m_source != nullptr);
    // Read now when the page is on screen; a hidden page reads when it is shown.
    if (isVisible()) refresh();
}

void DataSetsView::refresh() {
    if (!m_source) return;
    if (m_refreshing) {
        m_refreshAgain = true;
        return;
    }
    m_refreshing = true;
    m_refreshAgain = false;
    const uint64_t generation = m_generation.load();
    // `this` outlives the task (the destructor waits); the source is shared with it.
    m_pool.start([this, source = m_source, generation] {
        if (m_generation.load() != generation) return;
        auto read = std::make_shared<ListRead>();
        try {
            core::DataSets& sets = source->open();
            for (auto& current : sets.list()) {
                ListRead::Set set;
                set.versions = sets.versions(current.name);
                set.current = std::move(current);
                read->sets.push_back(std::move(set));
            }
        } catch (const std::exception& e) {
            read->error = e.what();
        }
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, read] { applyRefresh(generation, read); }, Qt::QueuedConnection);
    });
}

void DataSetsView::applyRefresh(uint64_t generation, const std::shared_ptr<ListRead>& read) {
    if (generation != m_generation.load()) return;
    m_refreshing = false;
    ++m_refreshCount;
    if (!read->error.empty()) {
        setStatusText(tr("Could not read the data sets: %1").arg(q(read->error)), true);
    } else {
        // Rebuilt from scratch (a few rows); the selection and what was open survive by name.
        const QString selectedName = selectedDataSet();
        const int64_t selectedRow = [&]() -> int64_t {
            const auto items = m_tree->selectedItems();
            return items.isEmpty() ? -1 : items.first()->data(0, VersionRole).toLongLong();
        }();
        QStringList collapsed;
        for (int i = 0; i < m_tree->topLevelItemCount(); ++i)
            if (!m_tree->topLevelItem(i)->isExpanded())
                collapsed << m_tree->topLevelItem(i)->data(0, NameRole).toString();
        const bool firstFill = m_tree->topLevelItemCount() == 0;

        QTreeWidgetItem* pick = nullptr;
        int versions = 0;
        {
            const QSignalBlocker block(m_tree->selectionModel());
            m_tree->clear();
            for (const auto& set : read->sets) {
                const QString name = q(set.current.name);
                auto* top = new QTreeWidgetItem(m_tree);
                top->setText(ColName, name);
                top->setText(ColKind, q(set.current.kind));
                top->setText(ColCurrent, QStringLiteral("v%1").arg(set.current.version));
                top->setText(ColRoot, q(set.current.rootHash.substr(0, 12)));
                top->setText(ColFiles, QString::number(set.current.files));
                top->setText(ColSize, megabytes(set.current.bytes));
                top->setText(ColCreated, timeText(set.current.createdAt));
                top->setText(ColMessage, q(set.current.message));
                top->setToolTip(ColName, tr("%1: %n version(s), from %2", nullptr, int(set.versions.size()))
                                             .arg(name, q(set.current.source)));
                top->setData(0, NameRole, name);
                top->setData(0, VersionRole, qint64(0));
                top->setData(0, CurrentVersionRole, qint64(set.current.version));
                top->setData(0, CurrentRole, false);
                for (auto it = set.versions.rbegin(); it != set.versions.rend(); ++it) {  // newest first
                    const core::DataVersion& v = *it;
                    auto* row = new QTreeWidgetItem(top);
                    row->setText(ColName, QStringLiteral("v%1").arg(v.version));
                    row->setText(ColKind, q(v.kind));
                    row->setText(ColCurrent, v.current ? tr("● current") : QString());
                    row->setText(ColRoot, q(v.rootHash.substr(0, 12)));
                    row->setToolTip(ColRoot, q(v.rootHash));
                    row->setText(ColFiles, QString::number(v.files));
                    row->setText(ColSize, megabytes(v.bytes));
                    row->setToolTip(ColSize, tr("%1 bytes").arg(v.bytes));
                    row->setText(ColCreated, timeText(v.createdAt));
                    row->setText(ColMessage, q(v.message));
                    row->setToolTip(ColName, tr("dataset:%1, taken from %2").arg(q(v.ref()), q(v.source)));
                    for (int c : {int(ColFiles), int(ColSize)}) row->setTextAlignment(c, Qt::AlignRight);
                    row->setData(0, NameRole, name);
                    row->setData(0, VersionRole, qint64(v.version));
                    row->setData(0, CurrentVersionRole, qint64(set.current.version));
                    row->setData(0, CurrentRole, v.current);
                    if (v.current) {
                        QFont bold = row->font(0);
                        bold.setBold(true);
                        for (int c = 0; c < ColumnCount; ++c) row->setFont(c, bold);
                    }
                    if (name == selectedName && selectedRow == v.version) pick = row;
                    ++versions;
                }
                for (int c : {int(ColFiles), int(ColSize)}) top->setTextAlignment(c, Qt::AlignRight);
                if (name == selectedName && selectedRow == 0) pick = top;
                // New data sets open on their versions; one the user collapsed stays collapsed.
                if (!m_seen.contains(name)) {
                    m_seen << name;
                    top->setExpanded(true);
                } else {
                    top->setExpanded(!collapsed.contains(name));
                }
            }
            if (!pick && !m_selectedOnce && m_tree->topLevelItemCount() > 0) {
                // Where one left off: the first data set's current version.
                QTreeWidgetItem* top = m_tree->topLevelItem(0);
                pick = top;
                for (int i = 0; i < top->childCount(); ++i)
                    if (top->child(i)->data(0, CurrentRole).toBool()) pick = top->child(i);
            }
            if (pick) {
                m_selectedOnce = true;
                m_tree->setCurrentItem(pick);
                pick->setSelected(true);
            }
        }
        if (firstFill)
            for (int c = 0; c < ColumnCount - 1; ++c) m_tree->resizeColumnToContents(c);
        const int sets = int(read->sets.size());
        m_stack->setCurrentWidget(sets == 0 ? static_cast<QWidget*>(m_empty) : m_stack->widget(0));
        setStatusText(sets == 0
                          ? tr("No data sets yet.")
                          : tr("%n data set(s), ", nullptr, sets) + tr("%n version(s)", nullptr, versions));
        // Runs trained since the last read show in the lineage too.
        loadLineage(true);
    }
    Q_EMIT refreshed();
    if (m_refreshAgain) refresh();
}

QString DataSetsView::selectedDataSet() const {
    const auto items = m_tree->selectedItems();
    return items.isEmpty() ? QString() : items.first()->data(0, NameRole).toString();
}

int64_t DataSetsView::selectedVersion() const {
    const auto items = m_tree->selectedItems();
    if (items.isEmpty()) return 0;
    const int64_t v = items.first()->data(0, VersionRole).toLongLong();
    return v > 0 ? v : items.first()->data(0, CurrentVersionRole).toLongLong();
}

void DataSetsView::selectVersion(const QString& name, int64_t version) {
    for (int i = 0; i < m_tree->topLevelItemCount(); ++i) {
        QTreeWidgetItem* top = m_tree->topLevelItem(i);
        if (top->data(0, NameRole).toString() != name) continue;
        QTreeWidgetItem* pick = version <= 0 ? top : nullptr;
        for (int c = 0; c < top->childCount() && !pick; ++c)
            if (top->child(c)->data(0, VersionRole).toLongLong() == version) pick = top->child(c);
        if (!pick) break;
        if (pick != top) top->setExpanded(true);
        m_tree->setCurrentItem(pick);
        m_tree->scrollToItem(pick);
        return;
    }
    m_tree->clearSelection();
}

QStringList DataSetsView::dataSetNames() const {
    QStringList names;
    for (int i = 0; i < m_tree->topLevelItemCount(); ++i)
        names << m_tree->topLevelItem(i)->data(0, NameRole).toString();
    return names;
}

bool DataSetsView::isEmptyShown() const { return m_stack->currentWidget() == m_empty; }

void DataSetsView::loadLineage(bool force) {
    const QString name = selectedDataSet();
    const int64_t version = selectedVersion();
    if (!force && name == m_lineageName && version == m_lineageVersion) return;
    m_lineageName = name;
    m_lineageVersion = version;
    const uint64_t request = ++m_lineageRequest;
    if (!m_source || name.isEmpty() || version <= 0) {
        m_lineageLoading = false;
        clearDetails();
        return;
    }
    m_lineageLoading = true;
    const uint64_t generation = m_generation.load();
    m_pool.start([this, source = m_source, generation, request, name = name.toStdString(), version] {
        // A newer selection (or workspace) replaced this one before it started: skip the read.
        if (m_generation.load() != generation || m_lineageRequest.load() != request) return;
        auto read = std::make_shared<LineageRead>();
        try {
            core::DataSets& sets = source->open();
            read->version = sets.resolve({name, version});
            auto files = sets.files(read->version);
            read->totalFiles = files.size();
            if (files.size() > kMaxFilesShown) files.resize(kMaxFilesShown);
            read->files = std::move(files);
            read->runs = sets.runsOn(read->version);
            read->models = sets.modelsOf(read->runs);
        } catch (const std::exception& e) {
            read->error = e.what();
        }
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, request, read] { applyLineage(generation, request, read); },
            Qt::QueuedConnection);
    });
}

void DataSetsView::applyLineage(uint64_t generation, uint64_t request,
                                const std::shared_ptr<LineageRead>& read) {
    if (generation != m_generation.load() || request != m_lineageRequest.load()) return;
    m_lineageLoading = false;
    if (!read->error.empty()) {
        clearDetails();
        m_version->setText(
            tr("Could not read %1:%2: %3").arg(m_lineageName).arg(m_lineageVersion).arg(q(read->error)));
        m_version->setStyleSheet(QStringLiteral("color: #c62828;"));
        Q_EMIT lineageLoaded();
        return;
    }
    const core::DataVersion& v = read->version;
    m_version->setStyleSheet({});
    QString summary = tr("<b>%1</b>%2 — %3, %4, %5 MB<br>root %6<br>taken from %7 on %8")
                          .arg(q(v.ref()).toHtmlEscaped(), v.current ? tr(" (current)") : QString(),
                               q(v.kind).toHtmlEscaped(), filesText(v.files), megabytes(v.bytes),
                               q(v.rootHash), q(v.source).toHtmlEscaped(), timeText(v.createdAt));
    if (!v.message.empty()) summary += QStringLiteral("<br>") + q(v.message).toHtmlEscaped();
    m_version->setText(summary);

    m_lineage->clear();
    QColor dim = palette().color(QPalette::Disabled, QPalette::Text);
    auto* root = new QTreeWidgetItem(m_lineage);
    root->setText(0, QStringLiteral("dataset:%1").arg(q(v.ref())));
    root->setText(1, tr("%1, %2, root %3").arg(q(v.kind), filesText(v.files), q(v.rootHash.substr(0, 12))));
    root->setData(0, KindRole, QStringLiteral("data"));
    if (read->runs.empty()) {
        auto* none = new QTreeWidgetItem(root);
        none->setText(0, tr("no run trained on it yet"));
        none->setText(1, tr("train with data = \"dataset:%1\"").arg(q(v.ref())));
        none->setData(0, KindRole, QStringLiteral("none"));
        none->setForeground(0, dim);
        none->setForeground(1, dim);
    }
    for (const auto& r : read->runs) {
        auto* run = new QTreeWidgetItem(root);
        run->setText(
            0, r.name.empty() ? tr("run %1").arg(r.runId) : tr("run %1  %2").arg(r.runId).arg(q(r.name)));
        run->setText(1, q(r.status));
        run->setToolTip(0, tr("data = %1 (double-click to show the run)").arg(q(r.data)));
        run->setData(0, KindRole, QStringLiteral("run"));
        run->setData(0, RunIdRole, qint64(r.runId));
        for (const auto& m : read->models) {
            if (m.runId != r.runId) continue;
            auto* model = new QTreeWidgetItem(run);
            model->setText(0, tr("model %1:%2").arg(q(m.name)).arg(m.version));
            QStringList aliases;
            for (const auto& a : m.aliases) aliases << QStringLiteral("@") + q(a);
            QString detail = aliases.join(QLatin1Char(' '));
            if (m.deployments.empty())
                detail += (detail.isEmpty() ? QString() : QStringLiteral(", ")) + tr("never deployed");
            model->setText(1, detail);
            model->setToolTip(
                0, tr("Double-click to show %1 v%2 on the Models page").arg(q(m.name)).arg(m.version));
            model->setData(0, KindRole, QStringLiteral("model"));
            model->setData(0, ModelNameRole, q(m.name));
            model->setData(0, ModelVersionRole, qint64(m.version));
            for (const auto& d : m.deployments) {
                auto* dep = new QTreeWidgetItem(model);
                dep->setText(0, q(d));
                dep->setToolTip(0, q(d));
                dep->setData(0, KindRole, QStringLiteral("deployment"));
            }
        }
    }
    m_lineage->expandAll();
    m_lineage->resizeColumnToContents(0);

    m_files->clear();
    QList<QTreeWidgetItem*> rows;
    rows.reserve(int(read->files.size()) + 1);
    for (const auto& f : read->files) {
        auto* row = new QTreeWidgetItem;
        row->setText(0, q(f.path));
        row->setText(1, QString::number(f.size));
        row->setTextAlignment(1, Qt::AlignRight);
        row->setText(2, q(f.sha256.substr(0, 12)));
        row->setToolTip(2, q(f.sha256));
        rows << row;
    }
    if (read->totalFiles > read->files.size()) {
        auto* more = new QTreeWidgetItem;
        more->setText(0, tr("… and %1 more (lathectl data show %2)")
                             .arg(qulonglong(read->totalFiles - read->files.size()))
                             .arg(q(v.ref())));
        more->setForeground(0, dim);
        rows << more;
    }
    m_files->addTopLevelItems(rows);
    m_files->resizeColumnToContents(0);
    Q_EMIT lineageLoaded();
}

void DataSetsView::clearDetails(const QString& text) {
    m_lineage->clear();
    m_files->clear();
    m_version->setStyleSheet({});
    m_version->setText(text.isEmpty() ? tr("Select a version to see its lineage and files.") : text);
}

void DataSetsView::setStatusText(const QString& text, bool error) {
    m_status->setStyleSheet(error ? QStringLiteral("color: #c62828;") : QString());
    m_status->setText(text);
}

QString DataSetsView::statusText() const { return m_status->text(); }

}  // namespace lathe::widgets

#include "lathe/widgets/models_view.h"

#include <QComboBox>
#include <QDialog>
#include <QDialogButtonBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QSet>
#include <QSignalBlocker>
#include <QSplitter>
#include <QTabWidget>
#include <QTimer>
#include <QTreeView>
#include <QVBoxLayout>

#include <algorithm>
#include <exception>
#include <vector>

#include "lathe/widgets/compress_report_view.h"
#include "lathe/widgets/model_list_model.h"
#include "lathe/widgets/rollout_view.h"
#include "lathe/widgets/serving_dashboard.h"

namespace lathe::widgets {

namespace {
// Deployments by lathectl or the rollout controller show up without a manual refresh.
constexpr int kRefreshMs = 3000;
}  // namespace

struct ModelsView::ReadResult {
    std::vector<ModelEntry> models;
    std::string error;
};

ModelsView::ModelsView(QWidget* parent) : QWidget(parent) {
    m_pool.setMaxThreadCount(1);

    m_model = new ModelListModel(this);
    m_tree = new QTreeView(this);
    m_tree->setObjectName(QStringLiteral("modelTree"));
    m_tree->setModel(m_model);
    m_tree->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_tree->setSelectionMode(QAbstractItemView::SingleSelection);
    m_tree->setAlternatingRowColors(true);
    m_tree->setUniformRowHeights(true);
    m_tree->setAllColumnsShowFocus(true);
    m_tree->setWordWrap(false);
    m_tree->header()->setStretchLastSection(true);
    m_tree->setToolTip(tr("Select a version to deploy it, or a model to roll it back"));

    m_deploy = new QPushButton(tr("Deploy"), this);
    m_deploy->setObjectName(QStringLiteral("deployButton"));
    m_rollback = new QPushButton(tr("Roll back"), this);
    m_rollback->setObjectName(QStringLiteral("rollbackButton"));
    m_target = new QComboBox(this);
    m_target->setObjectName(QStringLiteral("deployTarget"));
    m_target->addItem(tr("This machine"), QString());
    m_target->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    m_compress = new QPushButton(tr("Compress…"), this);
    m_compress->setObjectName(QStringLiteral("compressButton"));
    m_graph = new QPushButton(tr("Graph…"), this);
    m_graph->setObjectName(QStringLiteral("graphButton"));
    m_report = new QPushButton(tr("Report"), this);
    m_report->setObjectName(QStringLiteral("reportButton"));
    m_refresh = new QPushButton(tr("Refresh"), this);
    m_refresh->setToolTip(tr("Re-read the registry (it is re-read every few seconds anyway)"));
    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("modelsStatus"));
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_status->setWordWrap(true);

    auto* buttons = new QHBoxLayout;
    buttons->setContentsMargins(4, 2, 4, 2);
    buttons->addWidget(m_deploy);
    auto* on = new QLabel(tr("on"), this);
    on->setBuddy(m_target);
    buttons->addWidget(on);
    buttons->addWidget(m_target);
    buttons->addWidget(m_rollback);
    buttons->addSpacing(12);
    buttons->addWidget(m_compress);
    buttons->addWidget(m_graph);
    buttons->addWidget(m_report);
    buttons->addSpacing(12);
    buttons->addWidget(m_status, 1);
    buttons->addWidget(m_refresh);

    auto* top = new QWidget(this);
    auto* topLayout = new QVBoxLayout(top);
    topLayout->setContentsMargins(0, 0, 0, 0);
    topLayout->setSpacing(2);
    topLayout->addLayout(buttons);
    topLayout->addWidget(m_tree, 1);

    m_dashboard = new ServingDashboard(this);
    m_dashboard->setObjectName(QStringLiteral("servingDashboard"));

    m_rollouts = new RolloutView(this);
    m_rollouts->setObjectName(QStringLiteral("rolloutView"));
    auto* tabs = new QTabWidget(this);
    tabs->setObjectName(QStringLiteral("modelTabs"));
    tabs->addTab(m_dashboard, tr("Serving"));
    tabs->addTab(m_rollouts, tr("Rollout (A/B)"));

    auto* split = new QSplitter(Qt::Vertical, this);
    split->addWidget(top);
    split->addWidget(tabs);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 3);
    split->setSizes({240, 660});
    split->setChildrenCollapsible(false);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(split);

    connect(m_deploy, &QPushButton::clicked, this, &ModelsView::requestDeploy);
    connect(m_rollback, &QPushButton::clicked, this, &ModelsView::requestRollback);
    connect(m_refresh, &QPushButton::clicked, this, &ModelsView::refresh);
    connect(m_graph, &QPushButton::clicked, this, [this] {
        if (selectedVersion() > 0) Q_EMIT graphRequested(selectedModel(), selectedVersion());
    });
    connect(m_compress, &QPushButton::clicked, this, [this] {
        if (selectedVersion() > 0) Q_EMIT compressRequested(selectedModel(), selectedVersion());
    });
    connect(m_report, &QPushButton::clicked, this, &ModelsView::showReport);
    connect(m_target, QOverload<int>::of(&QComboBox::currentIndexChanged), this, [this] {
        if (m_target->isEnabled()) m_chosenHost = m_target->currentData().toString();
        updateButtons();
    });
    connect(m_tree->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &ModelsView::onSelectionChanged);
    // A model's Serving column changes when a deployment lands: the buttons follow.
    connect(m_model, &QAbstractItemModel::dataChanged, this, &ModelsView::updateButtons);
    connect(m_model, &QAbstractItemModel::dataChanged, this, [this] { m_fitColumns = true; });
    connect(m_model, &QAbstractItemModel::rowsInserted, this, [this] { m_fitColumns = true; });

    m_timer = new QTimer(this);
    m_timer->setInterval(kRefreshMs);
    connect(m_timer, &QTimer::timeout, this, [this] {
        if (isVisible()) refresh();
    });
    m_timer->start();
    updateButtons();
}

ModelsView::~ModelsView() {
    ++m_generation;
    m_pool.waitForDone();
}

void ModelsView::setRefreshInterval(int ms) { m_timer->setInterval(ms); }

void ModelsView::setConfirmHook(ConfirmHook hook) {
    m_rollouts->setConfirmHook(hook);
    m_confirm = std::move(hook);
}

void ModelsView::setTargetHosts(const QStringList& names) {
    {
        QSignalBlocker block(m_target);
        while (m_target->count() > 1) m_target->removeItem(1);
        for (const auto& name : names) m_target->addItem(tr("host %1").arg(name), name);
    }
    if (!names.contains(m_chosenHost)) m_chosenHost.clear();
    updateButtons();
}

QString ModelsView::deployHost() const {
    const ModelEntry* entry = m_model->entry(selectedModel());
    if (entry && entry->live()) return {};
    return m_chosenHost;
}

void ModelsView::setDeployTarget(const QString& host, int port) {
    m_host = host;
    m_port = port;
}

void ModelsView::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    if (m_registry) refresh();
}

void ModelsView::setRegistry(std::shared_ptr<const core::Registry> registry) {
    ++m_generation;
    m_registry = std::move(registry);
    m_refreshing = false;
    m_refreshAgain = false;
    m_selectedOnce = false;
    m_seenModels.clear();
    m_model->setModels({});
    m_dashboardModel.clear();
    m_dashboard->clear();
    m_rollouts->showModel(nullptr, {});
    setStatusText({});
    updateButtons();
    if (m_registry) refresh();
}

void ModelsView::refresh() {
    if (!m_registry) return;
    if (m_refreshing) {
        m_refreshAgain = true;
        return;
    }
    m_refreshing = true;
    m_refreshAgain = false;
    const uint64_t generation = m_generation.load();
    // `this` outlives the task (the destructor waits); the registry is shared.
    m_pool.start([this, registry = m_registry, generation] {
        if (m_generation.load() != generation) return;
        auto result = std::make_shared<ReadResult>();
        try {
            result->models = readModelEntries(*registry);
        } catch (const std::exception& e) {
            result->error = e.what();
        }
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, result] { applyRefresh(generation, result); }, Qt::QueuedConnection);
    });
}

void ModelsView::applyRefresh(uint64_t generation, const std::shared_ptr<ReadResult>& result) {
    if (generation != m_generation.load()) return;
    m_refreshing = false;
    ++m_refreshCount;
    if (!result->error.empty()) {
        setStatusText(tr("Could not read the model registry: %1").arg(QString::fromStdString(result->error)),
                      true);
    } else {
        m_model->setModels(std::move(result->models));
        // New models open on their versions (those are what one deploys); a model the user
        // collapsed stays collapsed.
        for (int row = 0; row < m_model->rowCount(); ++row) {
            const QModelIndex idx = m_model->index(row, 0);
            const QString name = idx.data(ModelListModel::ModelNameRole).toString();
            if (m_seenModels.contains(name)) continue;
            m_seenModels.insert(name);
            m_tree->expand(idx);
        }
        if (m_fitColumns) {
            // Widen columns whose content grew (a live URL, a longer source); never narrow
            // them, so widths the user chose survive until content needs more.
            m_fitColumns = false;
            const QAbstractItemView* view = m_tree;  // QTreeView hides the public base's hint
            for (int c = 0; c < ModelListModel::ColumnCount - 1; ++c) {
                const int want = std::max(view->sizeHintForColumn(c), m_tree->header()->sectionSizeHint(c));
                if (want > m_tree->columnWidth(c)) m_tree->setColumnWidth(c, want);
            }
        }
        if (!m_selectedOnce && m_model->modelCount() > 0) {
            m_selectedOnce = true;
            // Where one left off: the live version of the first deployed model, else the newest
            // version of the first model.
            QModelIndex pick;
            for (int row = 0; row < m_model->rowCount() && !pick.isValid(); ++row) {
                const QModelIndex m = m_model->index(row, 0);
                for (int v = 0; v < m_model->rowCount(m); ++v)
                    if (m_model->index(v, 0, m).data(ModelListModel::LiveRole).toBool())
                        pick = m_model->index(v, 0, m);
            }
            if (!pick.isValid()) {
                const QModelIndex m = m_model->index(0, 0);
                pick = m_model->rowCount(m) > 0 ? m_model->index(0, 0, m) : m;
            }
            m_tree->selectionModel()->select(pick,
                                             QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
            m_tree->setCurrentIndex(pick);
        }
    }
    updateButtons();
    onSelectionChanged();
    Q_EMIT refreshed();
    if (m_refreshAgain) refresh();
}

QString ModelsView::selectedModel() const {
    const QModelIndexList rows = m_tree->selectionModel()->selectedRows();
    return rows.isEmpty() ? QString() : rows.first().data(ModelListModel::ModelNameRole).toString();
}

int64_t ModelsView::selectedVersion() const {
    const QModelIndexList rows = m_tree->selectionModel()->selectedRows();
    return rows.isEmpty() ? 0 : rows.first().data(ModelListModel::VersionRole).toLongLong();
}

void ModelsView::selectModel(const QString& model, int64_t version) {
    const QModelIndex idx = m_model->indexOf(model, version);
    if (!idx.isValid()) {
        m_tree->selectionModel()->clearSelection();
        return;
    }
    if (version > 0) m_tree->expand(idx.parent());
    m_tree->selectionModel()->select(idx, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    m_tree->setCurrentIndex(idx);
    m_tree->scrollTo(idx);
}

void ModelsView::onSelectionChanged() {
    const QString model = selectedModel();
    if (model != m_dashboardModel) {
        m_dashboardModel = model;
        m_dashboard->showModel(m_registry, model);
        m_rollouts->showModel(m_registry, model);
    }
    updateButtons();
}

void ModelsView::updateButtons() {
    const QString model = selectedModel();
    const int64_t version = selectedVersion();
    const ModelEntry* entry = model.isEmpty() ? nullptr : m_model->entry(model);

    QString deployTip;
    if (m_busy)
        deployTip = tr("A deployment is in progress");
    else if (!entry)
        deployTip = tr("Select a model version to deploy");
    else if (version <= 0)
        deployTip = tr("Select one of %1's versions to deploy it").arg(model);
    else
        deployTip = deployQuestion(model, version);
    m_deploy->setEnabled(!m_busy && entry && version > 0);
    m_deploy->setToolTip(deployTip);

    QString rollbackTip;
    const core::Deployment* live = entry ? entry->live() : nullptr;
    const int64_t back = entry ? entry->rollbackVersion() : 0;
    if (m_busy)
        rollbackTip = tr("A deployment is in progress");
    else if (!entry)
        rollbackTip = tr("Select a model to roll back");
    else if (!live)
        rollbackTip = tr("%1 has no live deployment to roll back").arg(model);
    else if (back <= 0)
        rollbackTip = tr("%1 has no earlier version in its deployment history").arg(model);
    else
        rollbackTip = rollbackQuestion(model);
    m_rollback->setEnabled(!m_busy && live && back > 0);
    m_compress->setEnabled(entry && version > 0);
    m_graph->setEnabled(entry && version > 0);
    m_graph->setToolTip(version > 0 ? tr("Show the op graph of %1 v%2").arg(selectedModel()).arg(version)
                                    : tr("Select a version to see its op graph"));
    m_compress->setToolTip(version > 0
                               ? tr("Make a smaller, faster version of %1 v%2 (int8 quantization) and "
                                    "compare it with this one")
                                     .arg(model)
                                     .arg(version)
                               : tr("Select a model version to compress"));
    const core::ModelVersion* selected = entry && version > 0 ? entry->version(version) : nullptr;
    m_report->setEnabled(selected && !selected->report.empty());
    m_report->setToolTip(
        selected && !selected->report.empty()
            ? tr("%1 v%2 against its parent: accuracy, size and latency").arg(model).arg(version)
            : tr("Select a compressed version to see its report"));
    {
        // The box shows where a deploy goes: the person's choice, or where a live model runs.
        QSignalBlocker block(m_target);
        m_target->setEnabled(!m_busy && !live);
        QString shown = m_chosenHost;
        if (live)
            shown = live->target.rfind("ssh:", 0) == 0 ? QString::fromStdString(live->target.substr(4))
                                                       : QString();
        const int index = m_target->findData(shown);
        m_target->setCurrentIndex(index >= 0 ? index : 0);
    }
    m_target->setToolTip(
        live ? tr("%1 is live at %2: a deploy hot-swaps it there (undeploy it to move it)")
                   .arg(model, QString::fromStdString(live->url))
             : tr("Where a new server runs: this machine, or a host of the workspace (Hosts page)"));
    m_rollback->setToolTip(rollbackTip);
    m_refresh->setEnabled(m_registry != nullptr);
}

QString ModelsView::deployQuestion(const QString& model, int64_t version) const {
    const ModelEntry* entry = m_model->entry(model);
    const core::Deployment* live = entry ? entry->live() : nullptr;
    const QString host = deployHost();
    if (!live && !host.isEmpty())
        return tr("Deploy %1 v%2 to host %3? The model is copied there and a new server started on it.")
            .arg(model)
            .arg(version)
            .arg(host);
    if (!live)
        return tr("Deploy %1 v%2 to a new local server at http://%3:%4 (or the next free port)?")
            .arg(model)
            .arg(version)
            .arg(m_host)
            .arg(m_port);
    const QString url = QString::fromStdString(live->url);
    if (live->version == version)
        return tr("Deploy %1 v%2 to %3 again? It is already the live version.")
            .arg(model)
            .arg(version)
            .arg(url);
    return tr("Deploy %1 v%2 to %3, replacing v%4?").arg(model).arg(version).arg(url).arg(live->version);
}

QString ModelsView::rollbackQuestion(const QString& model) const {
    const ModelEntry* entry = m_model->entry(model);
    const core::Deployment* live = entry ? entry->live() : nullptr;
    const int64_t back = entry ? entry->rollbackVersion() : 0;
    if (!live || back <= 0) return {};
    return tr("Roll back %1 from v%2 to v%3?").arg(model).arg(live->version).arg(back);
}

bool ModelsView::confirm(const QString& title, const QString& question) {
    if (m_confirm) return m_confirm(title, question);
    return QMessageBox::question(this, title, question, QMessageBox::Yes | QMessageBox::Cancel,
                                 QMessageBox::Cancel) == QMessageBox::Yes;
}

void ModelsView::requestDeploy() {
    const QString model = selectedModel();
    const int64_t version = selectedVersion();
    if (m_busy || model.isEmpty() || version <= 0) return;
    if (!confirm(tr("Deploy model"), deployQuestion(model, version))) {
        setStatusText(tr("Deployment of %1 v%2 cancelled.").arg(model).arg(version));
        return;
    }
    Q_EMIT deployRequested(model, version);
}

void ModelsView::requestRollback() {
    const QString model = selectedModel();
    const ModelEntry* entry = m_model->entry(model);
    if (m_busy || !entry || !entry->live() || entry->rollbackVersion() <= 0) return;
    const int64_t from = entry->live()->version;
    const int64_t to = entry->rollbackVersion();
    if (!confirm(tr("Roll back model"), rollbackQuestion(model))) {
        setStatusText(tr("Rollback of %1 cancelled.").arg(model));
        return;
    }
    Q_EMIT rollbackRequested(model, from, to);
}

void ModelsView::setBusy(bool busy, const QString& text) {
    m_busy = busy;
    if (!text.isEmpty() || busy) setStatusText(text);
    updateButtons();
}

void ModelsView::setStatusText(const QString& text, bool error) {
    m_status->setStyleSheet(error ? QStringLiteral("color: #c62828;") : QString());
    m_status->setText(text);
}

QString ModelsView::statusText() const { return m_status->text(); }

QDialog* ModelsView::showReport() {
    const QString model = selectedModel();
    const int64_t version = selectedVersion();
    const ModelEntry* entry = model.isEmpty() ? nullptr : m_model->entry(model);
    const core::ModelVersion* v = entry && version > 0 ? entry->version(version) : nullptr;
    if (!v || v->report.empty()) return nullptr;
    core::CompressReport report;
    try {
        report = core::CompressReport::fromJson(v->report);
    } catch (const std::exception& ex) {
        setStatusText(tr("The report of %1 v%2 cannot be read: %3").arg(model).arg(version).arg(ex.what()),
                      true);
        return nullptr;
    }
    auto* dialog = new QDialog(this);
    dialog->setObjectName(QStringLiteral("reportDialog"));
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->setWindowTitle(tr("%1 v%2: compression report").arg(model).arg(version));
    auto* view = new CompressReportView(dialog);
    const QString parentName = QString::fromStdString(v->parentModel.empty() ? v->name : v->parentModel);
    view->setReport(report, tr("%1 v%2").arg(parentName).arg(v->parentVersion),
                    tr("%1 v%2").arg(model).arg(version));
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, dialog);
    connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
    auto* layout = new QVBoxLayout(dialog);
    layout->addWidget(view, 1);
    layout->addWidget(buttons);
    dialog->resize(900, 620);
    dialog->show();
    return dialog;
}

}  // namespace lathe::widgets

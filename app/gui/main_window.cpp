#include "main_window.h"

#include <algorithm>

#include <QAction>
#include <QCloseEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QGroupBox>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollArea>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

#include <algorithm>
#include <exception>
#include <map>
#include <string>

#include "deploy_session.h"
#include "lathe/core/compress.h"
#include "lathe/core/data_versions.h"
#include "lathe/core/error.h"
#include "lathe/remote/inventory.h"
#include "lathe/remote/server_host.h"
#include "lathe/widgets/comm_view.h"
#include "lathe/widgets/compress_dialog.h"
#include "lathe/widgets/dashboard.h"
#include "lathe/widgets/data_sets_view.h"
#include "lathe/widgets/data_view.h"
#include "lathe/widgets/graph_view.h"
#include "lathe/widgets/host_list_model.h"
#include "lathe/widgets/hosts_view.h"
#include "lathe/widgets/log_view.h"
#include "lathe/widgets/loss_scale_view.h"
#include "lathe/widgets/models_view.h"
#include "lathe/widgets/profile_view.h"
#include "lathe/widgets/rollout_view.h"
#include "lathe/widgets/run_form.h"
#include "lathe/widgets/run_list_model.h"
#include "lathe/widgets/run_view.h"
#include "lathe/widgets/serving_dashboard.h"
#include "lathe/widgets/studies_view.h"
#include "lathe/widgets/study_dialog.h"
#include "study_processes.h"
#include "training_session.h"

namespace lathe::app {

namespace {

// Runs written by another process (lathectl train into the same workspace) show up
// without a manual refresh; the read is a few milliseconds, on a worker thread.
constexpr int kRefreshMs = 3000;

}  // namespace

// What one read of the runs list found, handed from the worker to the GUI thread.
struct MainWindow::RunsRead {
    uint64_t answers = 0;  // the refreshRuns() calls made before it started
    std::vector<core::RunRecord> runs;
    std::map<int64_t, double> valAccuracy;
    std::string error;
};

MainWindow::MainWindow(std::unique_ptr<core::Store> store, QWidget* parent)
    : QMainWindow(parent), m_store(std::move(store)) {
    m_form = new widgets::RunForm;
    m_form->setObjectName(QStringLiteral("runForm"));
    auto* formBox = new QGroupBox(tr("New run"));
    auto* formLayout = new QVBoxLayout(formBox);
    formLayout->addWidget(m_form);
    auto* formScroll = new QScrollArea;
    formScroll->setWidget(formBox);
    formScroll->setWidgetResizable(true);
    formScroll->setFrameShape(QFrame::NoFrame);
    formScroll->setMinimumWidth(300);

    m_runModel = new widgets::RunListModel(this);
    m_proxy = new widgets::RunFilterProxy(this);
    m_proxy->setSourceModel(m_runModel);
    m_proxy->setSortRole(widgets::RunListModel::SortRole);
    m_table = new QTableView;
    m_table->setObjectName(QStringLiteral("runTable"));
    m_table->setModel(m_proxy);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(widgets::RunListModel::ColId, Qt::DescendingOrder);
    m_table->verticalHeader()->hide();
    m_table->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 6);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->setAlternatingRowColors(true);
    m_table->setWordWrap(false);
    m_table->setToolTip(tr("Select several runs (Ctrl/Shift) to overlay their curves"));

    m_tabs = new QTabWidget;
    m_tabs->setObjectName(QStringLiteral("viewTabs"));
    m_tabs->setDocumentMode(true);
    m_dashboard = new widgets::Dashboard;
    // Runs overlaid from rows (recorded before packs existed) are packed for the next overlay.
    connect(m_dashboard, &widgets::Dashboard::runsUnpacked, this,
            [this](const QString& path, const QList<qint64>& runIds) {
                if (!m_store || QString::fromStdString(m_store->path()) != path) return;
                m_store->packSeries(std::vector<int64_t>(runIds.begin(), runIds.end()));
            });
    // The per-run views: one line each.
    addRunView(m_dashboard, QStringLiteral("dashboard"));
    addRunView(new widgets::LossScaleView, QStringLiteral("lossScaleView"));
    addRunView(new widgets::ProfileView, QStringLiteral("profileView"));
    addRunView(new widgets::CommView, QStringLiteral("commView"));
    addRunView(new widgets::DataView, QStringLiteral("dataView"));
    addRunView(new widgets::LogView, QStringLiteral("logView"));
    addRunView(new widgets::RunGraphView, QStringLiteral("runGraphView"));

    // A filter over every column of the runs list (name, experiment, status, model, data...).
    // The list's model and sorting stay on the GUI thread: at 10,000 runs a fill, a sort or a
    // filter takes 10-65 ms here (bench_overlay); the runs are read on a worker.
    m_runFilter = new QLineEdit;
    m_runFilter->setObjectName(QStringLiteral("runFilter"));
    m_runFilter->setPlaceholderText(tr("Filter runs: name, experiment, status, model, data…"));
    m_runFilter->setClearButtonEnabled(true);
    auto* filterTimer = new QTimer(this);  // one filter pass per pause in typing, not per key
    filterTimer->setSingleShot(true);
    filterTimer->setInterval(150);
    connect(m_runFilter, &QLineEdit::textChanged, filterTimer, qOverload<>(&QTimer::start));
    connect(m_runFilter, &QLineEdit::returnPressed, filterTimer, [this, filterTimer] {
        filterTimer->stop();
        m_proxy->setFilterText(m_runFilter->text().trimmed());
    });
    connect(filterTimer, &QTimer::timeout, this,
            [this] { m_proxy->setFilterText(m_runFilter->text().trimmed()); });
    auto* runsPane = new QWidget;
    auto* runsLayout = new QVBoxLayout(runsPane);
    runsLayout->setContentsMargins(0, 0, 0, 0);
    runsLayout->setSpacing(2);
    runsLayout->addWidget(m_runFilter);
    runsLayout->addWidget(m_table, 1);

    auto* right = new QSplitter(Qt::Vertical);
    right->addWidget(runsPane);
    right->addWidget(m_tabs);
    right->setStretchFactor(0, 1);
    right->setStretchFactor(1, 3);
    right->setSizes({220, 660});
    auto* main = new QSplitter(Qt::Horizontal);
    main->addWidget(formScroll);
    main->addWidget(right);
    main->setStretchFactor(0, 0);
    main->setStretchFactor(1, 1);
    main->setSizes({320, 1080});

    // Training and serving are different jobs on the same workspace: one page each.
    m_models = new widgets::ModelsView;
    m_models->setObjectName(QStringLiteral("modelsView"));
    m_pages = new QTabWidget;
    m_pages->setObjectName(QStringLiteral("pageTabs"));
    m_pages->addTab(main, tr("Runs"));
    m_pages->addTab(m_models, tr("Models"));
    m_pages->setTabToolTip(0, tr("Configure, train and compare runs"));
    m_pages->setTabToolTip(1, tr("Registered models, deployments and serving dashboards"));
    // The SSH hosts runs can use: the run form's Target offers them.
    m_hosts = new widgets::HostsView;
    m_hosts->setObjectName(QStringLiteral("hostsView"));
    m_pages->addTab(m_hosts, tr("Hosts"));
    m_pages->setTabToolTip(2, tr("SSH hosts for runs across machines: add, check, trust their keys"));
    connect(m_hosts, &widgets::HostsView::hostsChanged, this, [this] {
        m_form->setHosts(m_hosts->listModel()->hosts());
        QStringList names;
        for (const auto& h : m_hosts->listModel()->hosts()) names << QString::fromStdString(h.name);
        m_models->setTargetHosts(names);
    });
    m_hosts->setStore(m_store.get());
    offerDataSets();
    // The workspace's versioned data sets and what was trained on each version; read (on its own
    // connection, off the GUI thread) when the page is shown.
    m_dataSets = new widgets::DataSetsView;
    m_dataSets->setObjectName(QStringLiteral("dataSetsView"));
    const int dataTab = m_pages->addTab(m_dataSets, tr("Data sets"));
    m_pages->setTabToolTip(dataTab, tr("Versioned data sets (lathectl data add) and their lineage: the runs "
                                       "trained on each version, their models and deployments"));
    m_dataSets->setWorkspace(QString::fromStdString(m_store->path()));
    connect(m_dataSets, &widgets::DataSetsView::refreshed, this,
            [this] { m_form->setDataSets(m_dataSets->dataSetNames()); });
    connect(m_dataSets, &widgets::DataSetsView::runRequested, this, [this](qint64 runId) {
        m_pages->setCurrentIndex(0);
        refreshRuns();  // a run trained by lathectl may not be listed yet
        selectRunsWhenRefreshed({runId});
    });
    connect(m_dataSets, &widgets::DataSetsView::modelRequested, this,
            [this](const QString& model, qint64 version) {
                m_pages->setCurrentWidget(m_models);
                m_models->selectModel(model, version);
            });
    // Hyper-parameter studies (lathectl tune); read like the data sets, when the page is shown.
    // Every trial is a run: trials selected there are selected in the runs table, which puts
    // their curves side by side on the Curves tab.
    m_studies = new widgets::StudiesView;
    m_studies->setObjectName(QStringLiteral("studiesView"));
    const int studiesTab = m_pages->addTab(m_studies, tr("Studies"));
    m_pages->setTabToolTip(studiesTab,
                           tr("Hyper-parameter studies (lathectl tune): their trials, the best so "
                              "far, parameters and their importance"));
    m_studies->setWorkspace(QString::fromStdString(m_store->path()));
    const auto selectTrialRuns = [this](const QList<qint64>& runIds) {
        refreshRuns();  // trials started by lathectl tune may not be listed yet
        selectRunsWhenRefreshed(std::vector<int64_t>(runIds.begin(), runIds.end()));
    };
    connect(m_studies, &widgets::StudiesView::runsSelected, this,
            [selectTrialRuns](const QList<qint64>& runIds) {
                // Nothing selected (another study, or a cleared selection): the runs table keeps its own.
                if (!runIds.isEmpty()) selectTrialRuns(runIds);
            });
    connect(m_studies, &widgets::StudiesView::runsOpened, this,
            [this, selectTrialRuns](const QList<qint64>& runIds) {
                m_pages->setCurrentIndex(0);
                selectTrialRuns(runIds);
            });
    // Studies started here run as `lathectl tune` processes; the page shows them as they go.
    m_studyProcs = std::make_unique<StudyProcesses>();
    connect(m_studies, &widgets::StudiesView::newStudyRequested, this, [this] { openStudyDialog(); });
    connect(m_studies, &widgets::StudiesView::stopStudyRequested, this, [this](const QString& name) {
        if (m_studyProcs->stop(name)) statusBar()->showMessage(tr("Stopping study %1…").arg(name));
    });
    connect(m_studies, &widgets::StudiesView::resumeStudyRequested, this, [this](const QString& name) {
        const QString error = m_studyProcs->resume(name, QString::fromStdString(m_store->path()));
        if (!error.isEmpty()) {
            showError(tr("Cannot resume the study"), error);
            return;
        }
        statusBar()->showMessage(tr("Resuming study %1…").arg(name), 8000);
    });
    connect(m_studyProcs.get(), &StudyProcesses::changed, this, [this] {
        m_studies->setActiveStudies(m_studyProcs->running(QString::fromStdString(m_store->path())));
        m_studies->refresh();
    });
    connect(m_studyProcs.get(), &StudyProcesses::finished, this,
            [this](const QString& name, int code, const QString& error) {
                if (code == 0)
                    statusBar()->showMessage(tr("Study %1 finished").arg(name), 10000);
                else if (code == 130)
                    statusBar()->showMessage(tr("Study %1 stopped: Resume continues it").arg(name), 10000);
                else
                    showError(tr("Study %1 failed").arg(name),
                              error.isEmpty() ? tr("lathectl tune exited with status %1").arg(code)
                                              : error.right(1500));
            });
    m_graphPage = new widgets::GraphView;
    m_graphPage->setObjectName(QStringLiteral("graphPage"));
    const int graphTab = m_pages->addTab(m_graphPage, tr("Graph"));
    m_pages->setTabToolTip(graphTab,
                           tr("A model's op graph: File → Open Model… or a registered version's Graph…"));
    setCentralWidget(m_pages);

    m_progress = new QLabel;
    statusBar()->addPermanentWidget(m_progress);
    m_progressBar = new QProgressBar;
    m_progressBar->setMaximumWidth(180);
    m_progressBar->setTextVisible(true);
    m_progressBar->hide();
    statusBar()->addPermanentWidget(m_progressBar);

    m_session = std::make_unique<TrainingSession>(*m_store);
    connectSession();
    connect(m_form, &widgets::RunForm::startRequested, this, &MainWindow::onStartRequested);
    connect(m_form, &widgets::RunForm::stopRequested, this, [this] {
        m_session->requestStop();
        statusBar()->showMessage(tr("Stopping after the current step…"));
    });
    connect(m_table->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &MainWindow::onSelectionChanged);
    connect(
        m_models, &widgets::ModelsView::deployRequested, this, [this](const QString& model, qint64 version) {
            if (!m_deploy || !m_deploy->deploy(model, version, m_models->deployHost()))
                showError(tr("Cannot deploy"), m_deploy
                                                   ? tr("Another deployment is in progress.")
                                                   : tr("The model registry of this workspace is not open."));
        });
    connect(m_models, &widgets::ModelsView::rollbackRequested, this,
            [this](const QString& model, qint64, qint64) {
                if (!m_deploy || !m_deploy->rollback(model))
                    showError(tr("Cannot roll back"),
                              m_deploy ? tr("Another deployment is in progress.")
                                       : tr("The model registry of this workspace is not open."));
            });
    connect(m_models, &widgets::ModelsView::compressRequested, this, &MainWindow::openCompressDialog);
    connect(m_models, &widgets::ModelsView::graphRequested, this,
            [this](const QString& model, qint64 version) { showModelGraph(model, version); });
    openRegistry();

    m_runsPool.setMaxThreadCount(1);
    m_refreshTimer = new QTimer(this);
    m_refreshTimer->setInterval(kRefreshMs);
    connect(m_refreshTimer, &QTimer::timeout, this, &MainWindow::refreshRuns);
    m_refreshTimer->start();

    buildMenus();
    updateTitle();
    resize(1400, 900);
    showNewStore({});
}

MainWindow::~MainWindow() {
    // The session, the views' loaders and the runs reader reference the store: end them
    // before the store goes.
    m_session.reset();
    m_deploy.reset();
    for (widgets::RunView* view : m_runViews) view->clear();
    stopRunsReads();
}

void MainWindow::addRunView(widgets::RunView* view, const QString& objectName) {
    QWidget* widget = view->widget();
    widget->setObjectName(objectName);
    const int tab = m_tabs->addTab(widget, view->tabTitle());
    m_tabs->setTabToolTip(tab, view->tabToolTip());
    m_runViews.push_back(view);
}

void MainWindow::buildMenus() {
    QMenu* file = menuBar()->addMenu(tr("&File"));
    QAction* open = file->addAction(tr("&Open workspace…"), this, &MainWindow::openWorkspaceDialog);
    open->setShortcut(QKeySequence::Open);
    QAction* openModel = file->addAction(tr("Open &Model…"), this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open model"), QString(),
                                                          tr("Models (*.pt *.pth *.onnx);;All files (*)"));
        if (!path.isEmpty()) openModelFile(path);
    });
    openModel->setShortcut(QKeySequence(tr("Ctrl+M")));
    QAction* exportAction = file->addAction(tr("&Export chart…"), this, &MainWindow::exportChartsDialog);
    exportAction->setShortcut(QKeySequence(tr("Ctrl+E")));
    file->addSeparator();
    QAction* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
    quit->setShortcut(QKeySequence::Quit);

    QMenu* run = menuBar()->addMenu(tr("&Run"));
    QAction* start = run->addAction(tr("&Start"), m_form->startButton(), &QAbstractButton::click);
    start->setShortcut(QKeySequence(tr("Ctrl+Return")));
    run->addAction(tr("S&top"), m_form->stopButton(), &QAbstractButton::click);
    run->addSeparator();
    QAction* refresh = run->addAction(tr("&Refresh runs"), this, &MainWindow::refreshRuns);
    refresh->setShortcut(QKeySequence::Refresh);
}

void MainWindow::connectSession() {
    connect(m_session.get(), &TrainingSession::started, this, &MainWindow::onStarted);
    connect(m_session.get(), &TrainingSession::eventsArrived, this, &MainWindow::onEvents);
    connect(m_session.get(), &TrainingSession::finished, this, &MainWindow::onFinished);
    connect(m_session.get(), &TrainingSession::progress, this, [this](const QString& text) {
        m_progress->setText(text);
        statusBar()->showMessage(text);
    });
}

void MainWindow::openRegistry() {
    m_deploy.reset();
    m_registry.reset();
    try {
        m_registry = std::make_shared<core::Registry>(m_store->path());
    } catch (const std::exception& e) {
        m_models->setRegistry(nullptr);
        m_models->setStatusText(tr("Could not open the model registry: %1").arg(QString::fromUtf8(e.what())),
                                true);
        showError(tr("Cannot open the model registry"), QString::fromUtf8(e.what()));
        return;
    }
    m_deploy = std::make_unique<DeploySession>(m_registry);
    // Deployments on the workspace's hosts: reached by name through the inventory, over SSH.
    m_deploy->setServerHosts(
        [store = m_store.get()](const std::string& target) -> std::shared_ptr<core::ServerHost> {
            if (target.rfind("ssh:", 0) != 0)
                throw core::ConfigError("unknown deployment target '" + target + "'");
            const std::string name = target.substr(4);
            const auto rec = store->host(name);
            if (!rec)
                throw core::ConfigError(
                    "host '" + name +
                    "' is not among the workspace's hosts (any more); add it on the Hosts page");
            return remote::sshServerHost(rec->name, remote::hostSpecFor(*rec), rec->lathectl);
        });
    connectDeploySession();
    // Rollouts run their controller as a detached lathectl, reaching hosts as deployments do.
    m_models->rolloutView()->setControllerProgram(QString::fromStdString(m_deploy->serverProgram()));
    m_models->rolloutView()->setServerHosts(m_deploy->serverHosts());
    m_models->setRegistry(m_registry);
}

widgets::CompressDialog* MainWindow::compressDialog() const { return m_compressDialog.data(); }

void MainWindow::openModelFile(const QString& path, const QString& title) {
    m_pages->setCurrentWidget(m_graphPage);
    m_graphPage->openFile(path, title);
}

bool MainWindow::showModelGraph(const QString& model, qint64 version) {
    if (!m_registry) {
        showError(tr("Cannot show the graph"), tr("The model registry of this workspace is not open."));
        return false;
    }
    try {
        const auto v =
            m_registry->resolve(core::parseModelRef(model.toStdString() + ":" + std::to_string(version)));
        openModelFile(QString::fromStdString(v.path), QStringLiteral("%1:%2").arg(model).arg(version));
        return true;
    } catch (const std::exception& e) {
        showError(tr("Cannot show the graph"), QString::fromUtf8(e.what()));
        return false;
    }
}

widgets::StudyDialog* MainWindow::studyDialog() const { return m_studyDialog.data(); }

widgets::StudyDialog* MainWindow::openStudyDialog() {
    if (!m_form->isValid()) {
        showError(tr("Cannot start a study"),
                  tr("The run form has errors: a study tunes the run form's configuration, so fix them on "
                     "the Runs page first."));
        return nullptr;
    }
    auto* dialog = new widgets::StudyDialog(m_form->spec(), m_studies->studyNames(), this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &QDialog::accepted, this, [this, dialog] {
        const auto study = dialog->study();
        const QString name = QString::fromStdString(study.name);
        const QString error =
            m_studyProcs->startNew(name, QString::fromStdString(study.baseConfig), dialog->tuneArguments(),
                                   QString::fromStdString(m_store->path()));
        if (!error.isEmpty()) {
            showError(tr("Cannot start the study"), error);
            return;
        }
        statusBar()->showMessage(tr("Study %1 started").arg(name), 8000);
        m_pages->setCurrentWidget(m_studies);
        // Selected once its first read lists it.
        auto once = std::make_shared<QMetaObject::Connection>();
        *once = connect(m_studies, &widgets::StudiesView::refreshed, this, [this, name, once] {
            if (!m_studies->studyNames().contains(name)) return;
            m_studies->selectStudy(name);
            disconnect(*once);
        });
    });
    m_studyDialog = dialog;
    dialog->show();
    return dialog;
}

widgets::CompressDialog* MainWindow::openCompressDialog(const QString& model, qint64 version) {
    if (!m_registry) {
        showError(tr("Cannot compress"), tr("The model registry of this workspace is not open."));
        return nullptr;
    }
    // The worker thread opens its own read connection to the runs (the parent run's data and
    // seed); the registry is shared (thread-safe).
    const std::shared_ptr<core::Registry> registry = m_registry;
    const std::string path = m_store->path();
    const core::ModelRef ref{model.toStdString(), version, {}};
    auto runner = [registry, path, ref](const widgets::CompressRequest& request,
                                        const core::CompressControl& control) {
        core::Store store(path);
        if (request.method == "prune") return core::pruneModel(*registry, store, ref, request.prune, control);
        if (request.method == "distill") {
            auto options = request.distill;
            options.teacher = ref;
            return core::distillModel(*registry, store, options, control);
        }
        return core::quantizeModel(*registry, &store, ref, request.quantize, control);
    };
    auto* dialog = new widgets::CompressDialog(model, version, runner, this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &widgets::CompressDialog::compressed, this, [this](const QString& name, qint64 v) {
        statusBar()->showMessage(tr("Registered %1 v%2").arg(name).arg(v), 8000);
        m_models->refresh();
    });
    m_compressDialog = dialog;
    dialog->show();
    return dialog;
}

void MainWindow::connectDeploySession() {
    connect(m_deploy.get(), &DeploySession::started, this,
            [this](const QString& action, const QString& model) {
                const QString text = action == QLatin1String("rollback") ? tr("Rolling back %1…").arg(model)
                                                                         : tr("Deploying %1…").arg(model);
                m_models->setBusy(true, text);
                statusBar()->showMessage(text);
            });
    connect(m_deploy.get(), &DeploySession::progress, this, [this](const QString& text) {
        m_models->setStatusText(text);
        statusBar()->showMessage(text);
    });
    connect(m_deploy.get(), &DeploySession::finished, this, &MainWindow::onDeployFinished);
}

void MainWindow::onDeployFinished(const DeployOutcome& outcome) {
    m_models->setBusy(false);
    m_models->refresh();
    m_models->dashboard()->pollNow();
    const bool rollback = outcome.action == QLatin1String("rollback");
    if (!outcome.ok()) {
        const QString what = rollback
                                 ? tr("Rollback of %1 failed").arg(outcome.model)
                                 : tr("Deployment of %1 v%2 failed").arg(outcome.model).arg(outcome.version);
        m_models->setStatusText(what + QStringLiteral(": ") + outcome.error, true);
        showError(what, outcome.error);
        return;
    }
    QString text = tr("%1 v%2 live at %3").arg(outcome.model).arg(outcome.version).arg(outcome.url);
    if (outcome.target.startsWith(QLatin1String("ssh:"))) text += tr(" on %1").arg(outcome.target.mid(4));
    if (outcome.previousVersion > 0 && outcome.previousVersion != outcome.version)
        text += rollback ? tr(" (rolled back from v%1)").arg(outcome.previousVersion)
                         : tr(" (replaced v%1)").arg(outcome.previousVersion);
    text += outcome.started ? tr(", new server") : tr(", hot swap");
    m_models->setStatusText(text);
    statusBar()->showMessage(text, 10000);
}

void MainWindow::updateTitle() {
    setWindowTitle(tr("Lathe — %1").arg(QString::fromStdString(m_store->path())));
}

void MainWindow::refreshRuns() {
    ++m_runsAsked;
    if (!m_runsReading) startRunsRead();  // else the read in flight starts one more when it lands
}

void MainWindow::startRunsRead() {
    m_runsReading = true;
    const uint64_t answers = m_runsAsked;
    const uint64_t generation = m_runsGeneration.load();
    const core::Store* store = m_store.get();
    // The store is thread-safe and outlives the task: stopRunsReads() waits for the pool before
    // it goes. A queued call to a deleted window is discarded by Qt.
    m_runsPool.start([this, store, answers, generation] {
        if (m_runsGeneration.load() != generation) return;
        auto read = std::make_shared<RunsRead>();
        read->answers = answers;
        try {
            read->runs = store->listRuns();
            read->valAccuracy = store->lastMetricOfRuns("val/accuracy");  // one query for every run
        } catch (const std::exception& e) {
            read->error = e.what();
        }
        if (m_runsGeneration.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, read] { applyRunsRead(generation, read); }, Qt::QueuedConnection);
    });
}

void MainWindow::applyRunsRead(uint64_t generation, const std::shared_ptr<RunsRead>& read) {
    if (generation != m_runsGeneration.load()) return;  // read from a store since closed
    m_runsReading = false;
    m_runsLanded = read->answers;
    std::vector<std::function<void()>> due;
    for (auto it = m_afterRuns.begin(); it != m_afterRuns.end();) {
        if (it->first <= read->answers) {
            due.push_back(std::move(it->second));
            it = m_afterRuns.erase(it);
        } else {
            ++it;
        }
    }
    if (read->error.empty()) {
        const int before = m_runModel->rowCount();
        m_runModel->setRuns(std::move(read->runs), std::move(read->valAccuracy));
        // Fit the columns to real content once rows arrive, not on every refresh: a user's
        // manual column widths survive the periodic refresh.
        if (m_runModel->rowCount() != before)
            for (int c = 0; c < widgets::RunListModel::ColumnCount - 1; ++c)
                m_table->resizeColumnToContents(c);
        for (auto& then : due) then();
    } else {
        statusBar()->showMessage(tr("Could not read the runs: %1").arg(QString::fromStdString(read->error)));
    }
    Q_EMIT runsRefreshed();
    // Asked again meanwhile (or by what just ran): one more read answers all of those calls.
    if (!m_runsReading && m_runsAsked > m_runsLanded) startRunsRead();
}

void MainWindow::whenRefreshed(std::function<void()> then) {
    if (!isRefreshingRuns()) {
        then();
        return;
    }
    m_afterRuns.emplace_back(m_runsAsked, std::move(then));
}

void MainWindow::stopRunsReads() {
    ++m_runsGeneration;
    m_runsPool.waitForDone();
    m_runsReading = false;
    m_runsLanded = m_runsAsked;
    m_afterRuns.clear();
}

void MainWindow::showNewStore(const QString& openedPath) {
    refreshRuns();
    // Where one left off: the newest run and its curves.
    const uint64_t asked = ++m_selectionAsked;
    whenRefreshed([this, asked, openedPath] {
        if (asked == m_selectionAsked) selectNewestRun();
        const int runs = m_runModel->rowCount();
        statusBar()->showMessage(openedPath.isEmpty()
                                     ? tr("%n run(s) in this workspace", nullptr, runs)
                                     : tr("Opened %1 (%n run(s))", nullptr, runs).arg(openedPath),
                                 5000);
    });
}

std::vector<int64_t> MainWindow::selectedRuns() const {
    std::vector<int64_t> ids;
    for (const QModelIndex& idx : m_table->selectionModel()->selectedRows())
        ids.push_back(idx.data(widgets::RunListModel::RunIdRole).toLongLong());
    std::sort(ids.begin(), ids.end());
    return ids;
}

void MainWindow::selectRuns(const std::vector<int64_t>& runIds) {
    QItemSelection selection;
    for (int64_t id : runIds) {
        const int row = m_runModel->rowOfRun(id);
        if (row < 0) continue;
        const QModelIndex src = m_runModel->index(row, 0);
        const QModelIndex idx = m_proxy->mapFromSource(src);
        selection.select(idx, idx.siblingAtColumn(widgets::RunListModel::ColumnCount - 1));
    }
    m_table->selectionModel()->select(selection,
                                      QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    if (!selection.isEmpty()) m_table->scrollTo(selection.indexes().first());
}

void MainWindow::selectRunsWhenRefreshed(const std::vector<int64_t>& runIds) {
    const uint64_t asked = ++m_selectionAsked;
    whenRefreshed([this, asked, runIds] {
        if (asked == m_selectionAsked) selectRuns(runIds);
    });
}

void MainWindow::selectNewestRun() {
    // Reopening a workspace shows where one left off: the latest run and its curves.
    int64_t newest = 0;
    for (int row = 0; row < m_runModel->rowCount(); ++row)
        newest = std::max(newest, m_runModel->runIdAt(row));
    if (newest > 0) selectRuns({newest});
}

void MainWindow::onSelectionChanged() {
    const std::vector<int64_t> runs = selectedRuns();
    QString error;  // one message, and the other views still follow
    for (widgets::RunView* view : m_runViews) {
        try {
            view->showRuns(*m_store, runs);
        } catch (const std::exception& e) {
            if (error.isEmpty()) error = QString::fromUtf8(e.what());
        }
    }
    if (!error.isEmpty()) showError(tr("Could not load metrics"), error);
}

void MainWindow::onStartRequested(const core::RunSpec& spec) {
    const widgets::RunTarget target = m_form->target();
    if (!m_session->start(spec, target)) {
        statusBar()->showMessage(tr("A run is already in progress."), 5000);
        return;
    }
    m_form->setRunning(true);
    m_progress->setText(tr("starting…"));
    if (target.isLocal())
        statusBar()->showMessage(tr("Starting run on %1…").arg(QString::fromStdString(spec.data)));
    else
        statusBar()->showMessage(
            tr("Starting run on %1 across %2…")
                .arg(QString::fromStdString(spec.data), QString::fromStdString(target.placement())));
}

void MainWindow::onStarted(qint64 runId) {
    if (m_liveRunId != 0 && m_liveRunId != runId)
        for (widgets::RunView* view : m_runViews) view->forgetLive(m_liveRunId);
    m_liveRunId = runId;
    refreshRuns();
    // Show the new run on its own once its row is read: its live curves are what the user
    // wants to watch now (the views keep its live points until it is selected).
    selectRunsWhenRefreshed({runId});
    statusBar()->showMessage(tr("Run %1 training").arg(runId));
}

void MainWindow::onEvents(qint64 runId, const std::vector<core::Event>& events) {
    for (widgets::RunView* view : m_runViews) view->onEvents(runId, events);
    // Status events carry the planned number of steps; metric steps then give the progress.
    int64_t step = -1;
    for (const auto& e : events) {
        if (e.type == core::Event::Type::Status && e.value > 0) {
            m_progressBar->setRange(0, int(std::min<double>(e.value, 2e9)));
            m_progressBar->show();
        }
        if (e.type == core::Event::Type::Metric) step = std::max(step, e.step);
    }
    if (step >= 0 && m_progressBar->maximum() > 0)
        m_progressBar->setValue(int(std::min<int64_t>(step, m_progressBar->maximum())));
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
        if (it->type == core::Event::Type::Metric) {
            m_progress->setText(tr("run %1 · step %2 · %3 %4")
                                    .arg(runId)
                                    .arg(it->step)
                                    .arg(QString::fromStdString(it->key))
                                    .arg(it->value, 0, 'g', 4));
            break;
        }
    }
    for (const auto& e : events) {
        if (e.type == core::Event::Type::Error) statusBar()->showMessage(QString::fromStdString(e.text));
    }
}

void MainWindow::onFinished(qint64 runId, const QString& status, const QString& error) {
    m_form->setRunning(false);
    m_progressBar->hide();
    m_progressBar->setRange(0, 0);
    refreshRuns();
    // Only now does the store hold all of the run (the profile re-reads it).
    if (runId)
        for (widgets::RunView* view : m_runViews) view->onRunFinished(*m_store, runId);
    m_progress->setText(runId ? tr("run %1 %2").arg(runId).arg(status) : QString());
    if (status == QLatin1String("failed")) {
        const QString what = runId ? tr("Run %1 failed").arg(runId) : tr("The run could not start");
        showError(what, error.isEmpty() ? tr("No error message was recorded.") : error);
    } else if (runId == 0) {
        // Stopped while the hosts were being checked: no run was created.
        statusBar()->showMessage(
            tr("The run was not started%1").arg(error.isEmpty() ? QString() : QStringLiteral(": ") + error),
            10000);
    } else {
        statusBar()->showMessage(tr("Run %1 %2").arg(runId).arg(status), 10000);
    }
}

void MainWindow::showError(const QString& title, const QString& message) {
    m_lastError = message;
    statusBar()->showMessage(title + QStringLiteral(": ") + message);
    // Window-modal but not blocking, so a failing run never stalls the event loop.
    auto* box = new QMessageBox(QMessageBox::Warning, title, message, QMessageBox::Ok, this);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->open();
}

bool MainWindow::openWorkspace(const QString& path) {
    if (m_session->isRunning()) {
        showError(tr("Cannot switch workspace"), tr("Stop the current run first."));
        return false;
    }
    if (m_deploy && m_deploy->isBusy()) {
        showError(tr("Cannot switch workspace"), tr("Wait for the deployment in progress to finish."));
        return false;
    }
    std::unique_ptr<core::Store> next;
    try {
        next = std::make_unique<core::Store>(path.toStdString());
    } catch (const std::exception& e) {
        showError(tr("Cannot open workspace"), tr("%1: %2").arg(path, QString::fromUtf8(e.what())));
        return false;
    }
    m_session.reset();
    // The runs reader and the views' loaders read the old store: wait for them before it goes.
    stopRunsReads();
    m_runModel->setRuns({});  // the views follow the empty selection
    for (widgets::RunView* view : m_runViews) {
        view->clear();
        if (m_liveRunId) view->forgetLive(m_liveRunId);
    }
    m_liveRunId = 0;
    m_hosts->setStore(nullptr);
    m_store = std::move(next);
    m_session = std::make_unique<TrainingSession>(*m_store);
    connectSession();
    openRegistry();
    m_hosts->setStore(m_store.get());
    offerDataSets();
    m_dataSets->setWorkspace(QString::fromStdString(m_store->path()));
    m_studies->setWorkspace(QString::fromStdString(m_store->path()));
    m_studies->setActiveStudies(m_studyProcs->running(QString::fromStdString(m_store->path())));
    updateTitle();
    showNewStore(path);
    return true;
}

void MainWindow::offerDataSets() {
    QStringList names;
    try {
        for (const auto& v : core::DataSets(m_store->path()).list()) names << QString::fromStdString(v.name);
    } catch (const std::exception&) {  // a workspace that cannot be read says so elsewhere
    }
    m_form->setDataSets(names);
}

void MainWindow::openWorkspaceDialog() {
    const QString path = QFileDialog::getSaveFileName(
        this, tr("Open or create a workspace"),
        QFileInfo(QString::fromStdString(m_store->path())).absolutePath(),
        tr("Lathe workspace (*.db);;All files (*)"), nullptr, QFileDialog::DontConfirmOverwrite);
    if (!path.isEmpty()) openWorkspace(path);
}

void MainWindow::exportChartsDialog() {
    QString selected;
    QString path = QFileDialog::getSaveFileName(this, tr("Export charts"), QStringLiteral("lathe-charts.png"),
                                                tr("PNG image (*.png);;PDF document (*.pdf)"), &selected);
    if (path.isEmpty()) return;
    if (QFileInfo(path).suffix().isEmpty())
        path += selected.contains(QLatin1String("pdf")) ? QStringLiteral(".pdf") : QStringLiteral(".png");
    if (m_dashboard->exportCharts(path))
        statusBar()->showMessage(tr("Saved %1").arg(path), 5000);
    else
        showError(tr("Export failed"), tr("Could not write %1.").arg(path));
}

void MainWindow::closeEvent(QCloseEvent* event) {
    if (!m_studyProcs->running(QString::fromStdString(m_store->path())).isEmpty()) {
        // Their trials stop with their runs, recorded: Resume (or lathectl tune --resume) continues.
        statusBar()->showMessage(tr("Stopping the studies…"));
        m_studyProcs->stopAll();
    }
    if (m_session->isRunning()) {
        statusBar()->showMessage(tr("Stopping the run…"));
        m_session->stopAndWait();
    }
    if (m_deploy && m_deploy->isBusy()) {
        // The server is being started or swapped: let it end ready (and recorded) or untouched.
        statusBar()->showMessage(tr("Waiting for the deployment to finish…"));
        m_deploy->wait();
    }
    event->accept();
}

}  // namespace lathe::app

#include "lathe/widgets/studies_view.h"

#include <QDateTime>
#include <QFont>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QMetaObject>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QStackedWidget>
#include <QStandardItemModel>
#include <QTabWidget>
#include <QTableView>
#include <QTimer>
#include <QTreeWidget>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "study_charts.h"

namespace lathe::widgets {

namespace {

// A running study gains trials every few seconds to minutes: this often is enough to follow it.
constexpr int kPollMs = 5000;

QString q(const std::string& s) { return QString::fromStdString(s); }

QString timeText(double secs) {
    if (secs <= 0) return {};
    return QDateTime::fromMSecsSinceEpoch(qint64(secs * 1000.0)).toString(QStringLiteral("yyyy-MM-dd hh:mm"));
}

QString durationText(double secs) {
    // Trials forked from the study's server often take well under a second: tenths below 10 s.
    if (secs < 9.95) return QObject::tr("%1 s").arg(std::max(0.0, secs), 0, 'f', 1);
    const qint64 s = qint64(std::llround(secs));
    if (s < 60) return QObject::tr("%1 s").arg(s);
    if (s < 3600) return QObject::tr("%1 m %2 s").arg(s / 60).arg(s % 60, 2, 10, QLatin1Char('0'));
    return QObject::tr("%1 h %2 m").arg(s / 3600).arg((s % 3600) / 60, 2, 10, QLatin1Char('0'));
}

QJsonObject settingsOf(const core::StudyRecord& study) {
    return QJsonDocument::fromJson(QByteArray::fromStdString(study.settings)).object();
}

// How many trials the study asked for (settings "trials"); what it has when it did not say.
int64_t plannedTrials(const core::StudyRecord& study) {
    const qint64 planned = settingsOf(study).value(QStringLiteral("trials")).toInteger(0);
    return planned > 0 ? std::max<int64_t>(planned, study.trialsTotal) : study.trialsTotal;
}

QString algorithmText(const core::StudyRecord& study) {
    return study.pruner.empty() || study.pruner == "none"
               ? q(study.sampler)
               : QStringLiteral("%1 + %2").arg(q(study.sampler), q(study.pruner));
}

QString objectiveText(const core::StudyRecord& study) {
    return QStringLiteral("%1 %2").arg(q(study.direction), q(study.objective));
}

bool parseNumber(const std::string& text, double& out) {
    if (text.empty()) return false;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (*end != '\0' || !std::isfinite(v)) return false;
    out = v;
    return true;
}

// What a re-read compares to skip redrawing an unchanged study (a running study is re-read
// every few seconds; redrawing would reset zoom and hover for nothing).
std::string fingerprint(const StudyDetail& d) {
    std::ostringstream out;
    out.precision(17);
    out << d.study.id << '|' << d.study.name << '|' << d.study.status << '|' << d.study.updatedAt << '|'
        << d.study.space.size();
    for (const auto& t : d.trials) {
        out << ';' << t.number << ',' << int(t.state) << ',' << t.runId << ',' << t.endedAt << ','
            << t.rungs.size() << ',' << t.prunedAt << ',' << (t.value ? *t.value : std::nan(""));
        // A running trial's duration grows: shown as of this read.
        if (t.state == core::TrialState::Running) out << ',' << t.startedAt;
    }
    for (const auto& s : d.ppo) out << ';' << s.runId << ',' << s.lr.size() << ',' << s.batch.size();
    return out.str();
}

}  // namespace

// Sorts by SortRole: numbers as numbers, text as text, and an empty cell (a failed trial's value,
// a trial without a run yet) last in either order.
class TrialSortProxy : public QSortFilterProxyModel {
public:
    using QSortFilterProxyModel::QSortFilterProxyModel;

protected:
    bool lessThan(const QModelIndex& left, const QModelIndex& right) const override {
        const QVariant l = left.data(StudiesView::SortRole), r = right.data(StudiesView::SortRole);
        const bool ascending = sortOrder() == Qt::AscendingOrder;
        if (!l.isValid() || !r.isValid()) {
            if (l.isValid() == r.isValid()) return tieBreak(left, right);
            // The sort reverses lessThan when descending: an empty cell is "greatest" ascending
            // and "least" descending, so it ends up last both ways.
            return ascending ? l.isValid() : !l.isValid();
        }
        const bool ln = l.typeId() == QMetaType::Double, rn = r.typeId() == QMetaType::Double;
        if (ln && rn) {
            if (l.toDouble() != r.toDouble()) return l.toDouble() < r.toDouble();
            return tieBreak(left, right);
        }
        if (ln != rn) return ln;  // numbers before text
        const int c = QString::compare(l.toString(), r.toString(), Qt::CaseInsensitive);
        return c != 0 ? c < 0 : tieBreak(left, right);
    }

private:
    // Equal cells keep the trials' order (by number, in the sort's direction).
    bool tieBreak(const QModelIndex& left, const QModelIndex& right) const {
        return left.data(StudiesView::TrialNumberRole).toLongLong() <
               right.data(StudiesView::TrialNumberRole).toLongLong();
    }
};

// The workspace's studies and store, opened on first use; only ever used from the pool's thread.
struct StudiesView::Source {
    std::string path;
    std::unique_ptr<core::Studies> studies;
    std::unique_ptr<core::Store> store;  // PPO studies' metrics only
    core::Studies& openStudies() {
        if (!studies) studies = std::make_unique<core::Studies>(path);
        return *studies;
    }
    core::Store& openStore() {
        if (!store) store = std::make_unique<core::Store>(path);
        return *store;
    }
};

struct StudiesView::ListRead {
    std::vector<core::StudyRecord> studies;
    std::string error;
    uint64_t sequence = 0;  // which read this is (m_readsStarted when it began)
};

StudiesView::StudiesView(QWidget* parent) : QWidget(parent) {
    // One thread: Studies is safe from one thread at a time.
    m_pool.setMaxThreadCount(1);

    m_list = new QTreeWidget(this);
    m_list->setObjectName(QStringLiteral("studiesList"));
    m_list->setColumnCount(StudyColumnCount);
    m_list->setHeaderLabels(
        {tr("Study"), tr("Algorithm"), tr("Objective"), tr("Trials"), tr("Best"), tr("Status")});
    m_list->setRootIsDecorated(false);
    m_list->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_list->setSelectionMode(QAbstractItemView::SingleSelection);
    m_list->setAlternatingRowColors(true);
    m_list->setUniformRowHeights(true);
    m_list->setAllColumnsShowFocus(true);
    m_list->setWordWrap(false);
    m_list->header()->setStretchLastSection(true);
    m_list->setToolTip(tr("Select a study to see its trials"));

    m_studyLabel = new QLabel(this);
    m_studyLabel->setObjectName(QStringLiteral("studySummary"));
    m_studyLabel->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_studyLabel->setWordWrap(true);

    m_model = new QStandardItemModel(this);
    m_proxy = new TrialSortProxy(this);
    m_proxy->setSourceModel(m_model);
    m_table = new QTableView(this);
    m_table->setObjectName(QStringLiteral("trialsTable"));
    m_table->setModel(m_proxy);
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(ColNumber, Qt::AscendingOrder);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setAlternatingRowColors(true);
    m_table->setWordWrap(false);
    m_table->verticalHeader()->setVisible(false);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->setToolTip(
        tr("Select trials to compare their curves on the Runs page; double-click to go there"));

    m_history = new StudyHistoryChart(this);
    m_parallel = new ParallelCoordinatesChart(this);
    m_importance = new ImportanceChart(this);
    m_ppo = new PpoChoicesChart(this);
    m_charts = new QTabWidget(this);
    m_charts->setObjectName(QStringLiteral("studyCharts"));
    m_charts->addTab(m_history, tr("Best so far"));
    m_charts->addTab(m_parallel, tr("Parallel coordinates"));
    m_charts->addTab(m_importance, tr("Importance"));
    m_charts->addTab(m_ppo, tr("PPO choices"));
    m_charts->setTabToolTip(0, tr("Each trial's value by trial number, and the best so far"));
    m_charts->setTabToolTip(1, tr("Each trial's parameters as a line across one axis per parameter, "
                                  "coloured by its value"));
    m_charts->setTabToolTip(2, tr("How much of the objective's variation each parameter explains "
                                  "(complete trials)"));
    m_charts->setTabToolTip(3, tr("The learning rate and batch size the PPO agent chose while each trial "
                                  "trained (ppo/lr, ppo/batch)"));
    m_charts->setTabVisible(3, false);

    auto* detail = new QSplitter(Qt::Horizontal, this);
    detail->addWidget(m_table);
    detail->addWidget(m_charts);
    detail->setStretchFactor(0, 1);
    detail->setStretchFactor(1, 1);
    detail->setChildrenCollapsible(false);
    auto* lower = new QWidget(this);
    auto* lowerLayout = new QVBoxLayout(lower);
    lowerLayout->setContentsMargins(0, 0, 0, 0);
    lowerLayout->addWidget(m_studyLabel);
    lowerLayout->addWidget(detail, 1);
    auto* split = new QSplitter(Qt::Vertical, this);
    split->addWidget(m_list);
    split->addWidget(lower);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 4);
    split->setChildrenCollapsible(false);

    m_empty = new QLabel(this);
    m_empty->setObjectName(QStringLiteral("studiesEmpty"));
    m_empty->setAlignment(Qt::AlignCenter);
    m_empty->setWordWrap(true);
    m_empty->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_empty->setText(
        tr("<p>No studies in this workspace yet.</p>"
           "<p>A study searches hyper-parameters over many runs: start one with <b>New study…</b> "
           "(it tunes the run form's configuration) or<br>"
           "<code>lathectl tune</code> (see <code>lathectl tune --help</code>).</p>"
           "<p>Each trial is an ordinary run: it shows on the Runs page too.</p>"));

    m_stack = new QStackedWidget(this);
    m_stack->addWidget(split);
    m_stack->addWidget(m_empty);

    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("studiesStatus"));
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_refresh = new QPushButton(tr("Refresh"), this);
    m_refresh->setObjectName(QStringLiteral("refreshStudiesButton"));
    m_refresh->setToolTip(tr("Re-read the studies of this workspace (lathectl tune changes them)"));
    m_refresh->setEnabled(false);

    m_new = new QPushButton(tr("New study…"), this);
    m_new->setObjectName(QStringLiteral("newStudyButton"));
    m_new->setToolTip(tr("Search hyper-parameters of the run form's configuration: a study of many runs"));
    m_new->setEnabled(false);
    m_stop = new QPushButton(tr("Stop"), this);
    m_stop->setObjectName(QStringLiteral("stopStudyButton"));
    m_stop->setToolTip(tr("Stop the selected study: its running trials stop and can be resumed"));
    m_stop->setEnabled(false);
    m_resume = new QPushButton(tr("Resume"), this);
    m_resume->setObjectName(QStringLiteral("resumeStudyButton"));
    m_resume->setToolTip(
        tr("Continue the selected study (lathectl tune --resume): finished trials are "
           "kept, interrupted ones continue from their checkpoints"));
    m_resume->setEnabled(false);
    connect(m_new, &QPushButton::clicked, this, &StudiesView::newStudyRequested);
    connect(m_stop, &QPushButton::clicked, this, [this] {
        if (!selectedStudy().isEmpty()) Q_EMIT stopStudyRequested(selectedStudy());
    });
    connect(m_resume, &QPushButton::clicked, this, [this] {
        if (!selectedStudy().isEmpty()) Q_EMIT resumeStudyRequested(selectedStudy());
    });

    auto* buttons = new QHBoxLayout;
    buttons->setContentsMargins(4, 2, 4, 2);
    buttons->addWidget(m_status, 1);
    buttons->addWidget(m_new);
    buttons->addWidget(m_stop);
    buttons->addWidget(m_resume);
    buttons->addWidget(m_refresh);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addLayout(buttons);
    layout->addWidget(m_stack, 1);

    m_poll = new QTimer(this);
    m_poll->setInterval(kPollMs);
    connect(m_poll, &QTimer::timeout, this, [this] {
        if (isVisible() && m_anyRunning && !m_refreshing) refresh();
    });
    m_poll->start();

    connect(m_refresh, &QPushButton::clicked, this, &StudiesView::refresh);
    connect(m_list->selectionModel(), &QItemSelectionModel::selectionChanged, this, [this] {
        loadStudy(false);
        updateControls();
    });
    connect(m_table->selectionModel(), &QItemSelectionModel::selectionChanged, this,
            &StudiesView::onTrialSelectionChanged);
    connect(m_table, &QTableView::doubleClicked, this, [this](const QModelIndex& index) {
        QList<qint64> runs = selectedRunIds();
        const qint64 clicked = index.data(RunIdRole).toLongLong();
        if (clicked > 0 && !runs.contains(clicked)) runs = {clicked};
        if (!runs.isEmpty()) Q_EMIT runsOpened(runs);
    });
    m_stack->setCurrentWidget(m_empty);
    clearStudy({});
}

StudiesView::~StudiesView() {
    ++m_generation;
    m_pool.waitForDone();
}

void StudiesView::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    refresh();  // studies started with lathectl meanwhile
}

void StudiesView::setWorkspace(const QString& path) {
    ++m_generation;
    m_path = path;
    m_source.reset();
    if (!path.isEmpty()) {
        m_source = std::make_shared<Source>();
        m_source->path = path.toStdString();
    }
    m_refreshing = false;
    m_refreshAgain = false;
    m_studyLoading = false;
    m_selectedOnce = false;
    m_anyRunning = false;
    m_endedAt.clear();
    {
        const QSignalBlocker block(m_list->selectionModel());
        m_list->clear();
    }
    m_shownStudy.clear();
    ++m_studyRequest;
    clearStudy({});
    // The empty state only once a read says so (no flash of it while the first read runs).
    m_stack->setCurrentIndex(m_source ? 0 : 1);
    setStatusText(m_source ? tr("Reading the studies…") : QString());
    m_refresh->setEnabled(m_source != nullptr);
    updateControls();
    if (isVisible()) refresh();
}

void StudiesView::refresh() {
    if (!m_source) return;
    if (m_refreshing) {
        m_refreshAgain = true;
        return;
    }
    m_refreshing = true;
    m_refreshAgain = false;
    const uint64_t generation = m_generation.load();
    const uint64_t sequence = ++m_readsStarted;
    // `this` outlives the task (the destructor waits); the source is shared with it.
    m_pool.start([this, source = m_source, generation, sequence] {
        if (m_generation.load() != generation) return;
        auto read = std::make_shared<ListRead>();
        read->sequence = sequence;
        try {
            read->studies = source->openStudies().list();
        } catch (const std::exception& e) {
            read->error = e.what();
        }
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, read] { applyRefresh(generation, read); }, Qt::QueuedConnection);
    });
}

void StudiesView::applyRefresh(uint64_t generation, const std::shared_ptr<ListRead>& read) {
    if (generation != m_generation.load()) return;
    m_refreshing = false;
    ++m_refreshCount;
    if (!read->error.empty()) {
        setStatusText(tr("Could not read the studies: %1").arg(q(read->error)), true);
    } else {
        // A read begun after a study's process ended shows that study's final status.
        for (auto it = m_endedAt.begin(); it != m_endedAt.end();)
            it = it.value() < read->sequence ? m_endedAt.erase(it) : std::next(it);
        const QString selected = selectedStudy();
        QTreeWidgetItem* pick = nullptr;
        int running = 0;
        {
            const QSignalBlocker block(m_list->selectionModel());
            const bool firstFill = m_list->topLevelItemCount() == 0;
            m_list->clear();
            for (const auto& s : read->studies) {
                auto* row = new QTreeWidgetItem(m_list);
                const QString name = q(s.name);
                row->setData(0, StudyNameRole, name);
                row->setText(ColStudy, name);
                QStringList space;
                for (const auto& e : s.space) space << q(e);
                row->setToolTip(
                    ColStudy,
                    tr("created %1\nspace: %2").arg(timeText(s.createdAt), space.join(QStringLiteral(", "))));
                row->setText(ColAlgorithm, algorithmText(s));
                row->setText(ColObjective, objectiveText(s));
                const int64_t done = s.complete + s.pruned + s.failed;
                row->setText(ColTrials, QStringLiteral("%1/%2").arg(done).arg(plannedTrials(s)));
                row->setToolTip(ColTrials, tr("%1 complete, %2 pruned, %3 failed, %4 running")
                                               .arg(s.complete)
                                               .arg(s.pruned)
                                               .arg(s.failed)
                                               .arg(s.running));
                row->setTextAlignment(ColTrials, Qt::AlignRight);
                if (s.bestValue) {
                    row->setText(ColBest, tr("%1 (trial %2)").arg(valueText(*s.bestValue)).arg(s.bestTrial));
                    row->setData(ColBest, Qt::UserRole, *s.bestValue);
                }
                row->setText(ColStatus, q(s.status));
                if (s.status == "running") {
                    ++running;
                    QFont bold = row->font(ColStatus);
                    bold.setBold(true);
                    row->setFont(ColStatus, bold);
                }
                if (name == selected) pick = row;
            }
            if (!pick && !m_selectedOnce && m_list->topLevelItemCount() > 0) pick = m_list->topLevelItem(0);
            if (pick) {
                m_selectedOnce = true;
                m_list->setCurrentItem(pick);
                pick->setSelected(true);
            }
            if (firstFill)
                for (int c = 0; c < StudyColumnCount - 1; ++c) m_list->resizeColumnToContents(c);
        }
        m_anyRunning = running > 0 || !m_active.isEmpty();
        const int n = int(read->studies.size());
        m_stack->setCurrentWidget(n == 0 ? static_cast<QWidget*>(m_empty) : m_stack->widget(0));
        setStatusText(n == 0        ? tr("No studies yet.")
                      : running > 0 ? tr("%n study(s), ", nullptr, n) + tr("%n running", nullptr, running)
                                    : tr("%n study(s)", nullptr, n));
        // Trials finished since the last read show too.
        loadStudy(true);
    }
    updateControls();
    Q_EMIT refreshed();
    if (m_refreshAgain) refresh();
}

void StudiesView::setActiveStudies(const QStringList& names) {
    // Until a read begun after this shows it, an ended study's listed status ("running") is stale:
    // it may have completed, so Resume waits for that read.
    for (const QString& name : std::as_const(m_active))
        if (!names.contains(name)) m_endedAt.insert(name, m_readsStarted);
    for (const QString& name : names) m_endedAt.remove(name);
    m_active = names;
    // A study started here is running: keep re-reading while it is.
    if (!names.isEmpty()) m_anyRunning = true;
    updateControls();
}

void StudiesView::updateControls() {
    m_new->setEnabled(!m_path.isEmpty());
    const QString name = selectedStudy();
    QString status;
    if (const auto items = m_list->selectedItems(); !items.isEmpty()) status = items.first()->text(ColStatus);
    const bool ours = !name.isEmpty() && m_active.contains(name);
    m_stop->setEnabled(ours);
    // Not completed and not run from here: stopped, or left "running" by a process that died.
    m_resume->setEnabled(!name.isEmpty() && !ours && !m_endedAt.contains(name) &&
                         status != QLatin1String("completed"));
}

QString StudiesView::selectedStudy() const {
    const auto items = m_list->selectedItems();
    return items.isEmpty() ? QString() : items.first()->data(0, StudyNameRole).toString();
}

void StudiesView::selectStudy(const QString& name) {
    for (int i = 0; i < m_list->topLevelItemCount(); ++i) {
        QTreeWidgetItem* item = m_list->topLevelItem(i);
        if (item->data(0, StudyNameRole).toString() != name) continue;
        m_list->setCurrentItem(item);
        m_list->scrollToItem(item);
        return;
    }
    m_list->clearSelection();
}

QStringList StudiesView::studyNames() const {
    QStringList names;
    for (int i = 0; i < m_list->topLevelItemCount(); ++i)
        names << m_list->topLevelItem(i)->data(0, StudyNameRole).toString();
    return names;
}

bool StudiesView::isEmptyShown() const { return m_stack->currentWidget() == m_empty; }

void StudiesView::loadStudy(bool force) {
    const QString name = selectedStudy();
    if (!force && name == m_shownStudy) return;
    m_shownStudy = name;
    const uint64_t request = ++m_studyRequest;
    if (!m_source || name.isEmpty()) {
        m_studyLoading = false;
        clearStudy({});
        return;
    }
    m_studyLoading = true;
    const uint64_t generation = m_generation.load();
    m_pool.start([this, source = m_source, generation, request, name = name.toStdString()] {
        // A newer selection (or workspace) replaced this one before it started: skip the read.
        if (m_generation.load() != generation || m_studyRequest.load() != request) return;
        auto read = std::make_shared<StudyDetail>();
        try {
            core::Studies& studies = source->openStudies();
            const auto study = studies.study(name);
            if (!study) {
                read->error = "there is no study '" + name + "' any more";
            } else {
                read->study = *study;
                read->trials = studies.trials(study->id);
                read->importance = core::parameterImportance(read->study, read->trials);
                if (study->sampler == "ppo") {
                    core::Store& store = source->openStore();
                    for (const auto& t : read->trials) {
                        if (t.runId <= 0) continue;
                        StudyDetail::PpoSeries s;
                        s.trialNumber = t.number;
                        s.runId = t.runId;
                        s.lr = store.metrics(t.runId, "ppo/lr");
                        s.batch = store.metrics(t.runId, "ppo/batch");
                        if (!s.lr.empty() || !s.batch.empty()) read->ppo.push_back(std::move(s));
                    }
                }
            }
        } catch (const std::exception& e) {
            read->error = e.what();
        }
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, request, read] { applyStudy(generation, request, read); },
            Qt::QueuedConnection);
    });
}

void StudiesView::applyStudy(uint64_t generation, uint64_t request,
                             const std::shared_ptr<StudyDetail>& read) {
    if (generation != m_generation.load() || request != m_studyRequest.load()) return;
    m_studyLoading = false;
    if (!read->error.empty()) {
        clearStudy(tr("Could not read study %1: %2").arg(m_shownStudy, q(read->error)));
        m_studyLabel->setStyleSheet(QStringLiteral("color: #c62828;"));
        Q_EMIT studyLoaded();
        return;
    }
    const std::string print = fingerprint(*read);
    if (print == m_shownFingerprint) {  // nothing new since the last read
        Q_EMIT studyLoaded();
        return;
    }
    m_shownFingerprint = print;

    const core::StudyRecord& s = read->study;
    QStringList space;
    for (const auto& e : s.space) space << q(e).toHtmlEscaped();
    QString summary =
        tr("<b>%1</b> — %2, %3 %4 · %5 trials: %6 complete, %7 pruned, %8 failed, %9 running")
            .arg(q(s.name).toHtmlEscaped(), algorithmText(s).toHtmlEscaped(),
                 s.direction == "min" ? tr("minimising") : tr("maximising"), q(s.objective).toHtmlEscaped())
            .arg(read->trials.size())
            .arg(s.complete)
            .arg(s.pruned)
            .arg(s.failed)
            .arg(s.running);
    if (s.bestValue)
        summary += tr(" · best <b>%1</b> (trial %2)").arg(valueText(*s.bestValue)).arg(s.bestTrial);
    summary += tr("<br>space: %1 · %2, created %3")
                   .arg(space.join(QStringLiteral(", ")), q(s.status).toHtmlEscaped(), timeText(s.createdAt));
    m_studyLabel->setStyleSheet({});
    m_studyLabel->setText(summary);

    fillTrials(*read);
    m_history->showDetail(*read);
    m_parallel->showDetail(*read);
    m_importance->showDetail(*read);
    const bool ppo = s.sampler == "ppo";
    if (ppo)
        m_ppo->showDetail(*read);
    else
        m_ppo->clearChart({});
    m_charts->setTabVisible(m_charts->indexOf(m_ppo), ppo);
    Q_EMIT studyLoaded();
}

void StudiesView::fillTrials(const StudyDetail& d) {
    m_filling = true;
    // The same study re-read keeps its selected trials; another study starts with none.
    std::set<int64_t> keep;
    const bool sameStudy = m_tableStudy == q(d.study.name);
    if (sameStudy)
        for (const QModelIndex& idx : m_table->selectionModel()->selectedRows())
            keep.insert(idx.data(TrialNumberRole).toLongLong());

    const std::vector<std::string> keys = studyParamKeys(d.study, d.trials);
    m_paramKeys.clear();
    for (const auto& k : keys) m_paramKeys << q(k);
    const QString budgetKey = settingsOf(d.study).value(QStringLiteral("budget_key")).toString();
    QStringList headers{tr("Trial"), tr("State"), q(d.study.objective), tr("Run")};
    headers << m_paramKeys;
    headers << (budgetKey.isEmpty() ? tr("Pruned at") : tr("Pruned at (%1)").arg(budgetKey));
    headers << tr("Duration");

    m_model->clear();
    m_tableStudy = q(d.study.name);
    m_model->setColumnCount(int(headers.size()));
    m_model->setHorizontalHeaderLabels(headers);
    m_model->horizontalHeaderItem(ColValue)->setToolTip(d.study.direction == "min"
                                                            ? tr("The objective: lower is better")
                                                            : tr("The objective: higher is better"));
    const double now = double(QDateTime::currentMSecsSinceEpoch()) / 1000.0;
    for (const auto& t : d.trials) {
        QList<QStandardItem*> row;
        auto cell = [&](const QString& text, const QVariant& sort, bool right) {
            auto* item = new QStandardItem(text);
            item->setEditable(false);
            item->setData(sort, SortRole);
            item->setData(qint64(t.runId), RunIdRole);
            item->setData(qint64(t.number), TrialNumberRole);
            if (right) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
            row << item;
            return item;
        };
        cell(QString::number(t.number), double(t.number), true);
        QStandardItem* state = cell(QString::fromLatin1(core::toString(t.state)),
                                    QString::fromLatin1(core::toString(t.state)), false);
        state->setForeground(trialStateColor(t.state));
        QStringList why;
        if (!t.error.empty()) why << q(t.error);
        if (!t.host.empty()) why << tr("on %1").arg(q(t.host));
        state->setToolTip(why.join(QLatin1Char('\n')));
        QStandardItem* value = t.value && std::isfinite(*t.value) ? cell(valueText(*t.value), *t.value, true)
                                                                  : cell(QString(), QVariant(), true);
        if (!t.rungs.empty()) {
            QStringList rungs;
            for (const auto& r : t.rungs)
                rungs << tr("rung %1 (%2 %3): %4%5")
                             .arg(r.rung)
                             .arg(budgetKey.isEmpty() ? tr("budget") : budgetKey)
                             .arg(valueText(r.budget))
                             .arg(valueText(r.value))
                             .arg(r.promoted ? tr(", promoted") : QString());
            value->setToolTip(
                (t.state == core::TrialState::Pruned
                     ? tr("The value at the last rung it reached: a smaller budget than complete trials'\n")
                     : QString()) +
                rungs.join(QLatin1Char('\n')));
        }
        if (t.runId > 0)
            cell(QString::number(t.runId), double(t.runId), true);
        else
            cell(QString(), QVariant(), true);
        for (const auto& key : keys) {
            const auto it = t.params.find(key);
            if (it == t.params.end()) {
                cell(QString(), QVariant(), false);
                continue;
            }
            double v = 0;
            if (parseNumber(it->second, v))
                cell(q(it->second), v, true);
            else
                cell(q(it->second), q(it->second), false);
        }
        if (t.state == core::TrialState::Pruned && t.prunedAt > 0)
            cell(valueText(t.prunedAt), t.prunedAt, true);
        else
            cell(QString(), QVariant(), true);
        const double end = t.endedAt > 0 ? t.endedAt : t.state == core::TrialState::Running ? now : 0;
        if (t.startedAt > 0 && end >= t.startedAt) {
            QStandardItem* dur = cell(durationText(end - t.startedAt), end - t.startedAt, true);
            dur->setToolTip(tr("started %1").arg(timeText(t.startedAt)));
        } else {
            cell(QString(), QVariant(), true);
        }
        if (d.study.bestValue && t.number == d.study.bestTrial) {
            for (QStandardItem* item : row) {
                QFont bold = item->font();
                bold.setBold(true);
                item->setFont(bold);
            }
            row.front()->setToolTip(tr("The best trial"));
        }
        m_model->appendRow(row);
    }
    if (!sameStudy) m_table->resizeColumnsToContents();
    if (!keep.empty()) {
        QItemSelection selection;
        for (int r = 0; r < m_proxy->rowCount(); ++r) {
            const QModelIndex idx = m_proxy->index(r, 0);
            if (keep.count(idx.data(TrialNumberRole).toLongLong()))
                selection.select(idx, idx.siblingAtColumn(m_proxy->columnCount() - 1));
        }
        m_table->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect);
    }
    m_filling = false;
    // Another study's trials start unselected; the Runs page keeps what it shows until the user
    // selects trials here again.
    if (!sameStudy) m_lastEmitted.clear();
}

void StudiesView::clearStudy(const QString& hint) {
    m_filling = true;
    m_model->clear();
    m_tableStudy.clear();
    m_filling = false;
    m_lastEmitted.clear();
    m_paramKeys.clear();
    m_shownFingerprint.clear();
    m_studyLabel->setStyleSheet({});
    m_studyLabel->setText(hint.isEmpty() ? tr("Select a study to see its trials.") : hint);
    m_history->clearChart({});
    m_parallel->clearChart({});
    m_importance->clearChart({});
    m_ppo->clearChart({});
    m_charts->setTabVisible(m_charts->indexOf(m_ppo), false);
}

void StudiesView::onTrialSelectionChanged() {
    if (m_filling) return;
    const QList<qint64> runs = selectedRunIds();
    if (runs == m_lastEmitted) return;
    m_lastEmitted = runs;
    Q_EMIT runsSelected(runs);
}

QList<qint64> StudiesView::selectedRunIds() const {
    std::set<qint64> ids;
    for (const QModelIndex& idx : m_table->selectionModel()->selectedRows()) {
        const qint64 run = idx.data(RunIdRole).toLongLong();
        if (run > 0) ids.insert(run);
    }
    return QList<qint64>(ids.begin(), ids.end());
}

void StudiesView::selectTrialsOfRuns(const QList<qint64>& runIds) {
    QItemSelection selection;
    for (int r = 0; r < m_proxy->rowCount(); ++r) {
        const QModelIndex idx = m_proxy->index(r, 0);
        if (runIds.contains(idx.data(RunIdRole).toLongLong()))
            selection.select(idx, idx.siblingAtColumn(m_proxy->columnCount() - 1));
    }
    m_table->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect);
}

int StudiesView::paramColumn(const QString& key) const {
    const auto i = m_paramKeys.indexOf(key);
    return i < 0 ? -1 : ColFirstParam + int(i);
}

int StudiesView::prunedAtColumn() const { return ColFirstParam + int(m_paramKeys.size()); }

int StudiesView::durationColumn() const { return prunedAtColumn() + 1; }

QAbstractItemModel* StudiesView::trialsModel() const { return m_proxy; }

QCustomPlot* StudiesView::historyPlot() const { return m_history->plot(); }

QCPGraph* StudiesView::bestSoFarGraph() const { return m_history->bestSoFar(); }

QCustomPlot* StudiesView::parallelPlot() const { return m_parallel->plot(); }

int StudiesView::parallelLineCount() const { return m_parallel->lineCount(); }

QCustomPlot* StudiesView::importancePlot() const { return m_importance->plot(); }

QCPBars* StudiesView::importanceBars() const { return m_importance->bars(); }

QCustomPlot* StudiesView::ppoPlot() const { return m_ppo->plot(); }

int StudiesView::ppoLineCount(bool batch) const { return m_ppo->lineCount(batch); }

bool StudiesView::isPpoShown() const { return m_charts->isTabVisible(m_charts->indexOf(m_ppo)); }

void StudiesView::setStatusText(const QString& text, bool error) {
    m_status->setStyleSheet(error ? QStringLiteral("color: #c62828;") : QString());
    m_status->setText(text);
}

QString StudiesView::statusText() const { return m_status->text(); }

}  // namespace lathe::widgets

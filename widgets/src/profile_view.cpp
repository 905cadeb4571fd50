#include "lathe/widgets/profile_view.h"

#include <QElapsedTimer>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QSaveFile>
#include <QShowEvent>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QStackedWidget>
#include <QTableView>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>
#include <exception>
#include <set>
#include <sstream>

#include "lathe/widgets/profile_timeline.h"
#include "lathe/widgets/step_phase_chart.h"
#include "lathe/widgets/top_ops_model.h"
#include "profile_format.h"

namespace lathe::widgets {

struct ProfileView::LoadResult {
    int64_t runId = 0;
    std::shared_ptr<const TimelineLayout> layout;
    std::vector<core::OpSummary> ops;
    std::vector<core::PhaseSummary> phases;
    std::string error;
    double loadMs = 0;
};

ProfileView::ProfileView(QWidget* parent) : QWidget(parent) {
    // One loader: a newer selection queues behind the current load and the stale one is
    // dropped, so rapid clicking never piles up concurrent reads of 100k spans.
    m_pool.setMaxThreadCount(1);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);

    auto* header = new QHBoxLayout;
    header->setContentsMargins(6, 2, 2, 0);
    m_title = new QLabel(this);
    m_summary = new QLabel(this);
    m_summary->setStyleSheet(QStringLiteral("color: #606060;"));
    m_fit = new QToolButton(this);
    m_fit->setText(tr("Fit"));
    m_fit->setToolTip(tr("Show the whole profile (or double-click the timeline)"));
    m_fit->setAutoRaise(true);
    m_export = new QToolButton(this);
    m_export->setText(tr("Export trace…"));
    m_export->setToolTip(tr("Save as a Chrome trace (JSON) for Perfetto or chrome://tracing"));
    m_export->setAutoRaise(true);
    header->addWidget(m_title);
    header->addSpacing(12);
    header->addWidget(m_summary, 1);
    header->addWidget(m_fit);
    header->addWidget(m_export);
    layout->addLayout(header);

    m_stack = new QStackedWidget(this);
    m_placeholder = new QLabel(this);
    m_placeholder->setObjectName(QStringLiteral("profilePlaceholder"));
    m_placeholder->setAlignment(Qt::AlignCenter);
    m_placeholder->setWordWrap(true);
    m_placeholder->setStyleSheet(QStringLiteral("color: #707070; font-size: 11pt;"));
    m_stack->addWidget(m_placeholder);

    auto* content = new QSplitter(Qt::Vertical, this);
    m_content = content;
    m_timeline = new ProfileTimeline(content);
    m_timeline->setObjectName(QStringLiteral("profileTimeline"));
    m_timeline->setToolTip(tr("Wheel: zoom · drag: pan · double-click: fit · Shift+wheel: scroll lanes"));
    auto* bottom = new QSplitter(Qt::Horizontal, content);
    m_opsModel = new TopOpsModel(this);
    m_opsProxy = new QSortFilterProxyModel(this);
    m_opsProxy->setSourceModel(m_opsModel);
    m_opsProxy->setSortRole(TopOpsModel::SortRole);
    m_opsTable = new QTableView(bottom);
    m_opsTable->setObjectName(QStringLiteral("topOpsTable"));
    m_opsTable->setModel(m_opsProxy);
    m_opsTable->setSortingEnabled(true);
    m_opsTable->sortByColumn(TopOpsModel::ColSelfMs, Qt::DescendingOrder);
    m_opsTable->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_opsTable->setAlternatingRowColors(true);
    m_opsTable->setWordWrap(false);
    m_opsTable->verticalHeader()->hide();
    m_opsTable->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 6);
    m_opsTable->horizontalHeader()->setSectionResizeMode(TopOpsModel::ColName, QHeaderView::Stretch);
    m_opsTable->setMinimumWidth(320);
    m_phases = new StepPhaseChart(bottom);
    m_phases->setObjectName(QStringLiteral("phaseChart"));
    bottom->addWidget(m_opsTable);
    bottom->addWidget(m_phases);
    bottom->setStretchFactor(0, 1);
    bottom->setStretchFactor(1, 1);
    content->addWidget(m_timeline);
    content->addWidget(bottom);
    content->setStretchFactor(0, 3);
    content->setStretchFactor(1, 2);
    content->setChildrenCollapsible(false);
    m_stack->addWidget(content);
    layout->addWidget(m_stack, 1);

    connect(m_fit, &QToolButton::clicked, m_timeline, &ProfileTimeline::fitAll);
    connect(m_export, &QToolButton::clicked, this, &ProfileView::exportTraceDialog);
    showPlaceholder(tr("Select a run to see its profile."));
}

ProfileView::~ProfileView() {
    ++m_generation;  // queued loads skip their work
    m_pool.waitForDone();
}

QString ProfileView::tabTitle() const { return tr("Profile"); }

QString ProfileView::tabToolTip() const {
    return tr("Profile timeline, top ops and step phases of the first selected run");
}

void ProfileView::clear() {
    ++m_generation;
    m_pool.waitForDone();
    m_runId = 0;
    m_wantedStore = nullptr;
    m_wantedRun = 0;
    m_stale = false;
    m_loading = false;
    m_timeline->clear();
    m_opsModel->setOps({});
    m_phases->clear();
    showPlaceholder(tr("Select a run to see its profile."));
}

int ProfileView::spanCount() const {
    const TimelineLayout* layout = m_timeline->layoutData();
    return layout ? int(layout->spans.size()) : 0;
}

QString ProfileView::placeholderText() const {
    return isPlaceholderShown() ? m_placeholder->text() : QString();
}

bool ProfileView::isPlaceholderShown() const { return m_stack->currentWidget() == m_placeholder; }

void ProfileView::showPlaceholder(const QString& text) {
    m_placeholder->setText(text);
    m_stack->setCurrentWidget(m_placeholder);
    m_fit->setEnabled(false);
    m_export->setEnabled(false);
}

void ProfileView::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    m_wantedStore = &store;
    m_wantedRun = runIds.empty() ? 0 : runIds.front();
    catchUp();
}

void ProfileView::onRunFinished(const core::Store& store, int64_t runId) {
    // A run not loaded yet is complete when it is.
    if (runId <= 0 || runId != m_runId) return;
    m_stale = true;
    m_wantedStore = &store;  // the store it was loaded from
    catchUp();
}

void ProfileView::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    catchUp();
}

void ProfileView::catchUp() {
    if (!m_wantedStore || !isVisible()) return;
    if (m_wantedRun == m_runId && !m_stale) return;
    showRun(*m_wantedStore, m_wantedRun);
}

void ProfileView::showRun(const core::Store& store, int64_t runId) {
    const uint64_t generation = ++m_generation;
    m_runId = runId;
    m_wantedStore = &store;
    m_wantedRun = runId;
    m_stale = false;
    if (runId <= 0) {
        m_loading = false;
        m_title->clear();
        m_summary->clear();
        showPlaceholder(tr("Select a run to see its profile."));
        return;
    }
    m_loading = true;
    m_title->setText(tr("<b>Profile of run %1</b>").arg(runId));
    m_summary->setText(tr("loading…"));
    const core::Store* s = &store;
    // The pool is waited for in clear() and the destructor, so `this` and the store outlive
    // the task; a queued call to a deleted object is discarded by Qt.
    m_pool.start([this, s, runId, generation] {
        if (m_generation.load() != generation) return;  // superseded before it started
        auto result = std::make_shared<LoadResult>();
        result->runId = runId;
        QElapsedTimer timer;
        timer.start();
        try {
            std::vector<core::ProfileSpan> spans = s->profileSpans(runId);
            if (!spans.empty() && m_generation.load() == generation) {
                result->ops = core::topOps(spans);
                result->phases = core::phasesByStep(spans);
                result->layout = TimelineLayout::build(std::move(spans));
            }
        } catch (const std::exception& e) {
            result->error = e.what();
        }
        result->loadMs = double(timer.nsecsElapsed()) / 1e6;
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, result] { applyResult(generation, result); }, Qt::QueuedConnection);
    });
}

void ProfileView::applyResult(uint64_t generation, const std::shared_ptr<LoadResult>& result) {
    if (generation != m_generation.load()) return;  // the selection changed meanwhile
    m_loading = false;
    ++m_loadCount;
    if (!result->error.empty()) {
        m_summary->clear();
        m_timeline->clear();
        m_opsModel->setOps({});
        m_phases->clear();
        showPlaceholder(tr("Could not load the profile of run %1:\n%2")
                            .arg(result->runId)
                            .arg(QString::fromStdString(result->error)));
        Q_EMIT loaded(result->runId, 0);
        return;
    }
    if (!result->layout || result->layout->spans.empty()) {
        m_summary->clear();
        m_timeline->clear();
        m_opsModel->setOps({});
        m_phases->clear();
        showPlaceholder(tr("run %1 was not profiled — start a run with Profile on "
                           "(Precision & profiling in the run form, or lathectl train --profile)")
                            .arg(result->runId));
        Q_EMIT loaded(result->runId, 0);
        return;
    }
    const auto& layout = *result->layout;
    m_timeline->setLayoutData(result->layout);
    m_opsModel->setOps(std::move(result->ops));
    const bool device = m_opsModel->hasDeviceTimes();
    m_opsTable->setColumnHidden(TopOpsModel::ColCudaSelfMs, !device);
    m_opsTable->setColumnHidden(TopOpsModel::ColCudaTotalMs, !device);
    m_opsTable->resizeColumnsToContents();
    m_opsTable->horizontalHeader()->setSectionResizeMode(TopOpsModel::ColName, QHeaderView::Stretch);
    m_phases->setPhases(result->phases);
    std::set<int64_t> threads;
    for (const auto& row : layout.rows) threads.insert(row.thread);
    m_summary->setText(tr("%1 spans · %2 steps · %3 thread(s) · %4 recorded · loaded in %5 ms")
                           .arg(layout.spans.size())
                           .arg(result->phases.size())
                           .arg(threads.size())
                           .arg(formatNs(double(layout.endNs - layout.startNs)))
                           .arg(result->loadMs, 0, 'f', 0));
    m_stack->setCurrentIndex(1);
    // The timeline gets the height its lanes need (up to two thirds); the tables get the rest.
    const int total = m_content->height();
    if (total > 200) {
        const int t = std::clamp(m_timeline->preferredHeight(), 120, total * 2 / 3);
        m_content->setSizes({t, total - t});
    }
    m_fit->setEnabled(true);
    m_export->setEnabled(true);
    Q_EMIT loaded(result->runId, int(layout.spans.size()));
}

bool ProfileView::exportChromeTrace(const QString& path) {
    const TimelineLayout* layout = m_timeline->layoutData();
    if (!layout || layout->spans.empty()) return false;
    std::ostringstream out;
    try {
        core::writeChromeTrace(layout->spans, out, "lathe run " + std::to_string(m_runId));
    } catch (const std::exception&) {
        return false;
    }
    // Written under a temporary name and renamed, so a failed export never leaves half a file.
    QSaveFile file(path);
    if (!file.open(QIODevice::WriteOnly)) return false;
    const std::string text = out.str();
    file.write(text.data(), qint64(text.size()));
    return file.commit();
}

void ProfileView::exportTraceDialog() {
    QString path = QFileDialog::getSaveFileName(this, tr("Export Chrome trace"),
                                                QStringLiteral("run-%1-trace.json").arg(m_runId),
                                                tr("Chrome trace (*.json);;All files (*)"));
    if (path.isEmpty()) return;
    if (QFileInfo(path).suffix().isEmpty()) path += QStringLiteral(".json");
    if (!exportChromeTrace(path))
        QMessageBox::warning(this, tr("Export failed"), tr("Could not write %1.").arg(path));
}

}  // namespace lathe::widgets

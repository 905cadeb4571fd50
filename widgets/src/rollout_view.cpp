#include "lathe/widgets/rollout_view.h"

#include <QComboBox>
#include <QDateTime>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QSpinBox>
#include <QSplitter>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <exception>

#include "lathe/core/error.h"
#include "lathe/core/events.h"
#include "lathe/core/rollout.h"
#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

constexpr int kPollMs = 1000;
const QColor kBaseline(31, 119, 180);
const QColor kCandidate(255, 127, 14);

QString pct(int32_t bp) { return QString::number(bp / 100.0, 'g', 4) + QLatin1Char('%'); }

QString duration(double s) {
    if (s >= 3600 && std::fmod(s, 3600) == 0) return QObject::tr("%1 h").arg(s / 3600);
    if (s >= 60 && std::fmod(s, 60) == 0) return QObject::tr("%1 min").arg(s / 60);
    return QObject::tr("%1 s").arg(s);
}

QString timeOf(double t) {
    return QDateTime::fromMSecsSinceEpoch(static_cast<qint64>(t * 1000)).toString("HH:mm:ss");
}

QString stepsText(const std::vector<int32_t>& steps) {
    QStringList out;
    for (auto bp : steps) out << pct(bp);
    return out.join(QStringLiteral(", "));
}

QColor markerColor(const std::string& kind) {
    if (kind == "advance" || kind == "promote" || kind == "healthy") return QColor(44, 160, 44);
    if (kind == "unhealthy" || kind == "rollback") return QColor(214, 39, 40);
    if (kind == "hold") return QColor(140, 140, 140);
    return QColor(90, 90, 200);  // start, pause, resume, abort, ended
}

}  // namespace

struct RolloutView::ReadResult {
    std::optional<core::Rollout> rollout;
    std::optional<core::Deployment> live;
    std::vector<int64_t> versions;
    std::vector<core::RolloutDecision> decisions;
    std::map<std::string, std::vector<core::ServingPoint>> points;
    bool controllerRunning = false;
    std::string error;
};

const std::vector<std::string>& RolloutView::seriesKeys() {
    static const std::vector<std::string> keys{"variant/p50_ms", "variant/p90_ms", "variant/p99_ms",
                                               "variant/qps", "variant/error_rate"};
    return keys;
}

RolloutView::RolloutView(QWidget* parent) : QWidget(parent) {
    m_pool.setMaxThreadCount(1);
    m_actions.setMaxThreadCount(1);

    m_header = new QLabel(this);
    m_header->setObjectName(QStringLiteral("rolloutHeader"));
    m_header->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_verdict = new QLabel(this);
    m_verdict->setObjectName(QStringLiteral("rolloutVerdict"));
    m_verdict->setWordWrap(true);
    m_verdict->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_start = new QPushButton(tr("Start rollout…"), this);
    m_start->setObjectName(QStringLiteral("rolloutStart"));
    m_start->setToolTip(
        tr("Serve another version beside the live one at a rising share, judged at every step"));
    m_pause = new QPushButton(tr("Pause"), this);
    m_pause->setObjectName(QStringLiteral("rolloutPause"));
    m_resume = new QPushButton(tr("Resume"), this);
    m_resume->setObjectName(QStringLiteral("rolloutResume"));
    m_abort = new QPushButton(tr("Abort"), this);
    m_abort->setObjectName(QStringLiteral("rolloutAbort"));

    auto* buttons = new QHBoxLayout;
    buttons->setContentsMargins(4, 2, 4, 2);
    buttons->addWidget(m_header, 1);
    buttons->addWidget(m_start);
    buttons->addWidget(m_pause);
    buttons->addWidget(m_resume);
    buttons->addWidget(m_abort);

    m_plot = new QCustomPlot(this);
    m_plot->setObjectName(QStringLiteral("rolloutPlot"));
    m_plot->setMinimumSize(400, 320);
    m_plot->plotLayout()->clear();
    const QString titles[] = {tr("latency ms"), tr("QPS"), tr("errors %"), tr("weight %")};
    auto dateTicker = QSharedPointer<QCPAxisTickerDateTime>::create();
    dateTicker->setDateTimeFormat(QStringLiteral("HH:mm:ss"));
    for (int i = 0; i < 4; ++i) {
        auto* rect = new QCPAxisRect(m_plot);
        m_plot->plotLayout()->addElement(i, 0, rect);
        rect->axis(QCPAxis::atLeft)->setLabel(titles[i]);
        rect->axis(QCPAxis::atBottom)->setTicker(dateTicker);
        rect->axis(QCPAxis::atBottom)->setTickLabels(i == 3);
        rect->setMarginGroup(QCP::msLeft | QCP::msRight, m_rects.empty()
                                                             ? new QCPMarginGroup(m_plot)
                                                             : m_rects.front()->marginGroup(QCP::msLeft));
        for (auto* a : rect->axes()) a->setLayer(QStringLiteral("axes"));
        m_rects.push_back(rect);
    }
    m_plot->plotLayout()->setRowStretchFactor(0, 2.0);
    m_plot->plotLayout()->setRowStretchFactor(3, 0.7);
    // One time axis: every rect follows the one that moved.
    for (auto* rect : m_rects)
        connect(rect->axis(QCPAxis::atBottom), QOverload<const QCPRange&>::of(&QCPAxis::rangeChanged), this,
                [this](const QCPRange& r) {
                    for (auto* other : m_rects)
                        if (other->axis(QCPAxis::atBottom)->range() != r)
                            other->axis(QCPAxis::atBottom)->setRange(r);
                });
    auto* legend = new QCPLegend;
    m_rects[0]->insetLayout()->addElement(legend, Qt::AlignTop | Qt::AlignRight);
    legend->setLayer(QStringLiteral("legend"));
    QFont small = font();
    small.setPointSizeF(small.pointSizeF() * 0.85);
    legend->setFont(small);
    legend->setBrush(QColor(255, 255, 255, 200));
    const char* names[] = {"P50", "P90", "P99", "QPS", "error rate"};
    for (int v = 0; v < 2; ++v) {
        for (int s = 0; s < kSeriesCount; ++s) {
            const int rect = s <= P99 ? 0 : s == Qps ? 1 : 2;
            auto* g = m_plot->addGraph(m_rects[static_cast<size_t>(rect)]->axis(QCPAxis::atBottom),
                                       m_rects[static_cast<size_t>(rect)]->axis(QCPAxis::atLeft));
            QPen pen(v ? kCandidate : kBaseline, s == P99 ? 2.2 : s == P90 ? 1.5 : 1.0);
            if (v) pen.setStyle(Qt::DashLine);
            if (s == P50) pen.setColor(pen.color().lighter(130));
            g->setPen(pen);
            g->setName(
                QStringLiteral("%1 %2").arg(v ? tr("candidate") : tr("baseline"), QLatin1String(names[s])));
            g->removeFromLegend();
            if (s <= P99) g->addToLegend(legend);
            m_graphs[v][s] = g;
        }
    }
    m_weight = m_plot->addGraph(m_rects[3]->axis(QCPAxis::atBottom), m_rects[3]->axis(QCPAxis::atLeft));
    m_weight->setLineStyle(QCPGraph::lsStepLeft);
    m_weight->setPen(QPen(QColor(44, 160, 44), 2));
    m_weight->setBrush(QColor(44, 160, 44, 40));
    m_weight->setName(tr("candidate's weight"));
    m_weight->removeFromLegend();
    m_rects[3]->axis(QCPAxis::atLeft)->setRange(0, 105);
    auto fixed = QSharedPointer<QCPAxisTickerFixed>::create();
    fixed->setTickStep(50);
    fixed->setScaleStrategy(QCPAxisTickerFixed::ssNone);
    m_rects[3]->axis(QCPAxis::atLeft)->setTicker(fixed);
    m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    for (auto* rect : m_rects) {
        rect->setRangeZoom(Qt::Horizontal);
        rect->setRangeDrag(Qt::Horizontal);
    }

    m_table = new QTableWidget(0, 5, this);
    m_table->setObjectName(QStringLiteral("rolloutDecisions"));
    m_table->setHorizontalHeaderLabels({tr("Time"), tr("Decision"), tr("Weight"), tr("Why"), tr("By")});
    m_table->horizontalHeader()->setSectionResizeMode(3, QHeaderView::Stretch);
    m_table->verticalHeader()->hide();
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setWordWrap(false);

    auto* split = new QSplitter(Qt::Vertical, this);
    split->addWidget(m_plot);
    split->addWidget(m_table);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 1);
    split->setChildrenCollapsible(false);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addLayout(buttons);
    layout->addWidget(m_verdict);
    layout->addWidget(split, 1);

    connect(m_start, &QPushButton::clicked, this, &RolloutView::requestStart);
    connect(m_pause, &QPushButton::clicked, this, &RolloutView::requestPause);
    connect(m_resume, &QPushButton::clicked, this, &RolloutView::requestResume);
    connect(m_abort, &QPushButton::clicked, this, &RolloutView::requestAbort);
    m_timer = new QTimer(this);
    m_timer->setInterval(kPollMs);
    connect(m_timer, &QTimer::timeout, this, [this] {
        if (isVisible()) pollNow();
    });
    m_timer->start();
    updateTexts();
    updateButtons();
}

RolloutView::~RolloutView() {
    ++m_generation;
    m_pool.waitForDone();
    m_actions.waitForDone();
}

void RolloutView::setPollInterval(int ms) { m_timer->setInterval(ms); }

QCPGraph* RolloutView::graph(bool candidate, Series s) const { return m_graphs[candidate ? 1 : 0][s]; }

void RolloutView::showModel(std::shared_ptr<const core::Registry> registry, const QString& model) {
    if (registry == m_registry && model == m_model) return;
    ++m_generation;
    m_registry = std::move(registry);
    m_model = model;
    m_inFlight = false;
    m_rollout.reset();
    m_live.reset();
    m_versions.clear();
    m_decisions.clear();
    resetData();
    updateTexts();
    updateButtons();
    if (m_registry && !m_model.isEmpty()) pollNow();
}

void RolloutView::resetData() {
    m_since.clear();
    for (auto& variant : m_graphs)
        for (auto* g : variant) g->data()->clear();
    m_weight->data()->clear();
    redrawMarkers();
    m_table->setRowCount(0);
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

void RolloutView::pollNow() {
    if (!m_registry || m_model.isEmpty() || m_inFlight) return;
    m_inFlight = true;
    const uint64_t generation = m_generation;
    auto registry = m_registry;
    const std::string model = m_model.toStdString();
    auto since = m_since;
    const int64_t seenId = m_rollout ? m_rollout->id : 0;
    m_pool.start([this, generation, registry, model, since, seenId] {
        auto r = std::make_shared<ReadResult>();
        try {
            r->rollout = registry->activeRollout(model);
            if (!r->rollout) {
                const auto all = registry->rollouts(model);
                if (!all.empty()) r->rollout = all.front();
            }
            r->live = registry->liveDeployment(model);
            for (const auto& v : registry->versions(model)) r->versions.push_back(v.version);
            if (r->rollout) {
                r->decisions = registry->rolloutDecisions(r->rollout->id);
                r->controllerRunning =
                    r->rollout->active() && core::rolloutControllerRunning(*registry, model);
                const double from = r->rollout->startedAt - 2;
                for (const auto& key : seriesKeys()) {
                    const auto it = since.find(key);
                    const double after = r->rollout->id == seenId && it != since.end() ? it->second : from;
                    auto points = registry->servingMetrics(model, key, after);
                    // After the rollout ended, the variants' points are another story.
                    if (!r->rollout->active())
                        points.erase(std::remove_if(points.begin(), points.end(),
                                                    [&](const core::ServingPoint& p) {
                                                        return p.t > r->rollout->endedAt + 5;
                                                    }),
                                     points.end());
                    r->points[key] = std::move(points);
                }
            }
        } catch (const std::exception& ex) {
            r->error = ex.what();
        }
        QMetaObject::invokeMethod(
            this, [this, generation, r] { applyPoll(generation, r); }, Qt::QueuedConnection);
    });
}

void RolloutView::applyPoll(uint64_t generation, const std::shared_ptr<ReadResult>& r) {
    if (generation != m_generation) return;
    m_inFlight = false;
    ++m_pollCount;
    if (!r->error.empty()) {
        m_verdict->setText(tr("Cannot read the workspace: %1").arg(QString::fromStdString(r->error)));
        Q_EMIT polled();
        return;
    }
    if (!r->rollout || !m_rollout || r->rollout->id != m_rollout->id) {
        resetData();
        if (r->rollout) {  // the legend names the versions
            const char* names[] = {"P50", "P90", "P99", "QPS", "error rate"};
            for (int v = 0; v < 2; ++v)
                for (int s = 0; s < kSeriesCount; ++s)
                    m_graphs[v][s]->setName(QStringLiteral("v%1 %2%3")
                                                .arg(v ? r->rollout->candidate : r->rollout->baseline)
                                                .arg(QLatin1String(names[s]))
                                                .arg(v ? tr(" (candidate)") : QString()));
        }
    }
    m_rollout = r->rollout;
    m_live = r->live;
    m_versions = r->versions;
    m_decisions = r->decisions;
    if (m_rollout) {
        const auto& keys = seriesKeys();
        double last = m_rollout->startedAt;
        for (size_t s = 0; s < keys.size(); ++s) {
            const auto it = r->points.find(keys[s]);
            if (it == r->points.end()) continue;
            for (const auto& p : it->second) {
                const int v = p.version == m_rollout->candidate  ? 1
                              : p.version == m_rollout->baseline ? 0
                                                                 : -1;
                if (v < 0) continue;
                const double value = static_cast<int>(s) == ErrorRate ? 100.0 * p.value : p.value;
                m_graphs[v][s]->addData(p.t, value);
                last = std::max(last, p.t);
            }
            if (!it->second.empty()) m_since[keys[s]] = it->second.back().t;
        }
        // The weight as the decisions set it, held until now (or the end).
        m_weight->data()->clear();
        for (const auto& d : m_decisions) {
            m_weight->addData(d.firstT, d.weightBp / 100.0);
            last = std::max(last, d.t);
        }
        const double end = m_rollout->active() ? std::max(last, core::nowSeconds()) : m_rollout->endedAt;
        m_weight->addData(end, m_rollout->weightBp / 100.0);
        for (size_t i = 0; i < m_rects.size(); ++i) {
            auto* rect = m_rects[i];
            rect->axis(QCPAxis::atBottom)->setRange(m_rollout->startedAt - 2, end + 2);
            if (i == 3) continue;
            bool found = false;
            QCPRange range;
            for (auto* g : rect->graphs()) {
                bool ok = false;
                const auto gr = g->getValueRange(ok);
                if (!ok) continue;
                range =
                    found ? QCPRange(std::min(range.lower, gr.lower), std::max(range.upper, gr.upper)) : gr;
                found = true;
            }
            if (found)
                rect->axis(QCPAxis::atLeft)->setRange(0, std::max(range.upper * 1.15, i == 2 ? 1.0 : 0.1));
        }
        redrawMarkers();
        m_table->setRowCount(static_cast<int>(m_decisions.size()));
        int row = 0;
        for (auto it = m_decisions.rbegin(); it != m_decisions.rend(); ++it, ++row) {
            const auto& d = *it;
            QString when = timeOf(d.t);
            if (d.repeats > 1) when = tr("%1 (×%2 since %3)").arg(when).arg(d.repeats).arg(timeOf(d.firstT));
            const QString cells[] = {when, QString::fromStdString(d.kind), pct(d.weightBp),
                                     QString::fromStdString(d.reason), QString::fromStdString(d.actor)};
            for (int c = 0; c < 5; ++c) {
                auto* item = new QTableWidgetItem(cells[c]);
                if (c == 1) item->setForeground(markerColor(d.kind));
                if (c == 3) item->setToolTip(QString::fromStdString(d.reason + "\n" + d.numbers));
                m_table->setItem(row, c, item);
            }
        }
        m_table->resizeColumnToContents(0);
        m_table->resizeColumnToContents(1);
    }
    updateTexts();
    if (m_rollout && m_rollout->active() && !r->controllerRunning)
        m_header->setText(m_header->text() + tr(" · <b>controller not running</b>: Resume starts it again"));
    m_controllerRunning = r->controllerRunning;
    updateButtons();
    m_plot->replot(QCustomPlot::rpQueuedReplot);
    Q_EMIT polled();
}

void RolloutView::redrawMarkers() {
    for (int i = m_plot->itemCount() - 1; i >= 0; --i) m_plot->removeItem(i);
    m_markers = 0;
    for (const auto& d : m_decisions) {
        if (d.kind == "hold" || d.kind == "healthy") continue;  // in the table; markers are changes
        const QColor color = markerColor(d.kind);
        for (auto* rect : m_rects) {
            auto* line = new QCPItemStraightLine(m_plot);
            line->setClipAxisRect(rect);
            line->point1->setAxes(rect->axis(QCPAxis::atBottom), rect->axis(QCPAxis::atLeft));
            line->point2->setAxes(rect->axis(QCPAxis::atBottom), rect->axis(QCPAxis::atLeft));
            line->point1->setCoords(d.firstT, 0);
            line->point2->setCoords(d.firstT, 1);
            line->setPen(QPen(color, 1, Qt::DotLine));
        }
        auto* label = new QCPItemText(m_plot);
        label->setClipAxisRect(m_rects[0]);
        label->setClipToAxisRect(true);
        label->position->setAxes(m_rects[0]->axis(QCPAxis::atBottom), m_rects[0]->axis(QCPAxis::atLeft));
        label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
        label->position->setAxisRect(m_rects[0]);
        label->position->setCoords(d.firstT, 0.02 + 0.07 * (m_markers % 3));
        label->setPositionAlignment(Qt::AlignLeft | Qt::AlignTop);
        label->setText(QString::fromStdString(d.kind) + QLatin1Char(' ') + pct(d.weightBp));
        label->setColor(color);
        QFont f = font();
        f.setPointSizeF(f.pointSizeF() * 0.85);
        label->setFont(f);
        ++m_markers;
    }
}

QString RolloutView::headerText() const { return m_header->text(); }
QString RolloutView::verdictText() const { return m_verdict->text(); }

void RolloutView::updateTexts() {
    if (m_model.isEmpty()) {
        m_header->setText(tr("Select a model to see its rollouts"));
        m_verdict->clear();
        return;
    }
    if (!m_rollout) {
        m_header->setText(tr("<b>%1</b> has had no rollout").arg(m_model));
        m_verdict->setText(
            m_live
                ? tr("Start rollout… serves another version beside v%1 at a rising share, judged "
                     "against v%1 at every step")
                      .arg(m_live->version)
                : tr("Deploy %1 first: a rollout serves a candidate beside the live version").arg(m_model));
        return;
    }
    const auto& r = *m_rollout;
    QString state = QString::fromStdString(r.state).replace(QLatin1Char('_'), QLatin1Char(' '));
    m_header->setText(
        tr("<b>Rollout %1 of %2</b>: v%3 beside v%4 · <b>%5</b> · step %6 of %7 (%8) · windows of %9")
            .arg(r.id)
            .arg(m_model)
            .arg(r.candidate)
            .arg(r.baseline)
            .arg(state)
            .arg(r.step + 1)
            .arg(r.stepsBp.size())
            .arg(pct(r.weightBp))
            .arg(duration(r.intervalS)));
    const core::RolloutDecision* verdict = nullptr;
    for (const auto& d : m_decisions)
        if (d.kind == "hold" || d.kind == "healthy" || d.kind == "unhealthy" || d.kind == "promote" ||
            d.kind == "rollback" || d.kind == "abort" || d.kind == "ended")
            verdict = &d;
    if (!verdict) {
        m_verdict->setText(
            tr("No verdict yet: the first window of %1 is being watched").arg(duration(r.intervalS)));
        return;
    }
    const QString color = markerColor(verdict->kind).name();
    m_verdict->setText(tr("<span style='color:%1'><b>%2</b></span> at %3: %4")
                           .arg(color, QString::fromStdString(verdict->kind), timeOf(verdict->t),
                                QString::fromStdString(verdict->reason).toHtmlEscaped()));
}

void RolloutView::updateButtons() {
    const bool active = m_rollout && m_rollout->active();
    const bool canStart = m_live && !active && m_versions.size() > 1;
    m_start->setEnabled(!m_busy && canStart);
    m_pause->setEnabled(!m_busy && active && m_rollout->state == "running");
    m_resume->setEnabled(!m_busy && active && (m_rollout->state == "paused" || !m_controllerRunning));
    m_abort->setEnabled(!m_busy && active);
}

bool RolloutView::confirm(const QString& title, const QString& question) {
    if (m_confirm) return m_confirm(title, question);
    return QMessageBox::question(this, title, question, QMessageBox::Yes | QMessageBox::Cancel,
                                 QMessageBox::Cancel) == QMessageBox::Yes;
}

QString RolloutView::startQuestion(const core::Rollout& plan) const {
    const QString live = m_live ? QString::number(m_live->version) : QStringLiteral("?");
    const QString url = m_live ? QString::fromStdString(m_live->url) : QString();
    QString limits = tr("its error rate is above %1%").arg(100 * plan.maxErrorRate);
    limits += plan.maxP99Ms > 0 ? tr(" or its P99 above %1 ms").arg(plan.maxP99Ms)
                                : tr(" or its P99 above 1.5× v%1's").arg(live);
    std::vector<int32_t> rest(plan.stepsBp.begin() + (plan.stepsBp.empty() ? 0 : 1), plan.stepsBp.end());
    return tr("Start a rollout of %1 v%2 beside v%3 at %4?\n\n"
              "v%2 answers %5 of the requests now (each user stays on one side)%6, each step after a healthy "
              "window of %7 with at least %8 requests per version; after the last step it becomes "
              "production.\n\n"
              "If %9 (and significantly above v%3's) in %10 windows in a row, it is rolled back to 0% by "
              "itself.")
        .arg(m_model, QString::number(plan.candidate), live, url,
             plan.stepsBp.empty() ? QString() : pct(plan.stepsBp.front()),
             rest.empty() ? QString() : tr(", then %1").arg(stepsText(rest)), duration(plan.intervalS))
        .arg(plan.minRequests)
        .arg(limits)
        .arg(plan.threshold);
}

QString RolloutView::pauseQuestion() const {
    if (!m_rollout) return {};
    return tr("Pause the rollout of %1 v%2?\n\nThe split stays: v%2 keeps answering %3 of the requests, but "
              "nothing is judged and the weight does not change until you resume.")
        .arg(m_model)
        .arg(m_rollout->candidate)
        .arg(pct(m_rollout->weightBp));
}

QString RolloutView::resumeQuestion() const {
    if (!m_rollout) return {};
    return tr("Resume the rollout of %1 v%2 at step %3 of %4 (%5)?\n\nA fresh window of %6 starts now; its "
              "controller is started again if it is not running.")
        .arg(m_model)
        .arg(m_rollout->candidate)
        .arg(m_rollout->step + 1)
        .arg(m_rollout->stepsBp.size())
        .arg(pct(m_rollout->weightBp))
        .arg(duration(m_rollout->intervalS));
}

QString RolloutView::abortQuestion() const {
    if (!m_rollout) return {};
    return tr("Abort the rollout of %1 v%2?\n\nIts share goes from %3 to 0% now and v%4 answers every "
              "request. "
              "The rollout ends and cannot be resumed (start a new one later).")
        .arg(m_model)
        .arg(m_rollout->candidate)
        .arg(pct(m_rollout->weightBp))
        .arg(m_rollout->baseline);
}

void RolloutView::runAction(const QString& action, std::function<void(core::Registry&)> work) {
    if (!m_registry || m_busy) return;
    m_busy = true;
    updateButtons();
    const std::string path = m_registry->workspacePath();
    m_actions.start([this, action, path, work = std::move(work)] {
        QString error;
        try {
            core::Registry registry(path);
            work(registry);
        } catch (const std::exception& ex) {
            error = QString::fromStdString(ex.what());
        }
        QMetaObject::invokeMethod(
            this,
            [this, action, error] {
                m_busy = false;
                updateButtons();
                if (!error.isEmpty())
                    m_verdict->setText(tr("%1 failed: %2").arg(action, error.toHtmlEscaped()));
                Q_EMIT actionFinished(action, error);
                pollNow();
            },
            Qt::QueuedConnection);
    });
}

bool RolloutView::startRollout(const core::Rollout& plan) {
    if (m_busy || !m_live || !m_start->isEnabled()) return false;
    if (!confirm(tr("Start a rollout"), startQuestion(plan))) return false;
    core::RolloutOptions o;
    o.controllerProgram = m_controller.toStdString();
    o.hostFor = m_hosts;
    runAction(tr("Start"), [plan, o](core::Registry& r) { core::startRollout(r, plan, o); });
    return true;
}

void RolloutView::requestStart() {
    if (!m_live || m_busy) return;
    QDialog dialog(this);
    dialog.setWindowTitle(tr("Start a rollout of %1").arg(m_model));
    auto* form = new QFormLayout;
    auto* candidate = new QComboBox(&dialog);
    for (auto it = m_versions.rbegin(); it != m_versions.rend(); ++it)
        if (*it != m_live->version)
            candidate->addItem(QStringLiteral("v%1").arg(*it), QVariant::fromValue<qint64>(*it));
    auto* steps = new QLineEdit(QStringLiteral("5,25,50,100"), &dialog);
    steps->setToolTip(tr("The candidate's share at each step, percent, rising"));
    auto* interval = new QLineEdit(QStringLiteral("10m"), &dialog);
    interval->setToolTip(tr("How long each step is watched before it is judged: 30s, 10m, 72h"));
    auto* errors = new QLineEdit(QStringLiteral("1%"), &dialog);
    auto* p99 = new QDoubleSpinBox(&dialog);
    p99->setRange(0, 1e6);
    p99->setSpecialValueText(tr("none (no slower than 1.5× the live version)"));
    p99->setSuffix(tr(" ms"));
    auto* minRequests = new QSpinBox(&dialog);
    minRequests->setRange(1, 100000000);
    minRequests->setValue(200);
    auto* threshold = new QSpinBox(&dialog);
    threshold->setRange(1, 1000);
    threshold->setValue(3);
    form->addRow(tr("Candidate"), candidate);
    form->addRow(tr("Steps (%)"), steps);
    form->addRow(tr("Window"), interval);
    form->addRow(tr("Max error rate"), errors);
    form->addRow(tr("Max P99"), p99);
    form->addRow(tr("Min requests per window"), minRequests);
    form->addRow(tr("Unhealthy windows before rollback"), threshold);
    auto* box = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
    connect(box, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
    connect(box, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
    auto* layout = new QVBoxLayout(&dialog);
    layout->addLayout(form);
    layout->addWidget(box);
    if (dialog.exec() != QDialog::Accepted || candidate->count() == 0) return;
    core::Rollout plan;
    plan.model = m_model.toStdString();
    plan.candidate = candidate->currentData().value<qint64>();
    try {
        plan.stepsBp = core::parseRolloutSteps(steps->text().toStdString());
        plan.intervalS = core::parseDurationSeconds(interval->text().toStdString(), "the window");
        plan.maxErrorRate = core::parseRate(errors->text().toStdString(), "the max error rate");
    } catch (const core::ConfigError& ex) {
        QMessageBox::warning(this, tr("Start a rollout"), QString::fromStdString(ex.what()));
        return;
    }
    plan.maxP99Ms = p99->value();
    plan.minRequests = minRequests->value();
    plan.threshold = threshold->value();
    startRollout(plan);
}

void RolloutView::requestPause() {
    if (!m_rollout || !m_pause->isEnabled() || !confirm(tr("Pause the rollout"), pauseQuestion())) return;
    const std::string model = m_model.toStdString();
    runAction(tr("Pause"), [model](core::Registry& r) { core::pauseRollout(r, model, {}); });
}

void RolloutView::requestResume() {
    if (!m_rollout || !m_resume->isEnabled() || !confirm(tr("Resume the rollout"), resumeQuestion())) return;
    const std::string model = m_model.toStdString();
    core::RolloutOptions o;
    o.controllerProgram = m_controller.toStdString();
    runAction(tr("Resume"), [model, o](core::Registry& r) { core::resumeRollout(r, model, o); });
}

void RolloutView::requestAbort() {
    if (!m_rollout || !m_abort->isEnabled() || !confirm(tr("Abort the rollout"), abortQuestion())) return;
    const std::string model = m_model.toStdString();
    runAction(tr("Abort"),
              [model](core::Registry& r) { core::abortRollout(r, model, "aborted from the workbench", {}); });
}

}  // namespace lathe::widgets

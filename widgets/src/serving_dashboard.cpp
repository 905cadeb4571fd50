#include "lathe/widgets/serving_dashboard.h"
#include "lathe/core/events.h"

#include <QHeaderView>
#include <QLabel>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QTableView>
#include <QTimer>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/serving_chart.h"
#include "lathe/widgets/serving_tables.h"

namespace lathe::widgets {

namespace {

constexpr int kDefaultPollMs = 1000;
constexpr double kBatchWindowS = 60.0;
// servingKeys() scans the model's rows; new batch buckets are rare (a server restart with other
// --max-batch), so look for them every few polls only.
constexpr int kDiscoverEvery = 10;
constexpr int kDiscoverEmptyEvery = 3;
const char* const kBatchPrefix = "batch_hist/";

double parseBound(const std::string& le) {
    if (le == "+Inf" || le == "Inf" || le == "inf") return std::numeric_limits<double>::infinity();
    try {
        size_t used = 0;
        const double v = std::stod(le, &used);
        return used == le.size() ? v : std::numeric_limits<double>::quiet_NaN();
    } catch (const std::exception&) {
        return std::numeric_limits<double>::quiet_NaN();
    }
}

QString number(double v) { return QString::number(v, 'g', 6); }

QTableView* makeTable(QAbstractItemModel* model, int sortRole, int sortColumn, const QString& objectName,
                      QWidget* parent) {
    auto* proxy = new QSortFilterProxyModel(parent);
    proxy->setSourceModel(model);
    proxy->setSortRole(sortRole);
    auto* table = new QTableView(parent);
    table->setObjectName(objectName);
    table->setModel(proxy);
    table->setSortingEnabled(true);
    table->sortByColumn(sortColumn, Qt::DescendingOrder);
    table->setSelectionBehavior(QAbstractItemView::SelectRows);
    table->setAlternatingRowColors(true);
    table->setWordWrap(false);
    table->verticalHeader()->hide();
    table->verticalHeader()->setDefaultSectionSize(table->fontMetrics().height() + 6);
    table->horizontalHeader()->setStretchLastSection(true);
    return table;
}

QWidget* titled(const QString& title, QWidget* body, QLabel** label = nullptr) {
    auto* box = new QWidget;
    auto* layout = new QVBoxLayout(box);
    layout->setContentsMargins(0, 2, 0, 0);
    layout->setSpacing(2);
    auto* heading = new QLabel(title, box);
    heading->setContentsMargins(6, 0, 0, 0);
    layout->addWidget(heading);
    layout->addWidget(body, 1);
    if (label) *label = heading;
    return box;
}

}  // namespace

struct ServingDashboard::PollResult {
    std::map<std::string, std::vector<core::ServingPoint>> points;
    bool discovered = false;
    std::vector<std::string> batchKeys;
    std::vector<core::Deployment> deployments;
    std::vector<core::AlertRecord> alerts;
    std::string error;
};

const std::vector<std::string>& ServingDashboard::polledKeys() {
    static const std::vector<std::string> keys = {
        "up",          "qps",          "error_rate",     "p50_ms",     "p90_ms",
        "p99_ms",      "queue_ms_p99", "compute_ms_p99", "batch_mean", "queue_depth",
        "cpu_percent", "rss_mb",       "gpu_util",       "gpu_mem_mb"};
    return keys;
}

std::vector<QString> ServingDashboard::batchBucketLabels(const std::vector<std::string>& bounds) {
    std::vector<QString> out;
    double below = 0;
    for (const auto& le : bounds) {
        const double b = parseBound(le);
        const bool integral = std::isfinite(b) && b == std::floor(b) && below == std::floor(below);
        if (std::isinf(b))
            out.push_back(QStringLiteral(">%1").arg(number(below)));
        else if (integral && b - below <= 1)
            out.push_back(number(b));
        else if (integral)
            out.push_back(QStringLiteral("%1–%2").arg(number(below + 1)).arg(number(b)));
        else
            out.push_back(QStringLiteral("≤%1").arg(QString::fromStdString(le)));
        if (std::isfinite(b)) below = b;
    }
    return out;
}

ServingDashboard::ServingDashboard(QWidget* parent) : QWidget(parent) {
    // One reader: a poll never overtakes the previous one, so "points after the last t" holds.
    m_pool.setMaxThreadCount(1);

    m_chart = new ServingChart(this);
    m_chart->setObjectName(QStringLiteral("servingChart"));

    m_batchPlot = new QCustomPlot(this);
    m_batchPlot->setObjectName(QStringLiteral("batchPlot"));
    m_batchPlot->setMinimumSize(200, 120);
    m_batchBars = new QCPBars(m_batchPlot->xAxis, m_batchPlot->yAxis);
    m_batchBars->setWidth(0.7);
    m_batchBars->setPen(QPen(QColor(0x8c, 0x56, 0x4b)));
    m_batchBars->setBrush(QColor(0x8c, 0x56, 0x4b, 150));
    m_batchPlot->xAxis->setLabel(tr("batch size"));
    m_batchPlot->yAxis->setLabel(tr("batches"));
    m_batchPlot->xAxis->setTicker(QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText));
    m_batchPlot->xAxis->grid()->setVisible(false);

    m_deployModel = new DeploymentTableModel(this);
    m_alertModel = new AlertTableModel(this);
    m_deployTable = makeTable(m_deployModel, DeploymentTableModel::SortRole, DeploymentTableModel::ColFrom,
                              QStringLiteral("deploymentTable"), this);
    m_alertTable = makeTable(m_alertModel, AlertTableModel::SortRole, AlertTableModel::ColFired,
                             QStringLiteral("alertTable"), this);

    auto* side = new QSplitter(Qt::Vertical, this);
    side->addWidget(titled(tr("<b>Batch sizes</b> · last minute"), m_batchPlot, &m_batchTitle));
    side->addWidget(titled(tr("<b>Deployments</b>"), m_deployTable));
    side->addWidget(titled(tr("<b>Alerts</b>"), m_alertTable));
    side->setStretchFactor(0, 2);
    side->setStretchFactor(1, 2);
    side->setStretchFactor(2, 1);
    side->setChildrenCollapsible(false);

    auto* split = new QSplitter(Qt::Horizontal, this);
    split->addWidget(m_chart);
    split->addWidget(side);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    split->setChildrenCollapsible(false);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(split);

    // The tables change only when a deployment or an alert does (they reset then): fit the
    // columns to the new content, not on every poll.
    connect(m_deployModel, &QAbstractItemModel::modelReset, m_deployTable,
            &QTableView::resizeColumnsToContents);
    connect(m_alertModel, &QAbstractItemModel::modelReset, m_alertTable,
            &QTableView::resizeColumnsToContents);

    m_timer = new QTimer(this);
    m_timer->setInterval(kDefaultPollMs);
    connect(m_timer, &QTimer::timeout, this, &ServingDashboard::onTimer);
    m_timer->start();
    updateBatchChart();
}

ServingDashboard::~ServingDashboard() {
    ++m_generation;  // a queued poll skips its reads
    m_pool.waitForDone();
}

void ServingDashboard::setPollInterval(int ms) { m_timer->setInterval(ms); }

void ServingDashboard::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    // Hidden dashboards do not poll: catch up at once when shown again.
    if (!m_model.isEmpty()) pollNow();
}

void ServingDashboard::showModel(std::shared_ptr<const core::Registry> registry, const QString& model) {
    ++m_generation;
    m_registry = model.isEmpty() ? nullptr : std::move(registry);
    m_model = m_registry ? model : QString();
    m_inFlight = false;
    m_pollAgain = false;
    m_pollsSinceDiscovery = 0;
    m_error.clear();
    m_since.clear();
    m_last.clear();
    m_batchKeys.clear();
    m_batchWindow.clear();
    m_deployments.clear();
    m_historyStart = std::max(0.0, core::nowSeconds() - m_historyS);
    m_chart->clear();
    m_deployModel->setDeployments({});
    m_alertModel->setAlerts({});
    updateBatchChart();
    if (m_model.isEmpty()) {
        m_chart->setTitle(tr("<b>Serving</b>"));
        m_chart->setPlaceholder(tr("Select a model to see its serving metrics"));
        return;
    }
    m_chart->setTitle(tr("<b>Serving · %1</b>").arg(m_model.toHtmlEscaped()));
    m_chart->setPlaceholder(tr("Reading…"));
    startPoll();
}

void ServingDashboard::onTimer() {
    if (m_model.isEmpty() || !isVisible()) return;
    if (!m_inFlight) startPoll();
}

void ServingDashboard::pollNow() {
    if (m_model.isEmpty()) return;
    if (m_inFlight)
        m_pollAgain = true;
    else
        startPoll();
}

void ServingDashboard::startPoll() {
    m_inFlight = true;
    m_pollAgain = false;
    const uint64_t generation = m_generation.load();
    // Until a model's first batches are scraped look more often, so a fresh deployment's
    // histogram appears within seconds.
    const bool discover = m_pollsSinceDiscovery == 0;
    m_pollsSinceDiscovery =
        (m_pollsSinceDiscovery + 1) % (m_batchKeys.empty() ? kDiscoverEmptyEvery : kDiscoverEvery);
    std::vector<std::string> keys = polledKeys();
    const std::vector<std::string> batchKeys = m_batchKeys;
    // `this` outlives the task (the destructor waits for the pool); the registry is shared.
    m_pool.start([this, registry = m_registry, model = m_model.toStdString(), keys = std::move(keys),
                  batchKeys, since = m_since, start = m_historyStart, discover, generation]() mutable {
        if (m_generation.load() != generation) return;
        auto result = std::make_shared<PollResult>();
        try {
            if (discover) {
                result->discovered = true;
                for (auto& k : registry->servingKeys(model))
                    if (k.rfind(kBatchPrefix, 0) == 0) result->batchKeys.push_back(std::move(k));
            }
            for (const auto& k : result->discovered ? result->batchKeys : batchKeys) keys.push_back(k);
            for (const auto& k : keys) {
                auto it = since.find(k);
                auto points = registry->servingMetrics(model, k, it == since.end() ? start : it->second);
                if (!points.empty()) result->points.emplace(k, std::move(points));
            }
            result->deployments = registry->deployments(model);
            result->alerts = registry->alerts(model, start);
        } catch (const std::exception& e) {
            result->error = e.what();
        }
        if (m_generation.load() != generation) return;
        QMetaObject::invokeMethod(
            this, [this, generation, result] { applyPoll(generation, result); }, Qt::QueuedConnection);
    });
}

void ServingDashboard::applyPoll(uint64_t generation, const std::shared_ptr<PollResult>& result) {
    if (generation != m_generation.load()) return;  // another model was selected meanwhile
    m_inFlight = false;
    ++m_pollCount;
    if (!result->error.empty()) {
        m_error = QString::fromStdString(result->error);
        m_chart->setSummaryText(
            QStringLiteral("<span style='color:#c62828'>%1</span>")
                .arg(tr("Could not read the serving metrics: %1").arg(m_error.toHtmlEscaped())));
        Q_EMIT polled(0);
        if (m_pollAgain) startPoll();
        return;
    }
    m_error.clear();
    if (result->discovered) {
        // Bucket order is numeric (+Inf last), not the registry's text order.
        m_batchKeys = result->batchKeys;
        std::sort(m_batchKeys.begin(), m_batchKeys.end(), [](const std::string& a, const std::string& b) {
            return parseBound(a.substr(std::char_traits<char>::length(kBatchPrefix))) <
                   parseBound(b.substr(std::char_traits<char>::length(kBatchPrefix)));
        });
    }
    int added = 0;
    for (auto& [key, points] : result->points) {
        added += int(points.size());
        m_since[key] = points.back().t;
        m_last[key] = {points.back().t, points.back().value};
        if (key.rfind(kBatchPrefix, 0) == 0) {
            auto& window = m_batchWindow[key];
            window.insert(window.end(), points.begin(), points.end());
        } else {
            m_chart->addPoints(key, points);
        }
    }
    m_deployments = result->deployments;
    m_chart->setDeployments(result->deployments);
    m_chart->setAlerts(result->alerts, core::nowSeconds());
    m_deployModel->setDeployments(std::move(result->deployments));
    m_alertModel->setAlerts(std::move(result->alerts));
    updateBatchChart();
    updateSummary();
    const bool anything = !m_last.empty() || !m_deployments.empty();
    m_chart->setPlaceholder(
        anything ? QString() : tr("%1 has not been deployed yet: select a version and Deploy.").arg(m_model));
    Q_EMIT polled(added);
    if (m_pollAgain) startPoll();
}

double ServingDashboard::lastValue(const std::string& key) const {
    auto it = m_last.find(key);
    return it == m_last.end() ? std::numeric_limits<double>::quiet_NaN() : it->second.second;
}

std::vector<std::pair<QString, double>> ServingDashboard::batchHistogram() const {
    std::vector<std::pair<QString, double>> out;
    std::vector<std::string> bounds;
    for (const auto& k : m_batchKeys)
        bounds.push_back(k.substr(std::char_traits<char>::length(kBatchPrefix)));
    const std::vector<QString> labels = batchBucketLabels(bounds);
    for (size_t i = 0; i < m_batchKeys.size(); ++i) {
        double sum = 0;
        auto it = m_batchWindow.find(m_batchKeys[i]);
        if (it != m_batchWindow.end())
            for (const auto& p : it->second) sum += p.value;
        out.emplace_back(labels[i], sum);
    }
    return out;
}

void ServingDashboard::updateBatchChart() {
    // "The last minute" is the minute before the newest batch point, so a stopped server still
    // shows what it last did.
    double newest = -std::numeric_limits<double>::infinity();
    for (const auto& [key, window] : m_batchWindow)
        if (!window.empty()) newest = std::max(newest, window.back().t);
    for (auto& [key, window] : m_batchWindow)
        while (!window.empty() && window.front().t <= newest - kBatchWindowS) window.pop_front();

    const auto histogram = batchHistogram();
    QVector<double> keys, values;
    QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
    double total = 0, top = 0;
    for (size_t i = 0; i < histogram.size(); ++i) {
        keys << double(i + 1);
        values << histogram[i].second;
        ticker->addTick(double(i + 1), histogram[i].first);
        total += histogram[i].second;
        top = std::max(top, histogram[i].second);
    }
    m_batchBars->setData(keys, values, true);
    m_batchPlot->xAxis->setTicker(ticker);
    // A server's default buckets (1 … 256, +Inf) do not fit side by side in the side panel.
    m_batchPlot->xAxis->setTickLabelRotation(histogram.size() > 6 ? -45 : 0);
    m_batchPlot->xAxis->setRange(0.3, std::max<double>(1, double(histogram.size())) + 0.7);
    m_batchPlot->yAxis->setRange(0, top > 0 ? top * 1.15 : 1.0);
    m_batchTitle->setText(histogram.empty()
                              ? tr("<b>Batch sizes</b> · last minute")
                              : tr("<b>Batch sizes</b> · last minute · %1 batches").arg(total, 0, 'f', 0));
    m_batchPlot->replot(QCustomPlot::rpQueuedReplot);
}

void ServingDashboard::updateSummary() {
    QStringList parts;
    const core::Deployment* live = nullptr;
    for (const auto& d : m_deployments)
        if (d.live()) live = &d;
    if (live)
        parts << tr("v%1 live · %2")
                     .arg(live->version)
                     .arg(QString::fromStdString(live->url + (live->target.rfind("ssh:", 0) == 0
                                                                  ? " on " + live->target.substr(4)
                                                                  : std::string()))
                              .toHtmlEscaped());
    else if (!m_deployments.empty())
        parts << tr("not deployed");
    auto value = [this](const char* key) { return lastValue(key); };
    const double up = value("up");
    if (std::isfinite(up) && up == 0)
        parts << QStringLiteral("<span style='color:#c62828'>%1</span>").arg(tr("DOWN"));
    const double p99 = value("p99_ms");
    if (std::isfinite(p99)) parts << tr("P99 %1 ms").arg(p99, 0, 'f', p99 < 10 ? 2 : 1);
    const double qps = value("qps");
    if (std::isfinite(qps)) parts << tr("%1 QPS").arg(qps, 0, 'f', 1);
    const double err = value("error_rate");
    if (std::isfinite(err)) parts << tr("%1% errors").arg(100.0 * err, 0, 'f', 2);
    const double queue = value("queue_depth");
    if (std::isfinite(queue)) parts << tr("queue %1").arg(queue, 0, 'g', 4);
    const double cpu = value("cpu_percent");
    if (std::isfinite(cpu)) parts << tr("CPU %1%").arg(cpu, 0, 'f', 0);
    const double rss = value("rss_mb");
    if (std::isfinite(rss)) parts << tr("RSS %1 MB").arg(rss, 0, 'f', 0);
    const double gpu = value("gpu_util");
    if (std::isfinite(gpu)) parts << tr("GPU %1%").arg(gpu, 0, 'f', 0);
    const double gpuMem = value("gpu_mem_mb");
    if (std::isfinite(gpuMem)) parts << tr("GPU mem %1 MB").arg(gpuMem, 0, 'f', 0);
    const int firing = m_alertModel->firingCount();
    if (firing > 0)
        parts << QStringLiteral("<span style='color:#c62828'>%1</span>")
                     .arg(firing == 1 ? tr("1 alert firing") : tr("%1 alerts firing").arg(firing));
    m_chart->setSummaryText(parts.join(QStringLiteral(" · ")));
}

}  // namespace lathe::widgets

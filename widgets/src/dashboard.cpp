#include "lathe/widgets/dashboard.h"

#include <QFileInfo>
#include <QImage>
#include <QPageSize>
#include <QPdfWriter>
#include <QSplitter>
#include <QVBoxLayout>

#include <limits>

#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

std::string lastSegment(const std::string& key) {
    const auto slash = key.rfind('/');
    return slash == std::string::npos ? key : key.substr(slash + 1);
}

bool endsWith(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Dashboard::Dashboard(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    auto* split = new QSplitter(Qt::Vertical, this);
    m_loss = new MetricChart(tr("loss"), {QStringLiteral("train/loss"), QStringLiteral("val/loss")}, split);
    m_loss->setObjectName(QStringLiteral("lossChart"));
    m_accuracy = new MetricChart(tr("accuracy"),
                                 {QStringLiteral("train/accuracy"), QStringLiteral("val/accuracy")}, split);
    m_accuracy->setObjectName(QStringLiteral("accuracyChart"));
    // Accuracy rises towards the top right, so its legend goes where the curves are not.
    m_accuracy->setLegendAlignment(Qt::AlignBottom | Qt::AlignRight);
    split->addWidget(m_loss);
    split->addWidget(m_accuracy);
    split->setChildrenCollapsible(false);
    layout->addWidget(split);
}

QString Dashboard::tabTitle() const { return tr("Curves"); }

MetricChart* Dashboard::chartFor(const std::string& key) const {
    const std::string last = lastSegment(key);
    if (endsWith(last, "loss")) return m_loss;
    if (last.find("acc") != std::string::npos) return m_accuracy;
    return nullptr;
}

void Dashboard::clear() {
    m_shown.clear();
    m_lastStep.clear();
    m_loss->clear();
    m_accuracy->clear();
}

void Dashboard::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    clear();
    for (int64_t runId : runIds) {
        if (!m_shown.insert(runId).second) continue;
        for (const std::string& key : store.metricKeys(runId)) {
            MetricChart* chart = chartFor(key);
            if (!chart) continue;
            std::vector<core::MetricPoint> points = store.metrics(runId, key);
            // Top up with live points the store writer has not committed yet.
            auto live = m_live.find({runId, key});
            if (live != m_live.end()) {
                const int64_t last =
                    points.empty() ? std::numeric_limits<int64_t>::min() : points.back().step;
                for (const auto& p : live->second)
                    if (p.step > last) points.push_back(p);
            }
            chart->setSeries(runId, key, points);
            m_lastStep[{runId, key}] =
                points.empty() ? std::numeric_limits<int64_t>::min() : points.back().step;
        }
        // A live run whose keys are not in the store yet still shows what arrived.
        for (const auto& [series, points] : m_live) {
            if (series.first != runId || m_lastStep.count(series) || points.empty()) continue;
            if (MetricChart* chart = chartFor(series.second)) {
                chart->setSeries(runId, series.second, points);
                m_lastStep[series] = points.back().step;
            }
        }
    }
}

void Dashboard::plotLive(int64_t runId, const std::string& key, const core::MetricPoint& p) {
    MetricChart* chart = chartFor(key);
    if (!chart) return;
    m_live[{runId, key}].push_back(p);
    if (!isShown(runId)) return;
    auto [it, inserted] = m_lastStep.try_emplace({runId, key}, std::numeric_limits<int64_t>::min());
    if (p.step <= it->second) return;  // already loaded from the store
    it->second = p.step;
    chart->appendPoints(runId, key, {p});
}

void Dashboard::onEvent(int64_t runId, const core::Event& event) {
    if (event.type != core::Event::Type::Metric) return;
    core::MetricPoint p;
    p.step = event.step;
    p.value = event.value;
    p.wallTime = event.wallTime;
    plotLive(runId, event.key, p);
}

void Dashboard::onEvents(int64_t runId, const std::vector<core::Event>& events) {
    for (const auto& e : events) onEvent(runId, e);
}

void Dashboard::forgetLive(int64_t runId) {
    for (auto it = m_live.begin(); it != m_live.end();) {
        if (it->first.first == runId)
            it = m_live.erase(it);
        else
            ++it;
    }
}

bool Dashboard::exportCharts(const QString& path, int width, int height) {
    m_loss->flushStaged();
    m_accuracy->flushStaged();
    const int half = height / 2;
    const bool pdf = QFileInfo(path).suffix().compare(QLatin1String("pdf"), Qt::CaseInsensitive) == 0;
    if (pdf) {
        QPdfWriter writer(path);
        // 96 dpi device units keep fonts the same size relative to the plot as on screen.
        writer.setResolution(96);
        writer.setPageSize(QPageSize(QSizeF(width * 72.0 / 96.0, height * 72.0 / 96.0), QPageSize::Point));
        writer.setPageMargins(QMarginsF(0, 0, 0, 0));
        writer.setCreator(QStringLiteral("Lathe"));
        QCPPainter painter;
        if (!painter.begin(&writer)) return false;
        painter.setMode(QCPPainter::pmVectorized);
        painter.setMode(QCPPainter::pmNoCaching);
        m_loss->plot()->toPainter(&painter, width, half);
        painter.translate(0, half);
        m_accuracy->plot()->toPainter(&painter, width, height - half);
        return painter.end();
    }
    QImage image(width, height, QImage::Format_ARGB32_Premultiplied);
    image.fill(Qt::white);
    {
        QCPPainter painter(&image);
        painter.setRenderHint(QPainter::Antialiasing);
        m_loss->plot()->toPainter(&painter, width, half);
        painter.translate(0, half);
        m_accuracy->plot()->toPainter(&painter, width, height - half);
    }
    return image.save(path);
}

}  // namespace lathe::widgets

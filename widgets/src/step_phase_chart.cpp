#include "lathe/widgets/step_phase_chart.h"

#include <QMouseEvent>
#include <QToolTip>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>

#include "lathe/widgets/profile_timeline.h"
#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {
// Bottom to top in the order a step runs them; unknown phases go on top in order of appearance.
const char* const kPhaseOrder[] = {"data", "forward", "backward", "optimizer", "communication"};
}  // namespace

StepPhaseChart::StepPhaseChart(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_plot = new QCustomPlot(this);
    m_plot->setObjectName(QStringLiteral("phasePlot"));
    m_plot->setMinimumSize(220, 140);
    m_plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    m_plot->axisRect()->setRangeDrag(Qt::Horizontal);
    m_plot->axisRect()->setRangeZoom(Qt::Horizontal);
    m_plot->xAxis->setLabel(tr("step"));
    m_plot->yAxis->setLabel(tr("time per step (ms)"));
    m_plot->legend->setVisible(true);
    QFont legendFont = font();
    legendFont.setPointSizeF(std::max(7.0, legendFont.pointSizeF() - 1.0));
    m_plot->legend->setFont(legendFont);
    m_plot->legend->setBrush(QColor(255, 255, 255, 215));
    m_plot->legend->setBorderPen(QPen(QColor(0xbb, 0xbb, 0xbb)));
    // One legend row across the top, above the stacks (the y range leaves room for it).
    m_plot->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
    m_plot->legend->setWrap(5);
    m_plot->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignTop | Qt::AlignHCenter);
    m_plot->setMouseTracking(true);
    connect(m_plot, &QCustomPlot::mouseMove, this, [this](QMouseEvent* e) {
        if (e->buttons() == Qt::NoButton) hoverAt(e->position());
    });
    connect(m_plot, &QCustomPlot::mouseDoubleClick, this, [this](QMouseEvent*) {
        m_plot->rescaleAxes();
        m_plot->replot(QCustomPlot::rpQueuedReplot);
    });
    layout->addWidget(m_plot);
}

void StepPhaseChart::clear() { setPhases({}); }

void StepPhaseChart::setPhases(const std::vector<core::PhaseSummary>& steps) {
    m_plot->clearPlottables();
    m_bars.clear();
    m_steps = steps;
    std::vector<std::string> names;
    for (const char* n : kPhaseOrder)
        for (const auto& s : steps)
            if (std::any_of(s.phases.begin(), s.phases.end(), [&](const auto& p) { return p.first == n; })) {
                names.emplace_back(n);
                break;
            }
    for (const auto& s : steps)
        for (const auto& p : s.phases)
            if (std::find(names.begin(), names.end(), p.first) == names.end()) names.push_back(p.first);

    // Bars fill ~80% of the spacing between steps, whatever the step numbers are.
    double width = 0.8;
    if (steps.size() > 1) {
        double gap = 1e300;
        for (size_t i = 1; i < steps.size(); ++i)
            if (steps[i].step > steps[i - 1].step)
                gap = std::min(gap, double(steps[i].step - steps[i - 1].step));
        if (gap < 1e300) width = 0.8 * gap;
    }
    QCPBars* below = nullptr;
    for (const auto& name : names) {
        auto* bars = new QCPBars(m_plot->xAxis, m_plot->yAxis);
        const QColor color = ProfileTimeline::phaseColor(name);
        bars->setName(QString::fromStdString(name));
        bars->setBrush(color);
        bars->setPen(QPen(color.darker(130), 0.8));
        bars->setWidth(width);
        QVector<double> keys, values;
        for (const auto& s : steps) {
            double ns = 0;
            for (const auto& p : s.phases)
                if (p.first == name) ns += double(p.second);
            keys << double(s.step);
            values << ns / 1e6;
        }
        bars->setData(keys, values, true);
        if (below) bars->moveAbove(below);
        below = bars;
        m_bars.emplace_back(name, bars);
    }
    m_stepCount = int(steps.size());
    m_plot->legend->setVisible(!m_bars.empty());
    // Top of the stack first, as the bars read from the top.
    m_plot->legend->clearItems();
    for (auto it = m_bars.rbegin(); it != m_bars.rend(); ++it) it->second->addToLegend();
    if (!m_bars.empty()) {
        m_plot->rescaleAxes();
        const QCPRange x = m_plot->xAxis->range();
        m_plot->xAxis->setRange(x.lower - width, x.upper + width);
        m_plot->yAxis->setRangeLower(0);
        m_plot->yAxis->setRangeUpper(m_plot->yAxis->range().upper * 1.3);
    }
    // Integer steps only on the x axis.
    m_plot->xAxis->ticker()->setTickCount(std::min(8, std::max(2, m_stepCount)));
    m_plot->replot(QCustomPlot::rpQueuedReplot);
}

QStringList StepPhaseChart::phaseNames() const {
    QStringList out;
    for (const auto& [name, bars] : m_bars) out << QString::fromStdString(name);
    return out;
}

QCPBars* StepPhaseChart::bars(const std::string& phase) const {
    for (const auto& [name, bars] : m_bars)
        if (name == phase) return bars;
    return nullptr;
}

QString StepPhaseChart::hoverAt(const QPointF& pos) {
    if (m_steps.empty() || !m_plot->axisRect()->rect().contains(pos.toPoint())) {
        QToolTip::hideText();
        return {};
    }
    const double key = m_plot->xAxis->pixelToCoord(pos.x());
    const auto it = std::min_element(m_steps.begin(), m_steps.end(), [&](const auto& a, const auto& b) {
        return std::abs(double(a.step) - key) < std::abs(double(b.step) - key);
    });
    double total = 0;
    QString text = tr("step %1").arg(it->step);
    for (const auto& p : it->phases) {
        text += QStringLiteral("\n%1  %2 ms")
                    .arg(QString::fromStdString(p.first))
                    .arg(double(p.second) / 1e6, 0, 'f', 3);
        total += double(p.second);
    }
    text += tr("\ntotal  %1 ms").arg(total / 1e6, 0, 'f', 3);
    QToolTip::showText(m_plot->mapToGlobal(pos.toPoint()), text, m_plot);
    return text;
}

}  // namespace lathe::widgets

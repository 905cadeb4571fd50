#pragma once
// Stacked bars of the step phases (data, forward, backward, optimizer, communication) over
// the profiled steps, from core::phasesByStep(): one stack per step, one colour per phase
// (the timeline's phase colours), in milliseconds.
#include <QWidget>

#include <map>
#include <string>
#include <vector>

#include "lathe/core/profile_analysis.h"

class QCustomPlot;
class QCPBars;

namespace lathe::widgets {

class StepPhaseChart : public QWidget {
    Q_OBJECT
public:
    explicit StepPhaseChart(QWidget* parent = nullptr);

    void setPhases(const std::vector<core::PhaseSummary>& steps);
    void clear();

    /// Steps with a stack, and the phase layers (bottom to top).
    int stepCount() const { return m_stepCount; }
    QStringList phaseNames() const;
    QCPBars* bars(const std::string& phase) const;
    QCustomPlot* plot() const { return m_plot; }

    QString hoverAt(const QPointF& pos);

private:
    QCustomPlot* m_plot = nullptr;
    std::vector<std::pair<std::string, QCPBars*>> m_bars;  // bottom to top
    std::vector<core::PhaseSummary> m_steps;
    int m_stepCount = 0;
};

}  // namespace lathe::widgets

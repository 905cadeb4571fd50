#pragma once
// The Studies page's charts (studies_view.cpp), each a ChartPanel (Fit, Export…, hover) drawn
// whole from one read of a study — never fed live points, so nothing is ever staged:
// - StudyHistoryChart: every trial's value against its number, coloured by state, and the best
//   so far under the study's direction as a step line;
// - ParallelCoordinatesChart: one vertical axis per parameter (and the objective last) scaled to
//   [0, 1] — log for log-distributed parameters, choices spread evenly — and one polyline per
//   trial with a value, coloured by the objective on a colour scale;
// - ImportanceChart: core::parameterImportance as horizontal bars, most important on top;
// - PpoChoicesChart: what the PPO agent chose while each trial trained, `ppo/lr` (log axis) above
//   `ppo/batch` on linked step axes, one line per trial.
#include <QColor>
#include <QString>

#include <cstdint>
#include <string>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/core/studies.h"
#include "lathe/widgets/chart_panel.h"

class QCPAbstractItem;
class QCPAxisRect;
class QCPBars;
class QCPColorScale;
class QCPItemText;
class QCPItemTracer;

namespace lathe::widgets {

/// One read of a study: everything its table and charts show.
struct StudyDetail {
    core::StudyRecord study;
    std::vector<core::TrialRecord> trials;  // by number
    std::vector<core::ParamImportance> importance;
    /// PPO studies: the agent's choices during each trial's run (trials whose run has any).
    struct PpoSeries {
        int64_t trialNumber = 0;
        int64_t runId = 0;
        std::vector<core::MetricPoint> lr, batch;
    };
    std::vector<PpoSeries> ppo;
    std::string error;
};

/// The study's parameters: those of its space in order, then any other key its trials carry.
std::vector<std::string> studyParamKeys(const core::StudyRecord& study,
                                        const std::vector<core::TrialRecord>& trials);
/// Whether the space draws `key` log-distributed ("lr=loguniform(...)", "logint") or from a list.
bool isLogParam(const core::StudyRecord& study, const std::string& key);
bool isChoiceParam(const core::StudyRecord& study, const std::string& key);
/// The trials table's and the history chart's colour of a state.
QColor trialStateColor(core::TrialState state);
/// A study's value as the page writes it (5 significant digits).
QString valueText(double value);

class StudyChart : public ChartPanel {
public:
    /// Draws `detail` (replacing what was there) and fits the axes.
    virtual void showDetail(const StudyDetail& detail) = 0;
    /// Nothing shown, with `hint` in the middle.
    virtual void clearChart(const QString& hint) = 0;

    /// Points are never staged here: each read is drawn whole.
    void flushStaged() override {}
    void rescale() override;
    void exportDialog() override;
    QString hoverAt(const QPointF& pos) override;

protected:
    StudyChart(const QString& title, const QString& plotName, const QString& exportName, QWidget* parent);
    /// The axes' ranges for the data shown.
    virtual void fit() = 0;
    /// The hover text at `pos` (empty: none), with m_tracer placed on what it describes.
    virtual QString hoverText(const QPointF& pos) = 0;
    /// Shows or hides m_hint (in the first axis rect) with `text`.
    void setHint(const QString& text);
    /// Puts m_tracer at (key, value) of `rect`'s bottom and left axes.
    void placeTracer(QCPAxisRect* rect, double key, double value);

    QCPItemTracer* m_tracer = nullptr;
    QCPItemText* m_hint = nullptr;
    QString m_exportName;
};

class StudyHistoryChart : public StudyChart {
public:
    explicit StudyHistoryChart(QWidget* parent = nullptr);
    void showDetail(const StudyDetail& detail) override;
    void clearChart(const QString& hint) override;
    /// The best-so-far step line (null before a study is shown).
    QCPGraph* bestSoFar() const { return m_best; }
    /// Trials drawn as dots (those with a value).
    int dotCount() const { return int(m_dots.size()); }

protected:
    void fit() override;
    QString hoverText(const QPointF& pos) override;

private:
    struct Dot {
        int64_t number = 0;
        double value = 0;
        QString text;
    };
    std::vector<Dot> m_dots;
    QCPGraph* m_best = nullptr;
};

class ParallelCoordinatesChart : public StudyChart {
public:
    explicit ParallelCoordinatesChart(QWidget* parent = nullptr);
    void showDetail(const StudyDetail& detail) override;
    void clearChart(const QString& hint) override;
    /// Polylines drawn: one per trial with a value.
    int lineCount() const { return int(m_lines.size()); }
    /// The axes, left to right: the parameters, then the objective.
    const std::vector<std::string>& axisKeys() const { return m_keys; }
    QCPColorScale* colorScale() const { return m_scale; }

protected:
    void fit() override;
    QString hoverText(const QPointF& pos) override;

private:
    struct Line {
        int64_t number = 0;
        std::vector<double> y;        // per axis, in [0, 1]; NaN: the trial has no such value
        std::vector<QString> values;  // per axis, as written
    };
    void clearAxes();
    std::vector<std::string> m_keys;
    std::vector<Line> m_lines;
    std::vector<QCPAbstractItem*> m_axisItems;  // the axes' lines and labels
    QCPColorScale* m_scale = nullptr;
};

class ImportanceChart : public StudyChart {
public:
    explicit ImportanceChart(QWidget* parent = nullptr);
    void showDetail(const StudyDetail& detail) override;
    void clearChart(const QString& hint) override;
    QCPBars* bars() const { return m_bars; }
    /// The parameters as drawn, top to bottom (most important first).
    const std::vector<core::ParamImportance>& shown() const { return m_shown; }

protected:
    void fit() override;
    QString hoverText(const QPointF& pos) override;

private:
    QCPBars* m_bars = nullptr;
    std::vector<core::ParamImportance> m_shown;
    std::vector<QCPAbstractItem*> m_labels;  // the shares written beside the bars
};

class PpoChoicesChart : public StudyChart {
public:
    explicit PpoChoicesChart(QWidget* parent = nullptr);
    void showDetail(const StudyDetail& detail) override;
    void clearChart(const QString& hint) override;
    QCPAxisRect* lrRect() const { return m_lrRect; }
    QCPAxisRect* batchRect() const { return m_batchRect; }
    /// Lines with points in the learning-rate (false) or the batch-size (true) rect.
    int lineCount(bool batch) const;

protected:
    void fit() override;
    QString hoverText(const QPointF& pos) override;

private:
    struct Line {
        QCPGraph* graph = nullptr;
        int64_t trialNumber = 0;
        int64_t runId = 0;
    };
    QCPAxisRect* m_lrRect = nullptr;
    QCPAxisRect* m_batchRect = nullptr;
    std::vector<Line> m_lines;
};

}  // namespace lathe::widgets

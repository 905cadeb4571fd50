#pragma once
// What MetricChart, LossScaleView and CommView share: a header row (title, optional summary,
// "Fit" and "Export…"), one QCustomPlot below it with drag/zoom, a context menu, hover on
// mouse move, the single-shot timer that coalesces staged live points, and PNG/PDF export
// that flushes the staged points first. The views own their data, staging and hover text.
#include <QColor>
#include <QSize>
#include <QString>
#include <QWidget>
#include <vector>

class QCPAxis;
class QCPAxisRect;
class QCPGraph;
class QCPItemText;
class QCPItemTracer;
class QCustomPlot;
class QLabel;
class QMouseEvent;
class QPointF;
class QTimer;

namespace lathe::widgets {

class ChartPanel : public QWidget {
    Q_OBJECT
public:
    ~ChartPanel() override;

    /// Timer flushes that moved staged points into the graphs.
    int flushCount() const { return m_flushCount; }
    /// Replots actually performed by QCustomPlot (after coalescing).
    int replotCount() const { return m_replotCount; }
    void setFlushInterval(int ms);

    bool savePng(const QString& path, int width = 0, int height = 0, double scale = 1.0);
    bool savePdf(const QString& path, int width = 0, int height = 0);

    QCustomPlot* plot() const { return m_plot; }

    /// Moves staged points into the graphs (the views declare these as slots).
    virtual void flushStaged() = 0;
    virtual void rescale() = 0;
    virtual void exportDialog() = 0;
    virtual QString hoverAt(const QPointF& pos) = 0;

protected:
    /// Builds the header row and the plot; `withSummary` puts a grey summary label after the title.
    ChartPanel(const QString& titleHtml, bool withSummary, const QString& exportToolTip,
               const QString& plotName, const QSize& plotMinimumSize, QWidget* parent);

    /// Asks for a file name and saves PNG (2x) or PDF by its suffix.
    void exportWithDialog(const QString& caption, const QString& defaultName);
    /// Shows `text` as the tooltip at `pos`, or hides the tracer and tooltip when it is empty;
    /// replots when the text changed.
    void showHover(const QPointF& pos, const QString& text, QCPItemTracer* tracer);
    /// The key of the data point nearest to pixel column `pixelX` among `graphs`, if one lies within
    /// `radiusPx` pixels; NaN otherwise (hover snapping).
    static double nearestKey(const std::vector<QCPGraph*>& graphs, QCPAxis* x, double pixelX,
                             double radiusPx);
    /// Shows the legend in the views' common style: a smaller font on a translucent white box.
    void styleLegend();
    /// The plot's first axis rect and new ones below it, one per stretch factor, sharing one step
    /// axis: left and right margins aligned, drag and wheel on the step axis only (the value axes
    /// are fitted), step tick labels and the "step" label under the bottom rect alone, and the
    /// step ranges linked.
    std::vector<QCPAxisRect*> stackStepRects(const std::vector<double>& stretches);
    /// A grey text centred on `rect` for "nothing to show yet" hints (`larger`: one point up).
    QCPItemText* makeHint(QCPAxisRect* rect, const QColor& color, bool larger);

    QLabel* m_titleLabel = nullptr;
    QLabel* m_summary = nullptr;  // null without a summary
    QCustomPlot* m_plot = nullptr;
    QTimer* m_flushTimer = nullptr;
    int m_flushCount = 0;
    int m_replotCount = 0;
    bool m_follow = true;  // fit axes on every flush until the user pans or zooms
    QString m_hoverText;

private:
    void onMouseMove(QMouseEvent* event);
};

}  // namespace lathe::widgets

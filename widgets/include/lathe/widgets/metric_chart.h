#pragma once
// One QCustomPlot chart for a set of metric keys (e.g. train/loss + val/loss) of several runs
// overlaid: one colour per run, one line style per key. Live points go through a staging
// buffer: appendPoints() only copies, and a ~40 ms timer moves everything staged into the
// graphs at once and asks for a single queued replot, so a fast training loop never causes
// one replot per sample.
#include <QColor>
#include <QString>
#include <QStringList>
#include <QThreadPool>

#include <QRgb>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/store.h"
#include "lathe/widgets/chart_panel.h"

class QCustomPlot;
class QCPGraph;
class QCPItemTracer;
class QCPItemText;

namespace lathe::widgets {

struct OverlayData;
struct OverlayFrame;
class RunOverlayLayer;

class MetricChart : public ChartPanel {
    Q_OBJECT
public:
    /// `keys` fixes the line style order (first key solid, second dashed...); other keys
    /// may still be added and get the next style.
    MetricChart(const QString& title, const QStringList& keys, QWidget* parent = nullptr);
    ~MetricChart() override;

    QString title() const { return m_title; }
    QStringList keys() const { return m_keys; }

    /// Replaces the history of one series (alreadySorted: points come ordered by step).
    void setSeries(int64_t runId, const std::string& key, const std::vector<core::MetricPoint>& points);
    /// Stages live points; cheap, may be called for every sample. They appear after the
    /// coalescing timer fires.
    void appendPoints(int64_t runId, const std::string& key, std::vector<core::MetricPoint> points);
    void appendPoint(int64_t runId, const std::string& key, int64_t step, double value);
    void removeRun(int64_t runId);
    void clear();

    /// Points in the graphs (staged points not included).
    int pointCount(int64_t runId, const std::string& key) const;
    int stagedCount() const;
    int graphCount() const;
    /// Last step in the graph of a series, or INT64_MIN when empty/absent.
    int64_t lastStep(int64_t runId, const std::string& key) const;
    QColor runColor(int64_t runId);

    int flushInterval() const;
    /// QCustomPlot's adaptive sampling for every graph (on by default; the benchmark turns it off).
    void setAdaptiveSampling(bool on);
    bool adaptiveSampling() const { return m_adaptiveSampling; }

    /// Shows the tracer and tooltip for the data point nearest to `pos` (plot pixels);
    /// returns the text shown, empty when nothing is near.
    QString hoverAt(const QPointF& pos) override;
    QString hoverText() const { return m_hoverText; }

    /// Pixel position of a data point, for tests.
    QPointF pixelFor(double step, double value) const;

    /// Where the legend sits inside the axis rect (loss: top right, accuracy: bottom right).
    void setLegendAlignment(Qt::Alignment alignment);

    QCPGraph* graph(int64_t runId, const std::string& key) const;

    // ---- overlay of many runs (run_overlay.h) ---------------------------------------------
    /// Draws `data`'s curves as one layer under the graphs, `colors` one per curve, rendered off
    /// the GUI thread for the current axes (again after every pan, zoom or resize). `note`
    /// replaces the legend's entries in the header ("1,000 runs · colour: lr").
    void setOverlay(std::shared_ptr<const OverlayData> data, std::vector<QRgb> colors, const QString& note);
    /// New colours for the same curves (colour by another parameter).
    void setOverlayColors(std::vector<QRgb> colors, const QString& note);
    void clearOverlay();
    bool hasOverlay() const { return m_overlay != nullptr; }
    const OverlayData* overlayData() const { return m_overlay.get(); }
    /// A line in the header while an overlay loads ("loading 430 of 1,000 runs…"); empty clears it.
    void setOverlayStatus(const QString& text);
    /// Whether the layer shows an image rendered for the current axes and size, with no render
    /// in flight or waiting (tests and the benchmark wait for this).
    bool overlayCurrent() const;
    int overlayRenderCount() const { return m_overlayRenders; }
    /// The line shown in the header: the overlay's note, or its loading status.
    QString headerNote() const;

public Q_SLOTS:
    /// Moves staged points into the graphs and requests one queued replot.
    void flushStaged() override;
    /// Fits the axes to the data and resumes following new points.
    void rescale() override;
    /// Asks for a file name and saves PNG or PDF by its suffix.
    void exportDialog() override;

Q_SIGNALS:
    /// After a flush moved `points` staged points into the graphs.
    void flushed(int points);

private:
    using SeriesKey = std::pair<int64_t, std::string>;
    QCPGraph* ensureGraph(int64_t runId, const std::string& key);
    int keyStyleIndex(const std::string& key);
    void applyAutoRange();
    void updateEmptyHint();
    void scheduleOverlayRender();
    void startOverlayRender();
    QString overlayHover(const QPointF& pos);

    QString m_title;
    QStringList m_keys;
    QCPItemTracer* m_tracer = nullptr;
    QCPItemText* m_emptyHint = nullptr;
    std::map<SeriesKey, QCPGraph*> m_graphs;
    std::map<SeriesKey, std::vector<core::MetricPoint>> m_staged;
    int m_stagedCount = 0;
    std::map<int64_t, int> m_runColorIndex;
    bool m_adaptiveSampling = true;

    std::shared_ptr<const OverlayData> m_overlay;
    std::vector<QRgb> m_overlayColors;
    QString m_overlayNote, m_overlayStatus;
    RunOverlayLayer* m_overlayLayer = nullptr;
    QTimer* m_overlayTimer = nullptr;                   // coalesces pans, zooms and resizes into one render
    QThreadPool m_renderPool;                           // one thread; waited for in the destructor
    std::shared_ptr<std::atomic<bool>> m_renderCancel;  // the render in flight's
    bool m_rendering = false, m_renderAgain = false;
    bool m_overlayDirty = false;  // data or colours changed since the image on the layer
    uint64_t m_overlayGeneration = 0;
    int m_overlayRenders = 0;
};

}  // namespace lathe::widgets

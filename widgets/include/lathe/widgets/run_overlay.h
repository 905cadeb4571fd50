#pragma once
// Many runs' curves drawn as one layer: the overlay a MetricChart switches to beyond a dozen runs.
// The points live in an immutable OverlayData shared with worker threads. A render reduces each
// curve to its pixel columns (the span of values in each column, joined to the next), blends
// every curve into one image off the GUI thread, and hands the image back. The chart's layer then
// draws that image, stretched to the current axis ranges until the render for those ranges
// arrives, so panning and zooming never wait for the points.
#include <QImage>
#include <QRgb>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

/// One curve of the overlay: a run's series, ordered by step.
struct OverlayCurve {
    int64_t runId = 0;
    std::string key;
    int style = 0;  // the chart's line style of the key: 0 solid, otherwise dotted
    std::vector<float> x, y;
};

/// The curves of one chart, and the bounds of their finite points.
struct OverlayData {
    std::vector<OverlayCurve> curves;
    int64_t points = 0;
    double xMin = 0, xMax = 0, yMin = 0, yMax = 0;
    bool hasBounds = false;
    /// Computes points and bounds from the curves.
    void finish();
};

/// What a render draws: the data ranges it maps onto `size` pixels, and one colour per curve.
struct OverlayFrame {
    QCPRange x, y;
    QSize size;
};

/// Blends every curve into a transparent image of frame.size pixels (thread-safe; call it off the
/// GUI thread). `colors` has one entry per curve; alpha follows the number of curves so that
/// where many runs agree the colour is dense. Returns a null image when `cancelled` becomes true
/// (checked between curves).
QImage renderOverlay(const OverlayData& data, const std::vector<QRgb>& colors, const OverlayFrame& frame,
                     const std::atomic<bool>* cancelled = nullptr);

/// The opacity one curve is drawn with when `curves` are overlaid (0..255).
int overlayAlpha(size_t curves);

/// The layerable that draws a rendered overlay image in its axis rect, mapped from the frame it
/// was rendered for to the axes' current ranges.
class RunOverlayLayer : public QCPLayerable {
    Q_OBJECT
public:
    RunOverlayLayer(QCustomPlot* plot, QCPAxisRect* rect, const QString& layer);

    void setImage(const QImage& image, const OverlayFrame& frame);
    void clearImage();
    bool hasImage() const { return !m_image.isNull(); }
    const OverlayFrame& frame() const { return m_frame; }
    /// The frame the axis rect shows now (ranges and pixel size at the device pixel ratio).
    OverlayFrame currentFrame() const;

protected:
    void applyDefaultAntialiasingHint(QCPPainter* painter) const override;
    void draw(QCPPainter* painter) override;
    QRect clipRect() const override;

private:
    QCPAxisRect* m_rect;
    QImage m_image;
    OverlayFrame m_frame;
};

}  // namespace lathe::widgets

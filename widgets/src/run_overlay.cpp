#include "lathe/widgets/run_overlay.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lathe::widgets {

void OverlayData::finish() {
    points = 0;
    hasBounds = false;
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& c : curves) {
        points += int64_t(c.x.size());
        for (size_t i = 0; i < c.x.size(); ++i) {
            if (!std::isfinite(c.y[i])) continue;
            x0 = std::min<double>(x0, c.x[i]);
            x1 = std::max<double>(x1, c.x[i]);
            y0 = std::min<double>(y0, c.y[i]);
            y1 = std::max<double>(y1, c.y[i]);
        }
    }
    if (x0 <= x1) {
        xMin = x0, xMax = x1, yMin = y0, yMax = y1;
        hasBounds = true;
    }
}

int overlayAlpha(size_t curves) {
    // One curve alone is drawn nearly opaque; a thousand are faint each, dense where they agree.
    const double a = 4.0 / std::sqrt(double(std::max<size_t>(curves, 1)));
    return std::clamp(int(std::lround(255.0 * std::min(a, 0.85))), 18, 217);
}

namespace {

// Premultiplied source-over of one colour at one alpha into an ARGB32_Premultiplied pixel.
struct Blender {
    uint32_t r, g, b, a, inv;
    Blender(QRgb color, int alpha)
        : r(uint32_t(qRed(color) * alpha + 127) / 255),
          g(uint32_t(qGreen(color) * alpha + 127) / 255),
          b(uint32_t(qBlue(color) * alpha + 127) / 255),
          a(uint32_t(alpha)),
          inv(255u - uint32_t(alpha)) {}
    void operator()(QRgb& px) const {
        auto mix = [this](uint32_t dst, uint32_t src) {
            uint32_t t = dst * inv + 128;
            return src + ((t + (t >> 8)) >> 8);
        };
        px = qRgba(int(mix(uint32_t(qRed(px)), r)), int(mix(uint32_t(qGreen(px)), g)),
                   int(mix(uint32_t(qBlue(px)), b)), int(mix(uint32_t(qAlpha(px)), a)));
    }
};

// Fills one pixel column of one curve: rows lo..hi (fractional, any order of magnitude).
struct ColumnPainter {
    uchar* bits;  // the image's first scan line
    qsizetype stride;
    const Blender& blend;
    int w, h;
    bool dotted;
    void operator()(int col, double lo, double hi) const {
        if (col < 0 || col >= w) return;
        if (dotted && ((col >> 2) & 1)) return;
        if (!(hi >= 0) || !(lo <= h)) return;  // also NaN; a value at the bottom edge is row h-1
        // Clamped as doubles: far off-screen rows would overflow an int.
        const int r0 = int(std::max(0.0, std::floor(lo)));
        const int r1 = int(std::min(double(h - 1), std::floor(hi)));
        for (int r = r0; r <= r1; ++r) blend(reinterpret_cast<QRgb*>(bits + r * stride)[col]);
    }
};

void drawCurve(const OverlayCurve& c, const OverlayFrame& f, const ColumnPainter& paint) {
    const size_t n = c.x.size();
    if (n == 0) return;
    const double x0 = f.x.lower, sx = double(paint.w) / (f.x.upper - f.x.lower);
    const double y1 = f.y.upper, sy = double(paint.h) / (f.y.upper - f.y.lower);
    // The points in view and one on either side, so that lines into the view are drawn.
    size_t i = size_t(std::lower_bound(c.x.begin(), c.x.end(), float(f.x.lower)) - c.x.begin());
    size_t end = size_t(std::upper_bound(c.x.begin(), c.x.end(), float(f.x.upper)) - c.x.begin());
    i = i > 0 ? i - 1 : 0;
    end = std::min(n, end + 1);

    bool open = false;  // a column is being collected
    int col = 0;
    double lo = 0, hi = 0, lastX = 0, lastY = 0;
    for (; i < end; ++i) {
        const double y = c.y[i];
        if (!std::isfinite(y)) {  // a gap: the line breaks
            if (open) paint(col, lo, hi);
            open = false;
            continue;
        }
        const double px = (double(c.x[i]) - x0) * sx, py = (y1 - y) * sy;
        const double cx = std::floor(px);
        if (!open) {
            col = int(std::clamp(cx, -1.0, double(paint.w)));
            lo = hi = lastY = py;
            lastX = px;
            open = true;
            continue;
        }
        if (cx <= col || px <= lastX) {  // same column (or a repeated step)
            lo = std::min(lo, py), hi = std::max(hi, py);
            lastX = std::max(lastX, px), lastY = py;
            continue;
        }
        // The segment from (lastX, lastY) to (px, py) leaves this column and crosses the ones
        // between: each gets the span of the segment inside it.
        const double slope = (py - lastY) / (px - lastX);
        auto at = [&](double xx) { return lastY + (xx - lastX) * slope; };
        const double exitY = at(col + 1.0);
        paint(col, std::min({lo, exitY}), std::max({hi, exitY}));
        const int first = std::max(col + 1, 0), last = int(std::min(cx, double(paint.w))) - 1;
        for (int k = first; k <= last; ++k) {
            const double a = at(k), b = at(k + 1.0);
            paint(k, std::min(a, b), std::max(a, b));
        }
        const double entryY = at(cx);
        col = int(std::min(cx, double(paint.w)));
        lo = std::min(entryY, py), hi = std::max(entryY, py);
        lastX = px, lastY = py;
    }
    if (open) paint(col, lo, hi);
}

}  // namespace

QImage renderOverlay(const OverlayData& data, const std::vector<QRgb>& colors, const OverlayFrame& frame,
                     const std::atomic<bool>* cancelled) {
    const int w = frame.size.width(), h = frame.size.height();
    if (w <= 0 || h <= 0 || !(frame.x.upper > frame.x.lower) || !(frame.y.upper > frame.y.lower)) return {};
    QImage image(w, h, QImage::Format_ARGB32_Premultiplied);
    if (image.isNull()) return {};  // out of memory
    image.fill(Qt::transparent);
    const int alpha = overlayAlpha(data.curves.size());
    uchar* bits = image.bits();  // detaches once, not per pixel
    const qsizetype stride = image.bytesPerLine();
    for (size_t k = 0; k < data.curves.size(); ++k) {
        if (cancelled && cancelled->load(std::memory_order_relaxed)) return {};
        const QRgb color = k < colors.size() ? colors[k] : qRgb(0x1f, 0x77, 0xb4);
        const Blender blend(color, alpha);
        const ColumnPainter paint{bits, stride, blend, w, h, data.curves[k].style != 0};
        drawCurve(data.curves[k], frame, paint);
    }
    return image;
}

RunOverlayLayer::RunOverlayLayer(QCustomPlot* plot, QCPAxisRect* rect, const QString& layer)
    : QCPLayerable(plot, layer), m_rect(rect) {}

void RunOverlayLayer::setImage(const QImage& image, const OverlayFrame& frame) {
    m_image = image;
    m_frame = frame;
}

void RunOverlayLayer::clearImage() {
    m_image = QImage();
    m_frame = {};
}

OverlayFrame RunOverlayLayer::currentFrame() const {
    OverlayFrame f;
    f.x = m_rect->axis(QCPAxis::atBottom)->range();
    f.y = m_rect->axis(QCPAxis::atLeft)->range();
    const double dpr = mParentPlot->bufferDevicePixelRatio();
    f.size = QSize(int(std::lround(m_rect->width() * dpr)), int(std::lround(m_rect->height() * dpr)));
    return f;
}

void RunOverlayLayer::applyDefaultAntialiasingHint(QCPPainter* painter) const {
    applyAntialiasingHint(painter, false, QCP::aeOther);
}

QRect RunOverlayLayer::clipRect() const { return m_rect->rect(); }

void RunOverlayLayer::draw(QCPPainter* painter) {
    if (m_image.isNull()) return;
    // The image covers the data rectangle it was rendered for: place that rectangle under the
    // current axes (stretched while a render for the new ranges is on its way).
    QCPAxis* x = m_rect->axis(QCPAxis::atBottom);
    QCPAxis* y = m_rect->axis(QCPAxis::atLeft);
    const QRectF target(QPointF(x->coordToPixel(m_frame.x.lower), y->coordToPixel(m_frame.y.upper)),
                        QPointF(x->coordToPixel(m_frame.x.upper), y->coordToPixel(m_frame.y.lower)));
    painter->setRenderHint(QPainter::SmoothPixmapTransform, false);
    painter->drawImage(target, m_image);
}

}  // namespace lathe::widgets

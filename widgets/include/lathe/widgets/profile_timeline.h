#pragma once
// The profile timeline: one lane per thread, the step phases in their own row above the
// thread's op rows (one row per nesting depth). Painted directly with QPainter instead of one
// plot item per span: a paint only visits the spans that intersect the visible time range
// (binary search per row, since spans of one row never overlap) and everything narrower than a
// pixel collapses into one column per pixel, so 100,000 spans cost what the screen shows.
#include <QWidget>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lathe/core/profile_analysis.h"

namespace lathe::widgets {

/// Spans laid out in rows; built once per run (off the GUI thread) and shared read-only.
struct TimelineLayout {
    struct Row {
        int64_t thread = 0;
        bool phases = false;          // the thread's phase row (else an op row)
        int depth = 0;                // nesting depth within the row kind
        std::vector<uint32_t> spans;  // indices into `spans`, ordered by start (and end)
    };
    std::vector<core::ProfileSpan> spans;
    std::vector<Row> rows;
    int64_t startNs = 0;  // earliest start
    int64_t endNs = 0;    // latest end
    struct StepMark {
        int64_t step = 0;
        int64_t startNs = 0;
    };
    std::vector<StepMark> steps;  // where each step begins, ordered by time

    /// Lays out `spans` (any order). Spans that overlap without nesting go one row deeper.
    static std::shared_ptr<const TimelineLayout> build(std::vector<core::ProfileSpan> spans);
};

class ProfileTimeline : public QWidget {
    Q_OBJECT
public:
    explicit ProfileTimeline(QWidget* parent = nullptr);

    void setLayoutData(std::shared_ptr<const TimelineLayout> layout);
    const TimelineLayout* layoutData() const { return m_layout.get(); }
    void clear();

    /// Visible time range in ns (same clock as ProfileSpan::startNs).
    void setViewRange(double startNs, double endNs);
    double viewStart() const { return m_viewStart; }
    double viewEnd() const { return m_viewEnd; }
    /// Shows everything.
    void fitAll();
    /// Zooms by `factor` (< 1 zooms in) around the time at widget x `anchorX`.
    void zoom(double factor, double anchorX);

    /// Off paints every span as its own rectangle, without culling or merging: the
    /// benchmark's baseline. On by default.
    void setCulling(bool on) { m_culling = on; }
    bool culling() const { return m_culling; }

    struct PaintStats {
        int visibleSpans = 0;  // spans intersecting the view
        int rects = 0;         // rectangles actually drawn
        int labels = 0;
    };
    PaintStats lastPaintStats() const { return m_stats; }

    /// The span under widget position `pos` (with a few pixels of slack for thin spans), or -1.
    int spanAt(const QPointF& pos) const;
    /// What the tooltip shows for a span.
    QString describe(int spanIndex) const;
    /// Shows the tooltip for `pos` and returns its text (empty when no span is there).
    QString hoverAt(const QPointF& pos);
    QString hoverText() const { return m_hoverText; }

    /// Geometry, for tests and hit testing.
    int rowTop(int row) const;
    int rowHeight(const TimelineLayout::Row& row) const;
    double timeToX(double ns) const;
    double xToTime(double x) const;
    QRect plotArea() const;
    /// Height that shows every lane without scrolling.
    int preferredHeight() const;

    static QColor phaseColor(const std::string& name);
    static QColor opColor(const std::string& name);

    QSize sizeHint() const override { return {900, 320}; }
    QSize minimumSizeHint() const override { return {300, 120}; }

Q_SIGNALS:
    void viewRangeChanged(double startNs, double endNs);

protected:
    void paintEvent(QPaintEvent* event) override;
    void wheelEvent(QWheelEvent* event) override;
    void mousePressEvent(QMouseEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;
    void mouseReleaseEvent(QMouseEvent* event) override;
    void mouseDoubleClickEvent(QMouseEvent* event) override;
    void leaveEvent(QEvent* event) override;

private:
    void paintRow(QPainter& p, const TimelineLayout::Row& row, int y, int h, const QRect& area);
    void paintRowNaive(QPainter& p, const TimelineLayout::Row& row, int y, int h);
    void paintAxis(QPainter& p, const QRect& area);
    int rowAtY(double y) const;
    int contentHeight() const;
    void clampView();

    std::shared_ptr<const TimelineLayout> m_layout;
    std::vector<int> m_rowTops;  // y of each row inside the scrolled content
    double m_viewStart = 0;
    double m_viewEnd = 1;
    int m_scrollY = 0;  // vertical offset when the rows do not fit
    bool m_culling = true;
    PaintStats m_stats;
    QString m_hoverText;
    int m_hoverSpan = -1;
    bool m_dragging = false;
    QPointF m_dragOrigin;
    double m_dragViewStart = 0;
    int m_dragScrollY = 0;
};

}  // namespace lathe::widgets

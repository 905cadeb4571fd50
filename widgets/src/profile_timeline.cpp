#include "lathe/widgets/profile_timeline.h"

#include <QCoreApplication>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "profile_format.h"

namespace lathe::widgets {

namespace {

// Lane names: the training thread, its helper threads, and a pipeline's later stages (whose
// spans come on threads stage * kStageLaneStride + t).
QString laneName(int64_t thread) {
    const int64_t stage = thread / core::kStageLaneStride, t = thread % core::kStageLaneStride;
    const QString name = t == 0 ? QCoreApplication::translate("ProfileTimeline", "training")
                                : QCoreApplication::translate("ProfileTimeline", "thread %1").arg(t);
    if (thread < core::kStageLaneStride) return name;
    return QCoreApplication::translate("ProfileTimeline", "stage %1 %2").arg(stage).arg(name);
}

constexpr int kGutter = 118;     // lane labels
constexpr int kAxisHeight = 32;  // time axis and step labels
constexpr int kPhaseRowHeight = 22;
constexpr int kOpRowHeight = 18;
constexpr int kLaneGap = 10;  // between threads
constexpr double kHoverSlackPx = 3.0;
constexpr double kMinLabelPx = 34.0;
constexpr double kWheelZoom = 0.8;  // per wheel notch

int64_t endOf(const core::ProfileSpan& s) { return s.startNs + std::max<int64_t>(0, s.durationNs); }

uint32_t fnv1a(const std::string& s) {
    uint32_t h = 2166136261u;
    for (unsigned char c : s) {
        h ^= c;
        h *= 16777619u;
    }
    return h;
}

}  // namespace

// ---- layout -------------------------------------------------------------------------------

std::shared_ptr<const TimelineLayout> TimelineLayout::build(std::vector<core::ProfileSpan> spans) {
    auto layout = std::make_shared<TimelineLayout>();
    layout->spans = std::move(spans);
    const auto& sp = layout->spans;
    if (sp.empty()) return layout;

    std::vector<uint32_t> order(sp.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    // Per thread, phases before ops, by start; at equal starts the longer (outer) span first.
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        const auto& x = sp[a];
        const auto& y = sp[b];
        const bool xp = x.kind == core::ProfileSpan::Kind::Phase,
                   yp = y.kind == core::ProfileSpan::Kind::Phase;
        return std::make_tuple(x.thread, !xp, x.startNs, -x.durationNs) <
               std::make_tuple(y.thread, !yp, y.startNs, -y.durationNs);
    });

    layout->startNs = sp[order.front()].startNs;
    layout->endNs = endOf(sp[order.front()]);
    std::map<int64_t, int64_t> stepStart;
    // Nesting depth from a stack of open intervals: a span goes one deeper than the innermost
    // open span that still covers its start, so spans of one row never overlap.
    std::vector<uint32_t> stack;
    std::map<std::tuple<int64_t, bool, int>, size_t> rowIndex;  // (thread, !phase, depth)
    std::vector<std::tuple<int64_t, bool, int>> rowKeys;
    std::vector<std::vector<uint32_t>> rowSpans;
    int64_t groupThread = 0;
    bool groupPhase = false, first = true;
    for (uint32_t i : order) {
        const auto& s = sp[i];
        const bool phase = s.kind == core::ProfileSpan::Kind::Phase;
        if (first || s.thread != groupThread || phase != groupPhase) {
            stack.clear();
            groupThread = s.thread;
            groupPhase = phase;
            first = false;
        }
        while (!stack.empty() && endOf(sp[stack.back()]) <= s.startNs) stack.pop_back();
        const int depth = int(stack.size());
        stack.push_back(i);
        const auto key = std::make_tuple(s.thread, !phase, depth);
        auto [it, inserted] = rowIndex.try_emplace(key, rowSpans.size());
        if (inserted) {
            rowKeys.push_back(key);
            rowSpans.emplace_back();
        }
        rowSpans[it->second].push_back(i);
        layout->startNs = std::min(layout->startNs, s.startNs);
        layout->endNs = std::max(layout->endNs, endOf(s));
        auto [st, fresh] = stepStart.try_emplace(s.step, s.startNs);
        if (!fresh) st->second = std::min(st->second, s.startNs);
    }
    // Rows in display order: the map's key order is thread, phases first, depth.
    for (const auto& [key, index] : rowIndex) {
        Row row;
        row.thread = std::get<0>(key);
        row.phases = !std::get<1>(key);
        row.depth = std::get<2>(key);
        row.spans = std::move(rowSpans[index]);
        layout->rows.push_back(std::move(row));
    }
    for (const auto& [step, start] : stepStart) layout->steps.push_back({step, start});
    std::sort(layout->steps.begin(), layout->steps.end(),
              [](const StepMark& a, const StepMark& b) { return a.startNs < b.startNs; });
    return layout;
}

// ---- widget -------------------------------------------------------------------------------

ProfileTimeline::ProfileTimeline(QWidget* parent) : QWidget(parent) {
    setMouseTracking(true);
    setAttribute(Qt::WA_OpaquePaintEvent);
    setFocusPolicy(Qt::WheelFocus);
    setToolTip({});  // tooltips are shown by hoverAt
}

QColor ProfileTimeline::phaseColor(const std::string& name) {
    if (name == "data") return QColor(0x4e, 0x79, 0xa7);
    if (name == "forward") return QColor(0x59, 0xa1, 0x4f);
    if (name == "backward") return QColor(0xf2, 0x8e, 0x2b);
    if (name == "optimizer") return QColor(0xe1, 0x57, 0x59);
    if (name == "communication") return QColor(0xb0, 0x7a, 0xa1);
    return QColor(0x9d, 0x97, 0x93);
}

QColor ProfileTimeline::opColor(const std::string& name) {
    // A stable hash (not std::hash) so an op keeps its colour across sessions and runs.
    const uint32_t h = fnv1a(name);
    return QColor::fromHsv(int(h % 360), 70 + int((h >> 9) % 50), 225 + int((h >> 17) % 25));
}

void ProfileTimeline::setLayoutData(std::shared_ptr<const TimelineLayout> layout) {
    m_layout = std::move(layout);
    m_rowTops.clear();
    int y = 0;
    int64_t thread = 0;
    bool firstRow = true;
    if (m_layout) {
        for (const auto& row : m_layout->rows) {
            if (!firstRow && row.thread != thread) y += kLaneGap;
            firstRow = false;
            thread = row.thread;
            m_rowTops.push_back(y);
            y += rowHeight(row);
        }
    }
    m_scrollY = 0;
    m_hoverSpan = -1;
    m_hoverText.clear();
    fitAll();
}

void ProfileTimeline::clear() { setLayoutData(nullptr); }

int ProfileTimeline::rowHeight(const TimelineLayout::Row& row) const {
    return row.phases ? kPhaseRowHeight : kOpRowHeight;
}

int ProfileTimeline::preferredHeight() const { return kAxisHeight + contentHeight() + 12; }

int ProfileTimeline::contentHeight() const {
    if (!m_layout || m_layout->rows.empty()) return 0;
    return m_rowTops.back() + rowHeight(m_layout->rows.back());
}

QRect ProfileTimeline::plotArea() const {
    return QRect(kGutter, kAxisHeight, std::max(1, width() - kGutter - 6),
                 std::max(1, height() - kAxisHeight));
}

int ProfileTimeline::rowTop(int row) const { return plotArea().top() + m_rowTops[size_t(row)] - m_scrollY; }

double ProfileTimeline::timeToX(double ns) const {
    const QRect a = plotArea();
    return a.left() + (ns - m_viewStart) * a.width() / (m_viewEnd - m_viewStart);
}

double ProfileTimeline::xToTime(double x) const {
    const QRect a = plotArea();
    return m_viewStart + (x - a.left()) * (m_viewEnd - m_viewStart) / a.width();
}

void ProfileTimeline::clampView() {
    if (!(m_viewEnd > m_viewStart)) m_viewEnd = m_viewStart + 1;
    // Never narrower than 100 ns across the whole width: beyond that there is nothing to see.
    if (m_viewEnd - m_viewStart < 100) {
        const double c = 0.5 * (m_viewStart + m_viewEnd);
        m_viewStart = c - 50;
        m_viewEnd = c + 50;
    }
    const int maxScroll = std::max(0, contentHeight() - plotArea().height());
    m_scrollY = std::clamp(m_scrollY, 0, maxScroll);
}

void ProfileTimeline::setViewRange(double startNs, double endNs) {
    m_viewStart = startNs;
    m_viewEnd = endNs;
    clampView();
    update();
    Q_EMIT viewRangeChanged(m_viewStart, m_viewEnd);
}

void ProfileTimeline::fitAll() {
    if (!m_layout || m_layout->spans.empty()) {
        setViewRange(0, 1e6);
        return;
    }
    const double span = double(std::max<int64_t>(1, m_layout->endNs - m_layout->startNs));
    // A little air on both sides so the first and last spans are not glued to the frame.
    setViewRange(m_layout->startNs - span * 0.01, m_layout->endNs + span * 0.01);
}

void ProfileTimeline::zoom(double factor, double anchorX) {
    const double t = xToTime(anchorX);
    setViewRange(t - (t - m_viewStart) * factor, t + (m_viewEnd - t) * factor);
}

// ---- painting -----------------------------------------------------------------------------

void ProfileTimeline::paintEvent(QPaintEvent*) {
    QPainter p(this);
    p.fillRect(rect(), palette().color(QPalette::Base));
    m_stats = {};
    const QRect area = plotArea();
    if (!m_layout || m_layout->rows.empty()) {
        p.setPen(QColor(0x90, 0x90, 0x90));
        p.drawText(rect(), Qt::AlignCenter, tr("No profile loaded"));
        return;
    }

    // Alternating lane backgrounds make it obvious which rows belong to which thread.
    int64_t laneThread = m_layout->rows.front().thread;
    int laneIndex = 0;
    for (size_t r = 0; r < m_layout->rows.size(); ++r) {
        const auto& row = m_layout->rows[r];
        if (row.thread != laneThread) {
            laneThread = row.thread;
            ++laneIndex;
        }
        const int y = rowTop(int(r));
        const int h = rowHeight(row);
        if (y + h < area.top() || y > area.bottom()) continue;
        if (laneIndex % 2) p.fillRect(QRect(0, y, width(), h), QColor(0xf4, 0xf6, 0xf9));
    }

    // Step boundaries behind the spans.
    p.setClipRect(area);
    {
        QPen pen(QColor(0xc8, 0xcc, 0xd2));
        pen.setStyle(Qt::DashLine);
        p.setPen(pen);
        const int bottom = std::min(area.bottom(), area.top() + contentHeight() - m_scrollY);
        for (const auto& mark : m_layout->steps) {
            const double x = timeToX(double(mark.startNs));
            if (x < area.left() || x > area.right()) continue;
            p.drawLine(QPointF(x, area.top()), QPointF(x, bottom));
        }
    }

    QFont small = font();
    small.setPointSizeF(std::max(6.5, small.pointSizeF() - 1.5));
    p.setFont(small);
    for (size_t r = 0; r < m_layout->rows.size(); ++r) {
        const auto& row = m_layout->rows[r];
        const int y = rowTop(int(r));
        const int h = rowHeight(row);
        if (m_culling && (y + h < area.top() || y > area.bottom())) continue;
        if (m_culling)
            paintRow(p, row, y + 1, h - 2, area);
        else
            paintRowNaive(p, row, y + 1, h - 2);
    }
    p.setClipping(false);

    // Lane labels in the gutter.
    p.fillRect(QRect(0, area.top(), kGutter - 4, area.height()), palette().color(QPalette::Base));
    p.setPen(QColor(0x40, 0x40, 0x40));
    for (size_t r = 0; r < m_layout->rows.size(); ++r) {
        const auto& row = m_layout->rows[r];
        if (row.depth != 0) continue;
        const int y = rowTop(int(r));
        const int h = rowHeight(row);
        if (y + h < area.top() || y > area.bottom()) continue;
        const QString thread = laneName(row.thread);
        const QString label = row.phases ? tr("%1 · phases").arg(thread) : tr("%1 · ops").arg(thread);
        QFont f = small;
        f.setBold(row.phases);
        p.setFont(f);
        p.drawText(QRect(6, y, kGutter - 12, h), Qt::AlignVCenter | Qt::AlignLeft, label);
    }
    p.setFont(small);
    paintAxis(p, area);
}

void ProfileTimeline::paintRow(QPainter& p, const TimelineLayout::Row& row, int y, int h, const QRect& area) {
    const auto& sp = m_layout->spans;
    const auto& idx = row.spans;
    const double left = xToTime(area.left());
    const double right = xToTime(area.right() + 1);
    // Spans of a row do not overlap, so ordering by start also orders by end.
    auto it = std::partition_point(idx.begin(), idx.end(),
                                   [&](uint32_t i) { return double(endOf(sp[i])) <= left; });
    const auto end = idx.end();
    const QColor textColor(0x1e, 0x1e, 0x1e);
    while (it != end) {
        const auto& s = sp[*it];
        if (double(s.startNs) >= right) break;
        const double x0 = timeToX(double(s.startNs));
        const double x1 = timeToX(double(endOf(s)));
        const QColor color = row.phases ? phaseColor(s.name) : opColor(s.name);
        if (x1 - x0 >= 1.0) {
            const double cx0 = std::max(x0, double(area.left()) - 1);
            const double cx1 = std::min(x1, double(area.right()) + 2);
            const QRectF r(cx0, y, cx1 - cx0, h);
            p.fillRect(r, color);
            ++m_stats.rects;
            ++m_stats.visibleSpans;
            if (r.width() >= kMinLabelPx) {
                // Separate neighbours of the same colour.
                if (x1 - x0 >= 4) {
                    p.setPen(color.darker(125));
                    p.drawLine(QPointF(x0, y), QPointF(x0, y + h - 1));
                }
                p.setPen(row.phases ? QColor(Qt::white) : textColor);
                const QRectF textRect = r.adjusted(3, 0, -2, 0);
                const QString text = p.fontMetrics().elidedText(QString::fromStdString(s.name),
                                                                Qt::ElideRight, int(textRect.width()));
                if (text.size() > 1) {
                    p.drawText(textRect, Qt::AlignVCenter | Qt::AlignLeft, text);
                    ++m_stats.labels;
                }
            }
            ++it;
            continue;
        }
        // Narrower than a pixel: everything thin that starts inside this block is merged into
        // it, found by binary search, so a dense region costs one rectangle per pixel column
        // instead of one per span.
        double bx0 = std::floor(x0);
        double bx1 = std::max(bx0 + 1.0, x1);
        auto next = it + 1;
        int merged = 1;
        while (next != end) {
            const double tEnd = xToTime(bx1);
            auto j =
                std::partition_point(next, end, [&](uint32_t i) { return double(sp[i].startNs) < tEnd; });
            if (j == next) break;
            const auto& last = sp[*(j - 1)];
            const double lx0 = timeToX(double(last.startNs));
            const double lx1 = timeToX(double(endOf(last)));
            if (lx1 - lx0 >= 1.0) {
                // A wide span starts inside the block: it keeps its own rectangle.
                merged += int((j - 1) - next);
                next = j - 1;
                break;
            }
            merged += int(j - next);
            next = j;
            bx1 = std::max(bx1, lx1);
            if (bx1 > area.right() + 1) break;
        }
        p.fillRect(QRectF(bx0, y, bx1 - bx0, h), merged > 1 ? color.darker(115) : color);
        ++m_stats.rects;
        m_stats.visibleSpans += merged;
        it = next;
    }
}

void ProfileTimeline::paintRowNaive(QPainter& p, const TimelineLayout::Row& row, int y, int h) {
    // The baseline: every span of every row, visible or not, as its own rectangle.
    const auto& sp = m_layout->spans;
    for (uint32_t i : row.spans) {
        const auto& s = sp[i];
        const double x0 = timeToX(double(s.startNs));
        const double x1 = timeToX(double(endOf(s)));
        p.fillRect(QRectF(x0, y, std::max(1.0, x1 - x0), h),
                   row.phases ? phaseColor(s.name) : opColor(s.name));
        ++m_stats.rects;
        ++m_stats.visibleSpans;
    }
}

void ProfileTimeline::paintAxis(QPainter& p, const QRect& area) {
    const QRect band(0, 0, width(), kAxisHeight);
    p.fillRect(band, palette().color(QPalette::Window));
    p.setPen(QColor(0xb0, 0xb0, 0xb0));
    p.drawLine(area.left(), kAxisHeight - 1, width(), kAxisHeight - 1);
    const double origin = double(m_layout->startNs);
    const double range = m_viewEnd - m_viewStart;
    // A 1-2-5 tick step that gives roughly one label per 110 px.
    const double raw = range * 110.0 / area.width();
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (raw <= m * mag) {
            step = m * mag;
            break;
        }
    p.setPen(QColor(0x50, 0x50, 0x50));
    const double firstTick = std::ceil((m_viewStart - origin) / step) * step;
    for (double t = firstTick; origin + t <= m_viewEnd; t += step) {
        const double x = timeToX(origin + t);
        if (x < area.left()) continue;
        p.drawLine(QPointF(x, kAxisHeight - 5), QPointF(x, kAxisHeight - 1));
        p.drawText(QRectF(x + 3, 0, 100, kAxisHeight - 3), Qt::AlignLeft | Qt::AlignBottom,
                   formatDuration(t, step));
    }
    // Step labels where there is room for them.
    p.setPen(QColor(0x2c, 0x5d, 0x8f));
    double lastLabelEnd = -1e9;
    for (const auto& mark : m_layout->steps) {
        const double x = timeToX(double(mark.startNs));
        if (x < area.left() || x > area.right()) continue;
        const QString text = tr("step %1").arg(mark.step);
        const int w = p.fontMetrics().horizontalAdvance(text) + 6;
        if (x < lastLabelEnd) continue;
        p.drawText(QRectF(x + 3, 2, w, 14), Qt::AlignLeft | Qt::AlignTop, text);
        lastLabelEnd = x + w + 4;
    }
    p.setPen(QColor(0x70, 0x70, 0x70));
    p.drawText(QRect(6, 0, kGutter - 8, kAxisHeight - 3), Qt::AlignLeft | Qt::AlignBottom,
               tr("time since start"));
}

// ---- interaction --------------------------------------------------------------------------

int ProfileTimeline::rowAtY(double y) const {
    if (!m_layout) return -1;
    for (size_t r = 0; r < m_layout->rows.size(); ++r) {
        const int top = rowTop(int(r));
        if (y >= top && y < top + rowHeight(m_layout->rows[r])) return int(r);
    }
    return -1;
}

int ProfileTimeline::spanAt(const QPointF& pos) const {
    if (!m_layout || !plotArea().contains(pos.toPoint())) return -1;
    const int r = rowAtY(pos.y());
    if (r < 0) return -1;
    const auto& sp = m_layout->spans;
    const auto& idx = m_layout->rows[size_t(r)].spans;
    const double t = xToTime(pos.x());
    const double slack = kHoverSlackPx * (m_viewEnd - m_viewStart) / plotArea().width();
    auto it = std::partition_point(idx.begin(), idx.end(),
                                   [&](uint32_t i) { return double(endOf(sp[i])) < t - slack; });
    int best = -1;
    double bestDist = slack + 1;
    for (; it != idx.end() && double(sp[*it].startNs) <= t + slack; ++it) {
        const auto& s = sp[*it];
        const double d = t < s.startNs ? s.startNs - t : (t > endOf(s) ? t - endOf(s) : 0.0);
        if (d < bestDist) {
            bestDist = d;
            best = int(*it);
        }
    }
    return best;
}

QString ProfileTimeline::describe(int spanIndex) const {
    if (!m_layout || spanIndex < 0 || size_t(spanIndex) >= m_layout->spans.size()) return {};
    const auto& s = m_layout->spans[size_t(spanIndex)];
    QString text = QString::fromStdString(s.name);
    if (s.kind == core::ProfileSpan::Kind::Phase) text += tr(" (phase)");
    if (!s.shapes.empty()) text += tr("\nshapes %1").arg(QString::fromStdString(s.shapes));
    text += tr("\nstep %1 · %2").arg(s.step).arg(laneName(s.thread));
    text += tr("\nduration %1").arg(formatNs(double(s.durationNs)));
    if (s.cudaNs >= 0) text += tr(" (CUDA %1)").arg(formatNs(double(s.cudaNs)));
    text += tr("\nstarts at %1").arg(formatNs(double(s.startNs - m_layout->startNs)));
    return text;
}

QString ProfileTimeline::hoverAt(const QPointF& pos) {
    const int span = spanAt(pos);
    const QString text = describe(span);
    if (!text.isEmpty())
        QToolTip::showText(mapToGlobal(pos.toPoint()), text, this);
    else if (!m_hoverText.isEmpty())
        QToolTip::hideText();
    m_hoverSpan = span;
    m_hoverText = text;
    return text;
}

void ProfileTimeline::wheelEvent(QWheelEvent* event) {
    const double notches = event->angleDelta().y() / 120.0;
    if (notches == 0) return;
    if (event->modifiers() & Qt::ShiftModifier) {
        // Shift+wheel scrolls the lanes when they do not fit.
        m_scrollY -= int(notches * 3 * kOpRowHeight);
        clampView();
        update();
    } else {
        zoom(std::pow(kWheelZoom, notches), event->position().x());
    }
    event->accept();
}

void ProfileTimeline::mousePressEvent(QMouseEvent* event) {
    if (event->button() == Qt::LeftButton) {
        m_dragging = true;
        m_dragOrigin = event->position();
        m_dragViewStart = m_viewStart;
        m_dragScrollY = m_scrollY;
        setCursor(Qt::ClosedHandCursor);
        QToolTip::hideText();
    }
}

void ProfileTimeline::mouseMoveEvent(QMouseEvent* event) {
    if (m_dragging) {
        const double dx = event->position().x() - m_dragOrigin.x();
        const double width = m_viewEnd - m_viewStart;
        const double start = m_dragViewStart - dx * width / plotArea().width();
        m_scrollY = m_dragScrollY - int(event->position().y() - m_dragOrigin.y());
        setViewRange(start, start + width);
        return;
    }
    hoverAt(event->position());
}

void ProfileTimeline::mouseReleaseEvent(QMouseEvent* event) {
    if (event->button() == Qt::LeftButton && m_dragging) {
        m_dragging = false;
        unsetCursor();
    }
}

void ProfileTimeline::mouseDoubleClickEvent(QMouseEvent*) { fitAll(); }

void ProfileTimeline::leaveEvent(QEvent*) {
    m_hoverSpan = -1;
    m_hoverText.clear();
}

}  // namespace lathe::widgets

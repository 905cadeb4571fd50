// The Graph view (graph_view.h). Reading and layout run on one worker thread; the GUI thread
// only turns a finished layout into scene items (one per box, edge and cluster) and draws them,
// with text left out when zoomed far out so that panning a 5,000-node graph stays fluid.
#include "lathe/widgets/graph_view.h"

#include <QApplication>
#include <QContextMenuEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QGraphicsItem>
#include <QGraphicsScene>
#include <QGraphicsSceneContextMenuEvent>
#include <QGraphicsView>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QLocale>
#include <QMenu>
#include <QMessageBox>
#include <QPainter>
#include <QPainterPath>
#include <QRegularExpression>
#include <QSaveFile>
#include <QScrollBar>
#include <QShortcut>
#include <QSplitter>
#include <QStackedWidget>
#include <QStyleOptionGraphicsItem>
#include <QTemporaryDir>
#include <QTextBrowser>
#include <QToolButton>
#include <QVBoxLayout>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>

#include "lathe/core/model_artifact.h"
#include "lathe/core/store.h"

namespace lathe::widgets {

namespace {

QString flopsText(double f) {
    if (f <= 0) return QStringLiteral("–");
    if (f >= 1e9) return QStringLiteral("%1 G").arg(f / 1e9, 0, 'f', 2);
    if (f >= 1e6) return QStringLiteral("%1 M").arg(f / 1e6, 0, 'f', 2);
    if (f >= 1e3) return QStringLiteral("%1 K").arg(f / 1e3, 0, 'f', 1);
    return QString::number(f, 'f', 0);
}

QString timeText(double ns) {
    if (ns < 0) return QStringLiteral("–");
    if (ns >= 1e6) return QStringLiteral("%1 ms").arg(ns / 1e6, 0, 'f', 2);
    return QStringLiteral("%1 µs").arg(ns / 1e3, 0, 'f', 1);
}

QString grouped(int64_t v) { return QLocale(QLocale::English).toString(static_cast<qlonglong>(v)); }

QString q(const std::string& s) { return QString::fromStdString(s); }

}  // namespace

// ---- scene items ----------------------------------------------------------------------------

class GraphNodeItem : public QGraphicsItem {
public:
    GraphNodeItem(GraphView* view, int index, const QRectF& rect)
        : m_view(view), m_index(index), m_rect(rect) {
        setFlag(ItemIsSelectable);
        setZValue(2);
        setCacheMode(NoCache);
        setToolTip(tooltip());
    }
    QRectF boundingRect() const override { return m_rect.adjusted(-2, -2, 2, 2); }
    int index() const { return m_index; }

    void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override {
        const auto& n = m_view->m_view.nodes[static_cast<size_t>(m_index)];
        const double lod = option->levelOfDetailFromTransform(p->worldTransform());
        const bool module = n.node < 0;
        const QColor fill = m_view->fillOf(m_index);
        QPen pen(isSelected() ? QColor("#d62728") : QColor("#404040"), isSelected() ? 2.5 : 0.8);
        pen.setCosmetic(isSelected());
        if (module) pen.setStyle(Qt::DashLine);
        p->setPen(pen);
        p->setBrush(fill);
        if (lod < 0.25) {
            // Far out: plain boxes (rounded corners and text cost more than they show).
            p->drawRect(m_rect);
            return;
        }
        p->drawRoundedRect(m_rect, 6, 6);
        if (lod < 0.45) return;
        p->setPen(fill.lightness() < 110 ? Qt::white : Qt::black);
        QFont f = p->font();
        f.setPointSizeF(8.5);
        f.setBold(true);
        p->setFont(f);
        const QRectF inner = m_rect.adjusted(4, 2, -4, -2);
        if (n.detail.empty()) {
            p->drawText(inner, Qt::AlignCenter, elided(q(n.label), f, inner.width()));
            return;
        }
        QRectF top = inner, bottom = inner;
        top.setBottom(inner.center().y());
        bottom.setTop(inner.center().y());
        p->drawText(top, Qt::AlignHCenter | Qt::AlignBottom, elided(q(n.label), f, inner.width()));
        f.setBold(false);
        f.setPointSizeF(7);
        p->setFont(f);
        p->drawText(bottom, Qt::AlignHCenter | Qt::AlignTop, elided(q(n.detail), f, inner.width()));
    }

protected:
    void mouseDoubleClickEvent(QGraphicsSceneMouseEvent*) override { m_view->onItemActivated(m_index); }
    QVariant itemChange(GraphicsItemChange change, const QVariant& value) override {
        if (change == ItemSelectedHasChanged && value.toBool()) {
            m_view->m_selectedView = m_index;
            m_view->updateProperties();
        }
        return QGraphicsItem::itemChange(change, value);
    }
    void contextMenuEvent(QGraphicsSceneContextMenuEvent* event) override {
        m_view->showContextMenu(m_index, event->screenPos());
    }

private:
    static QString elided(const QString& s, const QFont& f, double width) {
        return QFontMetricsF(f).elidedText(s, Qt::ElideMiddle, width);
    }
    QString tooltip() const {
        const auto& n = m_view->m_view.nodes[static_cast<size_t>(m_index)];
        if (n.node < 0)
            return QObject::tr("%1: %2 ops, double-click to expand").arg(q(n.scope)).arg(n.members);
        const auto& g = m_view->m_graph->nodes[static_cast<size_t>(n.node)];
        return q(g.name) + "\n" + q(g.op);
    }

    GraphView* m_view;
    int m_index;
    QRectF m_rect;
};

class GraphEdgeItem : public QGraphicsItem {
public:
    explicit GraphEdgeItem(const core::EdgePath& e) {
        if (e.points.empty()) return;
        m_path.moveTo(e.points[0].first, e.points[0].second);
        size_t k = 1;
        for (; k + 2 < e.points.size(); k += 3)
            m_path.cubicTo(QPointF(e.points[k].first, e.points[k].second),
                           QPointF(e.points[k + 1].first, e.points[k + 1].second),
                           QPointF(e.points[k + 2].first, e.points[k + 2].second));
        for (; k < e.points.size(); ++k) m_path.lineTo(e.points[k].first, e.points[k].second);
        if (e.hasTip) {
            const QPointF end = m_path.currentPosition(), tip(e.tip.first, e.tip.second);
            m_path.lineTo(tip);
            // The arrow head: a small filled triangle from the path's end to the tip.
            const QPointF d = tip - end;
            const double len = std::hypot(d.x(), d.y());
            if (len > 0.1) {
                const QPointF u = d / len, nrm(-u.y(), u.x());
                m_head << tip << end + nrm * 3.5 << end - nrm * 3.5;
            }
        }
        m_bounds = m_path.boundingRect().united(m_head.boundingRect()).adjusted(-2, -2, 2, 2);
        setZValue(1);
    }
    QRectF boundingRect() const override { return m_bounds; }
    void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override {
        const double lod = option->levelOfDetailFromTransform(p->worldTransform());
        QPen pen(QColor("#707070"), 0);  // cosmetic: one pixel at any zoom
        p->setPen(pen);
        p->setBrush(Qt::NoBrush);
        p->drawPath(m_path);
        if (lod >= 0.3 && !m_head.isEmpty()) {
            p->setBrush(QColor("#707070"));
            p->drawPolygon(m_head);
        }
    }

private:
    QPainterPath m_path;
    QPolygonF m_head;
    QRectF m_bounds;
};

class GraphClusterItem : public QGraphicsItem {
public:
    GraphClusterItem(GraphView* view, const QRectF& rect, const QString& label, const QString& scope,
                     int depth)
        : m_view(view),
          m_rect(rect),
          m_label(label),
          m_scope(scope),
          m_fill(QColor::fromRgb(std::max(222, 250 - 7 * depth), std::max(222, 250 - 7 * depth),
                                 std::max(224, 252 - 7 * depth))) {
        setZValue(std::min(0.95, 0.05 * depth));  // inner clusters over outer ones, under edges
        setToolTip(QObject::tr("%1 — right-click to collapse").arg(scope));
    }
    QRectF boundingRect() const override { return m_rect.adjusted(-1, -1, 1, 1); }
    void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override {
        const double lod = option->levelOfDetailFromTransform(p->worldTransform());
        // Clusters outgrow the viewport and nest: translucent fills blended over each other
        // cost ~4 ms a frame on 5,000 ops (tests/bench/bench_graph_view.cpp). An opaque shade
        // per depth, filled only where on screen, costs a tenth of it.
        const QRectF visible =
            p->worldTransform().inverted().mapRect(QRectF(0, 0, p->device()->width(), p->device()->height()));
        const QRectF fill = m_rect.adjusted(1, 1, -1, -1).intersected(visible);
        if (!fill.isEmpty()) {
            p->setRenderHint(QPainter::Antialiasing, false);
            p->fillRect(fill, m_fill);
            p->setRenderHint(QPainter::Antialiasing, true);
        }
        p->setPen(QPen(QColor("#b0b0b0"), 0));
        p->setBrush(Qt::NoBrush);
        if (!m_rect.adjusted(8, 8, -8, -8).contains(visible))
            p->drawRoundedRect(m_rect, 8, 8);  // else off screen
        if (lod < 0.45) return;
        QFont f = p->font();
        f.setPointSizeF(7.5);
        p->setFont(f);
        p->setPen(QColor("#606060"));
        p->drawText(m_rect.adjusted(6, 1, -6, 0), Qt::AlignTop | Qt::AlignHCenter, m_label);
    }

protected:
    void contextMenuEvent(QGraphicsSceneContextMenuEvent* event) override {
        QMenu menu;
        menu.addAction(QObject::tr("Collapse %1").arg(m_scope),
                       [view = m_view, scope = m_scope] { view->collapseScope(scope); });
        menu.exec(event->screenPos());
    }

private:
    GraphView* m_view;
    QRectF m_rect;
    QString m_label, m_scope;
    QColor m_fill;
};

// Wheel zooms about the cursor, dragging pans, nothing else.
class GraphCanvas : public QGraphicsView {
public:
    explicit GraphCanvas(QGraphicsScene* scene, QWidget* parent) : QGraphicsView(scene, parent) {
        setDragMode(ScrollHandDrag);
        setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
        setTransformationAnchor(AnchorUnderMouse);
        setViewportUpdateMode(SmartViewportUpdate);
        setOptimizationFlags(DontSavePainterState | DontAdjustForAntialiasing);
        setBackgroundBrush(Qt::white);
    }

protected:
    void wheelEvent(QWheelEvent* e) override {
        if (e->angleDelta().y() == 0) return QGraphicsView::wheelEvent(e);
        const double factor = std::pow(1.0015, e->angleDelta().y());
        zoom(factor);
    }

public:
    void zoom(double factor) {
        const double current = transform().m11();
        const double target = std::clamp(current * factor, 0.01, 8.0);
        scale(target / current, target / current);
    }
};

// ---- GraphView ------------------------------------------------------------------------------

struct GraphView::LayoutResult {
    std::shared_ptr<const core::ModelGraph> graph;  // set when the task also read the graph
    std::vector<double> times;
    std::set<std::string> collapsed;
    core::GraphView view;
    core::GraphLayout layout;
    std::string error;
    bool fresh = false;  // a new graph (not a relayout)
};

GraphView::GraphView(QWidget* parent) : QWidget(parent) {
    m_pool.setMaxThreadCount(1);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);

    m_titleLabel = new QLabel(this);
    m_titleLabel->setObjectName(QStringLiteral("graphTitle"));
    layout->addWidget(m_titleLabel);
    auto* bar = new QHBoxLayout;
    auto tool = [&](const QString& text, const QString& tip, const char* name) {
        auto* b = new QToolButton(this);
        b->setText(text);
        b->setToolTip(tip);
        b->setObjectName(QString::fromLatin1(name));
        bar->addWidget(b);
        return b;
    };
    auto* fit = tool(tr("Fit"), tr("Fit the whole graph in the view"), "graphFit");
    auto* zoomIn = tool(tr("+"), tr("Zoom in (or the mouse wheel)"), "graphZoomIn");
    auto* zoomOut = tool(tr("−"), tr("Zoom out"), "graphZoomOut");
    m_expandButton =
        tool(tr("Expand all"), tr("Show every op (large graphs take seconds to lay out)"), "graphExpandAll");
    m_collapseButton =
        tool(tr("Collapse"), tr("Back to module boxes; double-click a box to open it"), "graphCollapse");
    m_horizontalButton =
        tool(tr("Horizontal"), tr("Lay out left to right instead of top to bottom"), "graphHorizontal");
    m_horizontalButton->setCheckable(true);
    m_heatButton =
        tool(tr("Heat map"), tr("Colour ops by their measured time in the run's profile"), "graphHeatMap");
    m_heatButton->setCheckable(true);
    m_exportButton = tool(tr("Export…"), tr("Save the graph as PNG or SVG"), "graphExport");
    m_search = new QLineEdit(this);
    m_search->setObjectName(QStringLiteral("graphSearch"));
    m_search->setPlaceholderText(tr("Find name or op (Ctrl+F)"));
    m_search->setClearButtonEnabled(true);
    m_search->setMaximumWidth(220);
    bar->addWidget(m_search);
    auto* prev = tool(tr("▲"), tr("Previous match (Shift+Enter)"), "graphFindPrevious");
    auto* next = tool(tr("▼"), tr("Next match (Enter)"), "graphFindNext");
    m_searchCount = new QLabel(this);
    m_searchCount->setObjectName(QStringLiteral("graphSearchCount"));
    bar->addWidget(m_searchCount);
    bar->addStretch(1);
    layout->addLayout(bar);

    m_stack = new QStackedWidget(this);
    m_message = new QLabel(this);
    m_message->setAlignment(Qt::AlignCenter);
    m_message->setWordWrap(true);
    m_message->setObjectName(QStringLiteral("graphMessage"));
    m_stack->addWidget(m_message);
    auto* split = new QSplitter(Qt::Horizontal, this);
    m_scene = new QGraphicsScene(this);
    m_scene->setItemIndexMethod(QGraphicsScene::BspTreeIndex);
    m_canvas = new GraphCanvas(m_scene, split);
    m_canvas->setObjectName(QStringLiteral("graphCanvas"));
    m_properties = new QTextBrowser(split);
    m_properties->setObjectName(QStringLiteral("graphProperties"));
    m_properties->setMinimumWidth(220);
    m_properties->setMaximumWidth(460);
    split->addWidget(m_canvas);
    split->addWidget(m_properties);
    split->setStretchFactor(0, 4);
    split->setStretchFactor(1, 1);
    split->setSizes({900, 300});
    m_stack->addWidget(split);
    layout->addWidget(m_stack, 1);
    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("graphStatus"));
    layout->addWidget(m_status);

    connect(fit, &QToolButton::clicked, this, &GraphView::fitAll);
    connect(zoomIn, &QToolButton::clicked, this, [this] { zoomBy(1.25); });
    connect(zoomOut, &QToolButton::clicked, this, [this] { zoomBy(0.8); });
    connect(m_expandButton, &QToolButton::clicked, this, &GraphView::expandAll);
    connect(m_collapseButton, &QToolButton::clicked, this, &GraphView::collapseAll);
    connect(m_horizontalButton, &QToolButton::toggled, this, &GraphView::setHorizontal);
    connect(m_heatButton, &QToolButton::toggled, this, &GraphView::setHeatMap);
    connect(m_exportButton, &QToolButton::clicked, this, &GraphView::exportDialog);
    connect(m_search, &QLineEdit::returnPressed, this, [this] {
        const bool back = QApplication::keyboardModifiers() & Qt::ShiftModifier;
        findNext(m_search->text(), back);
    });
    connect(next, &QToolButton::clicked, this, [this] { findNext(m_search->text(), false); });
    connect(prev, &QToolButton::clicked, this, [this] { findNext(m_search->text(), true); });
    auto* find = new QShortcut(QKeySequence::Find, this);
    find->setContext(Qt::WidgetWithChildrenShortcut);
    connect(find, &QShortcut::activated, this, [this] {
        m_search->setFocus();
        m_search->selectAll();
    });
    showMessage(tr("No model open. File → Open Model… opens a TorchScript (.pt) or ONNX (.onnx) file."));
}

GraphView::~GraphView() {
    ++m_generation;
    m_pool.waitForDone();
    for (; m_busyCursors > 0; --m_busyCursors) QApplication::restoreOverrideCursor();
}

void GraphView::clear() {
    ++m_generation;
    m_pool.waitForDone();
    m_graph.reset();
    m_times.clear();
    m_items.clear();
    m_scene->clear();
    m_view = {};
    m_layout = {};
    m_layoutReady = false;
    m_selectedView = -1;
    m_titleLabel->clear();
    m_status->clear();
}

void GraphView::showMessage(const QString& text) {
    m_message->setText(text);
    m_stack->setCurrentIndex(0);
    updateToolbar();
}

void GraphView::openFile(const QString& path, const QString& title) {
    m_title = title.isEmpty() ? QFileInfo(path).fileName() : title;
    m_titleLabel->setText(tr("<b>%1</b> — reading…").arg(m_title.toHtmlEscaped()));
    showMessage(tr("Reading %1…").arg(path));
    startFresh(
        [path, title] {
            core::ModelGraph g = core::readModelGraph(path.toStdString());
            if (!title.isEmpty()) g.name = title.toStdString();
            return g;
        },
        {});
}

void GraphView::setGraph(core::ModelGraph graph, std::vector<double> times) {
    if (m_title.isEmpty() || graph.name != m_title.toStdString()) m_title = q(graph.name);
    m_titleLabel->setText(tr("<b>%1</b> — laying out…").arg(m_title.toHtmlEscaped()));
    auto g = std::make_shared<core::ModelGraph>(std::move(graph));
    startFresh([g] { return std::move(*g); }, std::move(times));
}

void GraphView::startFresh(std::function<core::ModelGraph()> read, std::vector<double> times) {
    const uint64_t generation = ++m_generation;
    const bool horizontal = m_horizontal;
    m_pool.start([this, read = std::move(read), times = std::move(times), generation, horizontal]() mutable {
        if (m_generation.load() != generation) return;
        auto result = std::make_shared<LayoutResult>();
        result->fresh = true;
        result->times = std::move(times);
        try {
            auto g = std::make_shared<const core::ModelGraph>(read());
            result->collapsed = core::defaultCollapsed(*g);
            result->view = core::buildGraphView(*g, result->collapsed);
            if (m_generation.load() != generation) return;
            core::LayoutOptions o;
            o.horizontal = horizontal;
            result->layout = core::layoutGraphView(result->view, o);
            result->graph = std::move(g);
        } catch (const std::exception& ex) {
            result->error = ex.what();
        }
        QMetaObject::invokeMethod(
            this, [this, generation, result] { applyLayout(generation, result); }, Qt::QueuedConnection);
    });
}

void GraphView::relayout() {
    if (!m_graph) return;
    const uint64_t generation = ++m_generation;
    m_status->setText(tr("Laying out…"));
    auto g = m_graph;
    auto collapsed = m_collapsed;
    const bool horizontal = m_horizontal;
    QApplication::setOverrideCursor(Qt::BusyCursor);
    ++m_busyCursors;  // restored by each result, or the destructor for results never delivered
    m_pool.start([this, g, collapsed, generation, horizontal] {
        auto result = std::make_shared<LayoutResult>();
        if (m_generation.load() == generation) {
            try {
                result->collapsed = collapsed;
                result->view = core::buildGraphView(*g, collapsed);
                core::LayoutOptions o;
                o.horizontal = horizontal;
                result->layout = core::layoutGraphView(result->view, o);
            } catch (const std::exception& ex) {
                result->error = ex.what();
            }
        }
        QMetaObject::invokeMethod(
            this,
            [this, generation, result] {
                if (m_busyCursors > 0) {
                    --m_busyCursors;
                    QApplication::restoreOverrideCursor();
                }
                applyLayout(generation, result);
            },
            Qt::QueuedConnection);
    });
}

void GraphView::applyLayout(uint64_t generation, const std::shared_ptr<LayoutResult>& result) {
    if (generation != m_generation.load()) return;
    if (!result->error.empty()) {
        m_titleLabel->setText(tr("<b>%1</b>").arg(m_title.toHtmlEscaped()));
        showMessage(tr("Cannot show %1:\n%2").arg(m_title, q(result->error)));
        Q_EMIT loadFailed(q(result->error));
        return;
    }
    int64_t keep = m_pendingSelect;
    if (!result->fresh && keep < 0) keep = selectedNode();
    if (result->fresh) {
        m_graph = result->graph;
        m_times = result->times;
        m_heat = false;
        m_heatButton->setChecked(false);
        keep = m_pendingSelect = -1;
        m_searchCursor = -1;
    }
    m_collapsed = result->collapsed;
    m_view = std::move(result->view);
    m_layout = std::move(result->layout);
    m_layoutSeconds = m_layout.seconds;
    rebuildScene();
    m_layoutReady = true;
    m_stack->setCurrentIndex(1);
    if (result->fresh) fitAll();
    const bool revealing = m_pendingSelect >= 0;
    m_pendingSelect = -1;
    // A node selected before a collapse that now hides it stays hidden (a search or selectNode
    // asked for it explicitly, and is revealed).
    const bool shown =
        keep >= 0 && static_cast<size_t>(keep) < m_view.viewOf.size() &&
        m_view.viewOf[static_cast<size_t>(keep)] >= 0 &&
        m_view.nodes[static_cast<size_t>(m_view.viewOf[static_cast<size_t>(keep)])].node == keep;
    if (keep >= 0 && (revealing || shown))
        revealAndSelect(keep);
    else
        updateProperties();
    const auto& g = *m_graph;
    m_titleLabel->setText(tr("<b>%1</b> — %2 parameters, %3 FLOPs%4")
                              .arg(m_title.toHtmlEscaped(), grouped(g.parameters), flopsText(g.flops),
                                   g.exampleInput.empty()
                                       ? tr(" (no example input)")
                                       : tr(" for %1").arg(q(core::graphShapeText(
                                             core::GraphTensor{true, g.exampleInput, ""})))));
    m_status->setText(tr("%1 ops; %2 boxes shown (%3 scopes collapsed); laid out in %4 s, drawn in %5 s")
                          .arg(g.nodes.size())
                          .arg(m_view.nodes.size())
                          .arg(m_collapsed.size())
                          .arg(m_layoutSeconds, 0, 'f', 2)
                          .arg(m_sceneSeconds, 0, 'f', 2));
    updateToolbar();
    Q_EMIT layoutReady(static_cast<int>(m_view.nodes.size()), m_layoutSeconds);
}

void GraphView::rebuildScene() {
    QElapsedTimer timer;
    timer.start();
    m_items.clear();
    m_scene->clear();
    m_selectedView = -1;
    // Each box's profile time (its ops' sum; -1: none timed), once per layout rather than per
    // paint, and the heat map's scale: the largest.
    m_viewTimes.assign(m_times.empty() ? 0 : m_view.nodes.size(), -1);
    for (size_t i = 0; i < m_viewTimes.size() && i < m_view.viewOf.size() && i < m_times.size(); ++i)
        if (m_times[i] >= 0 && m_view.viewOf[i] >= 0) {
            double& t = m_viewTimes[static_cast<size_t>(m_view.viewOf[i])];
            t = std::max(t, 0.0) + m_times[i];
        }
    m_maxViewTime = 0;
    for (double t : m_viewTimes) m_maxViewTime = std::max(m_maxViewTime, t);
    for (size_t c = 0; c < m_layout.clusters.size() && c < m_view.clusters.size(); ++c) {
        const auto& b = m_layout.clusters[c];
        int depth = 0;
        for (int p = m_view.clusters[c].parent; p >= 0; p = m_view.clusters[static_cast<size_t>(p)].parent)
            ++depth;
        m_scene->addItem(new GraphClusterItem(this, QRectF(QPointF(b.x0, b.y0), QPointF(b.x1, b.y1)),
                                              q(m_view.clusters[c].label), q(m_view.clusters[c].scope),
                                              depth));
    }
    for (const auto& e : m_layout.edges) m_scene->addItem(new GraphEdgeItem(e));
    m_items.reserve(m_layout.nodes.size());
    for (size_t i = 0; i < m_layout.nodes.size(); ++i) {
        const auto& b = m_layout.nodes[i];
        auto* item =
            new GraphNodeItem(this, static_cast<int>(i), QRectF(b.x - b.w / 2, b.y - b.h / 2, b.w, b.h));
        m_scene->addItem(item);
        m_items.push_back(item);
    }
    m_scene->setSceneRect(QRectF(-20, -20, m_layout.width + 40, m_layout.height + 40));
    m_sceneSeconds = static_cast<double>(timer.nsecsElapsed()) / 1e9;
}

QColor GraphView::fillOf(int viewNode) const {
    const auto& n = m_view.nodes[static_cast<size_t>(viewNode)];
    if (m_heat && static_cast<size_t>(viewNode) < m_viewTimes.size()) {
        const double t = m_viewTimes[static_cast<size_t>(viewNode)];
        if (t < 0 || m_maxViewTime <= 0) return QColor("#f4f4f4");
        // Log scale over three decades below the slowest box: pale yellow to dark red.
        const double x = std::clamp(1.0 + std::log10(std::max(t, 1.0) / m_maxViewTime) / 3.0, 0.0, 1.0);
        const QColor a("#fff7bc"), b("#b10026");
        return QColor::fromRgbF(a.redF() + (b.redF() - a.redF()) * x,
                                a.greenF() + (b.greenF() - a.greenF()) * x,
                                a.blueF() + (b.blueF() - a.blueF()) * x);
    }
    if (n.category == "module") return QColor("#f2f2f2");
    return QColor(core::graphCategoryColor(n.category));
}

std::vector<std::string> GraphView::fillColors() const {
    std::vector<std::string> out;
    if (!m_heat) return out;
    for (size_t i = 0; i < m_view.nodes.size(); ++i)
        out.push_back(fillOf(static_cast<int>(i)).name().toStdString());
    return out;
}

int64_t GraphView::selectedNode() const {
    if (m_selectedView < 0 || static_cast<size_t>(m_selectedView) >= m_view.nodes.size()) return -1;
    return m_view.nodes[static_cast<size_t>(m_selectedView)].node;
}

QString GraphView::propertiesText() const { return m_properties->toPlainText(); }
QString GraphView::statusText() const { return m_status->text(); }

void GraphView::updateProperties() {
    if (!m_graph || m_selectedView < 0 || static_cast<size_t>(m_selectedView) >= m_view.nodes.size()) {
        m_properties->setHtml(m_graph ? tr("<p>Click a box for its attributes, shapes, parameters and FLOPs. "
                                           "Double-click a dashed module box to open it.</p>")
                                      : QString());
        return;
    }
    const auto& vn = m_view.nodes[static_cast<size_t>(m_selectedView)];
    QString h;
    auto row = [&](const QString& k, const QString& v) {
        h += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>")
                 .arg(k.toHtmlEscaped(), v.toHtmlEscaped());
    };
    if (vn.node < 0) {
        h += tr("<h3>%1</h3><table>").arg(q(vn.scope).toHtmlEscaped());
        row(tr("module"), q(vn.scope));
        row(tr("ops"), QString::number(vn.members));
        row(tr("parameters"), grouped(vn.parameters));
        row(tr("FLOPs"), flopsText(vn.flops));
        if (static_cast<size_t>(m_selectedView) < m_viewTimes.size())
            row(tr("time (profile)"),
                timeText(std::max(m_viewTimes[static_cast<size_t>(m_selectedView)], 0.0)));
        h += QStringLiteral("</table>") + tr("<p>Double-click to expand.</p>");
        m_properties->setHtml(h);
        Q_EMIT selectionChanged(-1);
        return;
    }
    const auto& n = m_graph->nodes[static_cast<size_t>(vn.node)];
    h += QStringLiteral("<h3>%1</h3><table>").arg(q(n.name).toHtmlEscaped());
    row(tr("op"), q(n.op));
    row(tr("kind"), q(n.category));
    if (!n.scope.empty()) row(tr("module"), q(n.scope));
    for (size_t i = 0; i < n.inputs.size(); ++i)
        row(tr("input %1").arg(i), q(core::graphShapeText(n.inputs[i])) + " " + q(n.inputs[i].dtype));
    for (size_t i = 0; i < n.outputs.size(); ++i)
        row(tr("output %1").arg(i), q(core::graphShapeText(n.outputs[i])) + " " + q(n.outputs[i].dtype));
    row(tr("parameters"), grouped(n.parameters));
    row(tr("parameter bytes"), grouped(n.parameterBytes));
    row(tr("FLOPs"), flopsText(n.flops));
    if (!m_times.empty())
        row(tr("time (profile)"),
            static_cast<size_t>(n.id) < m_times.size() ? timeText(m_times[static_cast<size_t>(n.id)]) : "–");
    h += QStringLiteral("</table>");
    if (!n.attributes.empty()) {
        h += tr("<h4>Attributes</h4><table>");
        for (const auto& [k, v] : n.attributes) row(q(k), q(v));
        h += QStringLiteral("</table>");
    }
    m_properties->setHtml(h);
    Q_EMIT selectionChanged(n.id);
}

void GraphView::updateToolbar() {
    const bool shown = m_graph && m_layoutReady;
    m_heatButton->setEnabled(shown && !m_times.empty());
    m_heatButton->setToolTip(!m_times.empty() ? tr("Colour ops by their measured time in the run's profile")
                                              : tr("No profile: train with --profile for op times"));
    m_expandButton->setEnabled(shown && !m_collapsed.empty());
    m_collapseButton->setEnabled(shown && !core::graphScopes(*m_graph).empty());
    m_exportButton->setEnabled(shown);
}

void GraphView::revealAndSelect(int64_t graphNode) {
    if (!m_graph || graphNode < 0 || static_cast<size_t>(graphNode) >= m_graph->nodes.size()) return;
    const auto vi = m_view.viewOf.empty() ? -1 : m_view.viewOf[static_cast<size_t>(graphNode)];
    if (vi < 0 || m_view.nodes[static_cast<size_t>(vi)].node != graphNode) {
        // Hidden in a collapsed scope: open every collapsed ancestor, select after the layout.
        const std::string& scope = m_graph->nodes[static_cast<size_t>(graphNode)].scope;
        std::string prefix;
        size_t start = 0;
        while (!scope.empty()) {
            const auto dot = scope.find('.', start);
            prefix = scope.substr(0, dot);
            if (m_collapsed.count(prefix)) core::expandScope(*m_graph, m_collapsed, prefix);
            if (dot == std::string::npos) break;
            start = dot + 1;
        }
        m_pendingSelect = graphNode;
        relayout();
        return;
    }
    m_scene->clearSelection();
    auto* item = m_items[static_cast<size_t>(vi)];
    item->setSelected(true);
    m_selectedView = static_cast<int>(vi);
    updateProperties();
    m_canvas->centerOn(item);
}

void GraphView::selectNode(int64_t graphNode) { revealAndSelect(graphNode); }

bool GraphView::findNext(const QString& text, bool backwards) {
    if (!m_graph || text.trimmed().isEmpty()) {
        m_searchCount->clear();
        return false;
    }
    const std::string needle = text.trimmed().toLower().toStdString();
    auto lower = [](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
        return s;
    };
    std::vector<int64_t> matches;
    for (const auto& n : m_graph->nodes)
        if (lower(n.name).find(needle) != std::string::npos || lower(n.op).find(needle) != std::string::npos)
            matches.push_back(n.id);
    if (matches.empty()) {
        m_searchCount->setText(tr("no match"));
        return false;
    }
    if (text != m_searchText) {
        m_searchText = text;
        m_searchCursor = -1;
    }
    const int64_t current = m_searchCursor >= 0 ? m_searchCursor : selectedNode();
    int64_t pick = -1;
    if (!backwards) {
        auto it = std::upper_bound(matches.begin(), matches.end(), current);
        pick = it == matches.end() ? matches.front() : *it;
    } else {
        auto it = std::lower_bound(matches.begin(), matches.end(), current < 0 ? INT64_MAX : current);
        pick = it == matches.begin() ? matches.back() : *std::prev(it);
    }
    m_searchCursor = pick;
    const auto pos = std::find(matches.begin(), matches.end(), pick) - matches.begin();
    m_searchCount->setText(tr("%1 of %2").arg(pos + 1).arg(matches.size()));
    revealAndSelect(pick);
    return true;
}

void GraphView::onItemActivated(int viewNode) {
    const auto& n = m_view.nodes[static_cast<size_t>(viewNode)];
    if (n.node < 0) expandScope(q(n.scope));
}

void GraphView::showContextMenu(int viewNode, const QPoint& globalPos) {
    const auto& n = m_view.nodes[static_cast<size_t>(viewNode)];
    QMenu menu;
    if (n.node < 0)
        menu.addAction(tr("Expand %1").arg(q(n.scope)), [this, s = q(n.scope)] { expandScope(s); });
    // Collapse any scope enclosing this box (for a module box, from its parent up).
    std::string scope = n.scope;
    if (n.node < 0) {
        const auto p = scope.rfind('.');
        scope = p == std::string::npos ? "" : scope.substr(0, p);
    }
    while (!scope.empty()) {
        menu.addAction(tr("Collapse %1").arg(q(scope)), [this, s = q(scope)] { collapseScope(s); });
        const auto p = scope.rfind('.');
        scope = p == std::string::npos ? "" : scope.substr(0, p);
    }
    if (!menu.isEmpty()) menu.exec(globalPos);
}

void GraphView::expandScope(const QString& scope) {
    if (!m_graph) return;
    core::expandScope(*m_graph, m_collapsed, scope.toStdString());
    relayout();
}

void GraphView::collapseScope(const QString& scope) {
    if (!m_graph) return;
    core::collapseScope(m_collapsed, scope.toStdString());
    m_selectedView = -1;
    relayout();
}

void GraphView::expandAll() {
    if (!m_graph || m_collapsed.empty()) return;
    // dot's time grows faster than the graph: ~2 s at 5,000 ops, minutes at 20,000.
    if (m_graph->nodes.size() > 8000 && isVisible() &&
        QMessageBox::question(this, tr("Expand all"),
                              tr("%1 ops: laying them all out takes a minute or more. Expand anyway?")
                                  .arg(m_graph->nodes.size())) != QMessageBox::Yes)
        return;
    m_collapsed.clear();
    relayout();
}

void GraphView::collapseAll() {
    if (!m_graph) return;
    m_collapsed.clear();
    for (const auto& s : core::graphScopes(*m_graph))
        if (s.find('.') == std::string::npos) m_collapsed.insert(s);
    m_selectedView = -1;
    relayout();
}

void GraphView::setHorizontal(bool horizontal) {
    if (m_horizontalButton->isChecked() != horizontal) m_horizontalButton->setChecked(horizontal);
    if (horizontal == m_horizontal) return;
    m_horizontal = horizontal;
    relayout();
}

void GraphView::setHeatMap(bool on) {
    on = on && !m_times.empty();
    if (m_heatButton->isChecked() != on) m_heatButton->setChecked(on);
    m_heat = on;
    m_scene->update();
}

void GraphView::fitAll() {
    if (m_scene->items().isEmpty()) return;
    const QRectF r = m_scene->sceneRect();
    m_canvas->fitInView(r, Qt::KeepAspectRatio);
    if (m_canvas->transform().m11() > 1.25) {  // a small graph: no giant boxes
        m_canvas->resetTransform();
        m_canvas->scale(1.25, 1.25);
        m_canvas->centerOn(r.center());
    }
    // A tall chain fitted whole is unreadable: start at a readable zoom at its top instead.
    if (m_canvas->transform().m11() < 0.5 && (r.height() > 4 * r.width() || r.width() > 4 * r.height())) {
        m_canvas->resetTransform();
        m_canvas->scale(0.8, 0.8);
        m_canvas->centerOn(r.center().x(), r.top() + m_canvas->viewport()->height() / 1.6);
        if (m_horizontal) m_canvas->centerOn(r.left() + m_canvas->viewport()->width() / 1.6, r.center().y());
    }
}

void GraphView::zoomBy(double factor) { m_canvas->zoom(factor); }

QImage GraphView::renderImage(double scale) const {
    const QRectF r = m_scene->sceneRect();
    if (r.isEmpty()) return {};
    scale = std::min(scale, 16384.0 / std::max(r.width(), r.height()));
    QImage image(QSize(static_cast<int>(std::ceil(r.width() * scale)),
                       static_cast<int>(std::ceil(r.height() * scale))),
                 QImage::Format_ARGB32_Premultiplied);
    image.fill(Qt::white);
    QPainter p(&image);
    p.setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
    m_scene->render(&p, QRectF(QPointF(0, 0), image.size()), r);
    return image;
}

bool GraphView::exportTo(const QString& path, QString* error) {
    auto fail = [&](const QString& why) {
        if (error) *error = why;
        return false;
    };
    if (!m_graph || !m_layoutReady) return fail(tr("no graph is shown"));
    const QString suffix = QFileInfo(path).suffix().toLower();
    QByteArray bytes;
    if (suffix == QLatin1String("png")) {
        const QImage image = renderImage(2.0);
        if (image.isNull()) return fail(tr("nothing to draw"));
        QSaveFile f(path);
        if (!f.open(QIODevice::WriteOnly) || !image.save(&f, "PNG") || !f.commit())
            return fail(tr("cannot write %1").arg(path));
        return true;
    }
    if (suffix != QLatin1String("svg")) return fail(tr("%1: save as .png or .svg").arg(path));
    try {
        core::LayoutOptions o;
        o.horizontal = m_horizontal;
        o.fill = fillColors();
        o.title = m_title.toStdString();
        QApplication::setOverrideCursor(Qt::BusyCursor);
        const std::string svg = core::renderGraphView(m_view, "svg", o);
        QApplication::restoreOverrideCursor();
        bytes = QByteArray::fromStdString(svg);
    } catch (const std::exception& ex) {
        QApplication::restoreOverrideCursor();
        return fail(q(ex.what()));
    }
    QSaveFile f(path);
    if (!f.open(QIODevice::WriteOnly) || f.write(bytes) != bytes.size() || !f.commit())
        return fail(tr("cannot write %1").arg(path));
    return true;
}

void GraphView::exportDialog() {
    QString suggested = m_title;
    suggested.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9_.-]+")), QStringLiteral("_"));
    const QString path = QFileDialog::getSaveFileName(this, tr("Export graph"), suggested + ".png",
                                                      tr("PNG image (*.png);;SVG drawing (*.svg)"));
    if (path.isEmpty()) return;
    QString error;
    if (!exportTo(path, &error))
        QMessageBox::warning(this, tr("Cannot export"), error);
    else
        m_status->setText(tr("Saved %1").arg(path));
}

// ---- RunGraphView ---------------------------------------------------------------------------

RunGraphView::RunGraphView(QWidget* parent) : QWidget(parent) {
    m_pool.setMaxThreadCount(1);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_view = new GraphView(this);
    m_view->setObjectName(QStringLiteral("runGraphView"));
    layout->addWidget(m_view);
    m_view->showMessage(tr("Select a run to see its model's graph."));
}

RunGraphView::~RunGraphView() {
    ++m_generation;
    m_pool.waitForDone();
}

QString RunGraphView::tabTitle() const { return tr("Graph"); }
QString RunGraphView::tabToolTip() const {
    return tr("The first selected run's model as an op graph, coloured by profile time when profiled");
}

void RunGraphView::clear() {
    ++m_generation;
    m_pool.waitForDone();
    m_store = nullptr;
    m_wantedRun = m_runId = 0;
    m_view->clear();
    m_view->showMessage(tr("Select a run to see its model's graph."));
}

void RunGraphView::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    m_store = &store;
    m_wantedRun = runIds.empty() ? 0 : runIds.front();
    if (m_wantedRun == m_runId && !m_stale) return;
    if (isVisible())
        load();
    else
        m_stale = true;
}

void RunGraphView::onRunFinished(const core::Store& store, int64_t runId) {
    if (runId != m_wantedRun) return;
    m_store = &store;
    m_runId = 0;  // its model changed: the last checkpoint is new
    if (isVisible())
        load();
    else
        m_stale = true;
}

void RunGraphView::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    if (m_stale || m_wantedRun != m_runId) load();
}

void RunGraphView::load() {
    m_stale = false;
    const uint64_t generation = ++m_generation;
    m_runId = m_wantedRun;
    if (m_runId <= 0 || !m_store) {
        m_view->clear();
        m_view->showMessage(tr("Select a run to see its model's graph."));
        return;
    }
    const int64_t runId = m_runId;
    const core::Store* store = m_store;
    m_view->showMessage(tr("Reading the model of run %1…").arg(runId));
    struct Loaded {
        core::ModelGraph graph;
        std::vector<double> times;
        std::string error;
    };
    // The pool is waited for in clear() and the destructor, so the store outlives the task.
    m_pool.start([this, store, runId, generation] {
        if (m_generation.load() != generation) return;
        auto loaded = std::make_shared<Loaded>();
        QTemporaryDir dir;
        try {
            if (!dir.isValid()) throw std::runtime_error("cannot create a temporary directory");
            const std::string path = dir.filePath(QStringLiteral("model.pt")).toStdString();
            core::exportRunModel(*store, runId, path);
            loaded->graph = core::readTorchScriptGraph(path);
            loaded->graph.name = "run " + std::to_string(runId);
            if (store->profileSpanCount(runId) > 0)
                loaded->times = core::graphNodeTimes(loaded->graph, store->profileSpans(runId));
        } catch (const std::exception& ex) {
            loaded->error = ex.what();
        }
        QMetaObject::invokeMethod(
            this,
            [this, generation, loaded, runId] {
                if (generation != m_generation.load()) return;
                if (!loaded->error.empty()) {
                    m_view->clear();
                    m_view->showMessage(tr("No graph for run %1:\n%2").arg(runId).arg(q(loaded->error)));
                    return;
                }
                m_view->setGraph(std::move(loaded->graph), std::move(loaded->times));
            },
            Qt::QueuedConnection);
    });
}

}  // namespace lathe::widgets

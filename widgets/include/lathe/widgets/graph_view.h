#pragma once
// The Graph view (widgets/README.md): a model's op graph (core/model_graph.h) laid out by
// Graphviz off the GUI thread (core/graph_layout.h) and drawn with QGraphicsView — zoom, pan,
// fit; boxes coloured by op kind or, with a profile, by measured time (heat map); a click shows
// the node's attributes, shapes, parameters, FLOPs and time; search by name or op (Ctrl+F) with
// next/previous; module scopes collapse and expand (large graphs open collapsed); vertical or
// horizontal; export PNG or SVG. RunGraphView shows the selected run's model in a run tab.
#include <QElapsedTimer>
#include <QImage>
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lathe/core/graph_layout.h"
#include "lathe/core/model_graph.h"
#include "lathe/widgets/run_view.h"

class QGraphicsScene;
class QLabel;
class QLineEdit;
class QStackedWidget;
class QTextBrowser;
class QToolButton;

namespace lathe::widgets {

class GraphCanvas;
class GraphNodeItem;

class GraphView : public QWidget {
    Q_OBJECT
public:
    explicit GraphView(QWidget* parent = nullptr);
    ~GraphView() override;

    /// Reads a TorchScript (.pt) or ONNX (.onnx) file on a worker thread and shows it; a file it
    /// cannot read shows the reader's message (and emits loadFailed).
    void openFile(const QString& path, const QString& title = {});
    /// Shows a graph read elsewhere. `times`: per graph node, its measured time in ns (-1: none)
    /// from a profiled run; non-empty enables the heat map.
    void setGraph(core::ModelGraph graph, std::vector<double> times = {});
    /// Shows `text` instead of a graph ("Select a run…", an error).
    void showMessage(const QString& text);
    /// Forgets the graph and waits for work in flight.
    void clear();

    const core::ModelGraph* graph() const { return m_graph.get(); }
    /// Per graph node, the profile time in ns (-1: none); empty without a profile.
    const std::vector<double>& nodeTimes() const { return m_times; }
    bool hasLayout() const { return m_layoutReady; }
    int visibleBoxes() const { return static_cast<int>(m_view.nodes.size()); }
    const std::set<std::string>& collapsedScopes() const { return m_collapsed; }
    /// The graph node selected, -1 when none (or a collapsed scope is).
    int64_t selectedNode() const;
    /// The properties panel as plain text (what a click shows).
    QString propertiesText() const;
    QString statusText() const;

    /// Selects the next (or previous) node whose name or op contains `text` (case-insensitive),
    /// expanding the scopes that hide it; false when nothing matches.
    bool findNext(const QString& text, bool backwards = false);
    /// Selects a graph node and centres it (expanding scopes that hide it).
    void selectNode(int64_t graphNode);
    void expandScope(const QString& scope);
    void collapseScope(const QString& scope);
    void expandAll();
    void collapseAll();
    void setHorizontal(bool horizontal);
    bool horizontal() const { return m_horizontal; }
    void setHeatMap(bool on);
    bool heatMap() const { return m_heat; }
    void fitAll();
    void zoomBy(double factor);

    /// The whole graph as drawn, `scale` device pixels per point (capped at 16,384 pixels a side).
    QImage renderImage(double scale = 2.0) const;
    /// .png (what is drawn) or .svg (rendered by Graphviz with the same boxes and colours).
    bool exportTo(const QString& path, QString* error = nullptr);
    /// Seconds the last layout took (Graphviz) and the scene build after it.
    double lastLayoutSeconds() const { return m_layoutSeconds; }
    double lastSceneSeconds() const { return m_sceneSeconds; }
    GraphCanvas* canvas() const { return m_canvas; }

Q_SIGNALS:
    /// A layout is on screen: after a load, expand/collapse or orientation change.
    void layoutReady(int boxes, double seconds);
    void loadFailed(const QString& error);
    void selectionChanged(qint64 graphNode);

private:
    struct LayoutResult;
    /// Reads (`read`, on the worker thread), collapses by default and lays out a new graph.
    void startFresh(std::function<core::ModelGraph()> read, std::vector<double> times);
    void relayout();
    void applyLayout(uint64_t generation, const std::shared_ptr<LayoutResult>& result);
    void rebuildScene();
    void updateProperties();
    void updateToolbar();
    void exportDialog();
    void onItemActivated(int viewNode);
    void showContextMenu(int viewNode, const QPoint& globalPos);
    QColor fillOf(int viewNode) const;
    std::vector<std::string> fillColors() const;
    void revealAndSelect(int64_t graphNode);

    std::shared_ptr<const core::ModelGraph> m_graph;
    std::vector<double> m_times;      // per graph node, ns; empty: no profile
    std::vector<double> m_viewTimes;  // per view node: its ops' summed time, -1 when none timed
    double m_maxViewTime = 0;
    std::set<std::string> m_collapsed;
    bool m_horizontal = false;
    bool m_heat = false;
    core::GraphView m_view;
    core::GraphLayout m_layout;
    bool m_layoutReady = false;
    double m_layoutSeconds = 0, m_sceneSeconds = 0;
    int m_selectedView = -1;
    int64_t m_pendingSelect = -1;  // a graph node to select once the next layout is shown
    int m_busyCursors = 0;         // override cursors set by layouts not yet shown
    QString m_title;
    QString m_searchText;
    int64_t m_searchCursor = -1;

    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};

    QStackedWidget* m_stack = nullptr;
    QLabel* m_message = nullptr;
    QLabel* m_titleLabel = nullptr;
    QLabel* m_status = nullptr;
    GraphCanvas* m_canvas = nullptr;
    QGraphicsScene* m_scene = nullptr;
    std::vector<GraphNodeItem*> m_items;  // per view node
    QTextBrowser* m_properties = nullptr;
    QLineEdit* m_search = nullptr;
    QLabel* m_searchCount = nullptr;
    QToolButton* m_horizontalButton = nullptr;
    QToolButton* m_heatButton = nullptr;
    QToolButton* m_expandButton = nullptr;
    QToolButton* m_collapseButton = nullptr;
    QToolButton* m_exportButton = nullptr;

    friend class GraphNodeItem;
    friend class GraphCanvas;
};

/// The Graph tab under the runs table: the first selected run's model, exported from its last
/// checkpoint, with its profile's op times when the run was profiled. Loads when visible.
class RunGraphView : public QWidget, public RunView {
    Q_OBJECT
public:
    explicit RunGraphView(QWidget* parent = nullptr);
    ~RunGraphView() override;

    QWidget* widget() override { return this; }
    QString tabTitle() const override;
    QString tabToolTip() const override;
    void showRuns(const core::Store& store, const std::vector<int64_t>& runIds) override;
    void clear() override;
    void onRunFinished(const core::Store& store, int64_t runId) override;

    GraphView* graphView() const { return m_view; }
    int64_t runShown() const { return m_runId; }

protected:
    void showEvent(QShowEvent* event) override;

private:
    void load();

    GraphView* m_view = nullptr;
    const core::Store* m_store = nullptr;
    int64_t m_wantedRun = 0, m_runId = 0;
    bool m_stale = false;
    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};
};

}  // namespace lathe::widgets

#pragma once
// What of a model graph is shown, and where (core/src/graph/README.md): module scopes collapsed
// into one node each or expanded into a cluster, laid out by Graphviz's dot (libgvc) on plain
// data, and rendered to SVG or PNG. In liblathe_graph; thread-safe (layouts are serialised:
// Graphviz keeps global state), so the workbench runs it off the GUI thread.
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lathe/core/model_graph.h"
#include "lathe/core/profile_analysis.h"

namespace lathe::core {

/// One box on screen: a graph node, or a collapsed module scope standing for all its nodes.
struct ViewNode {
    int64_t node = -1;       // the graph node shown; -1 for a collapsed scope
    std::string scope;       // the collapsed scope's path; else the node's scope
    std::string label;       // the op ("conv2d"), the input's/output's name, or the scope's last part
    std::string detail;      // output shape; for a collapsed scope "12 ops"
    std::string category;    // the node's; "module" for a collapsed scope
    int64_t members = 1;     // graph nodes it stands for
    int64_t parameters = 0;  // summed over them
    double flops = 0;
    int cluster = -1;  // the innermost expanded scope's cluster holding it, -1: none
};

struct ViewEdge {
    int64_t from = 0, to = 0;  // ViewNode indices
    std::string label;         // the tensor's shape, "" when unknown or several
};

/// An expanded scope that holds shown nodes: drawn as a box around them.
struct ViewCluster {
    std::string scope;  // "layer1.0"
    std::string label;  // "layer1.0"'s last part, "0"; the whole path at the top level
    int parent = -1;    // enclosing cluster
};

struct GraphView {
    std::vector<ViewNode> nodes;
    std::vector<ViewEdge> edges;  // between different view nodes, once per pair
    std::vector<ViewCluster> clusters;
    std::vector<int64_t> viewOf;  // graph node id -> the view node showing it
};

/// Every module scope of the graph and its ancestors ("layer1", "layer1.0", "layer1.0.conv1").
std::set<std::string> graphScopes(const ModelGraph& graph);
/// The scopes to collapse so that about `maxVisible` boxes or fewer show: the deepest level of
/// scopes at which the graph fits (none when it fits expanded; the top-level scopes when nothing
/// smaller does).
std::set<std::string> defaultCollapsed(const ModelGraph& graph, size_t maxVisible = 300);
/// Expands `scope` one level: it opens, its child scopes stay closed.
void expandScope(const ModelGraph& graph, std::set<std::string>& collapsed, const std::string& scope);
/// Collapses `scope` (and forgets what was open inside it).
void collapseScope(std::set<std::string>& collapsed, const std::string& scope);

/// The view of `graph` with every scope in `collapsed` (or under one) as one box.
GraphView buildGraphView(const ModelGraph& graph, const std::set<std::string>& collapsed = {});

struct LayoutOptions {
    bool horizontal = false;        // ranks left to right instead of top to bottom
    std::vector<std::string> fill;  // render: per view node, a fill colour (#rrggbb) replacing the category's
    std::string title;              // render: the graph's label
};

struct NodeBox {
    double x = 0, y = 0;  // centre, points, y down, origin top left
    double w = 0, h = 0;
};

struct EdgePath {
    // A cubic B-spline as Graphviz routes it: p0, then (c1, c2, p) triples; the arrow's tip last.
    std::vector<std::pair<double, double>> points;
    std::pair<double, double> tip{0, 0};
    bool hasTip = false;
};

struct ClusterBox {
    double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

struct GraphLayout {
    double width = 0, height = 0;  // points
    std::vector<NodeBox> nodes;    // per view node
    std::vector<EdgePath> edges;   // per view edge
    std::vector<ClusterBox> clusters;
    double seconds = 0;  // wall time of the layout
};

/// Box size of a view node in points, from its label (what layout reserves and views draw).
std::pair<double, double> viewNodeSize(const ViewNode& node);

/// Lays out `view` with dot. Throws Error when Graphviz fails (its message).
GraphLayout layoutGraphView(const GraphView& view, const LayoutOptions& options = {});

/// The laid-out view rendered by Graphviz: "svg", "png" (cairo) or "dot" (with positions).
/// Throws Error for another format or when Graphviz fails.
std::string renderGraphView(const GraphView& view, const std::string& format,
                            const LayoutOptions& options = {});

/// Per graph node, the mean time (ns) its op took in a profiled run's forward passes, or -1 when
/// no span matched: the recorded steps' op spans inside the "forward" phase (nested ones too:
/// an exported graph's aten::addmm ran inside the aten::linear the trainer called), matched to
/// the graph's nodes in execution order by op name.
std::vector<double> graphNodeTimes(const ModelGraph& graph, const std::vector<ProfileSpan>& spans);

}  // namespace lathe::core

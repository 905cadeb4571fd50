// Layout and rendering of a graph view with Graphviz (graph_layout.h): the view becomes a cgraph
// graph (a nested cluster per expanded scope, fixed-size boxes sized like the workbench draws
// them), dot places it, and the positions come back as plain data, y down. Graphviz keeps global
// state, so one layout runs at a time.
#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "lathe/core/error.h"
#include "lathe/core/graph_layout.h"

namespace lathe::core {

namespace {

std::mutex& graphvizMutex() {
    static std::mutex m;
    return m;
}

// Graphviz's messages (agerr) collected instead of printed to stderr.
std::string& graphvizErrors() {
    static std::string errors;
    return errors;
}

int collectError(char* message) {
    auto& e = graphvizErrors();
    if (e.size() < 2000) e += message;
    return 0;
}

GVC_t* context() {
    // One context for the process (plugins load once); lives until exit.
    static GVC_t* gvc = [] {
        agseterrf(collectError);
        agseterr(AGERR);
        return gvContext();
    }();
    return gvc;
}

char* cs(const char* s) { return const_cast<char*>(s); }

void set(void* obj, const char* name, const std::string& value) {
    agsafeset(obj, cs(name), cs(value.c_str()), cs(""));
}

std::string inches(double points) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4f", points / 72.0);
    return b;
}

std::string htmlEscape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                if (static_cast<unsigned char>(c) >= 0x20) out += c;
        }
    }
    return out;
}

const char* fillOf(const ViewNode& n) {
    return n.category == "module" ? "#f2f2f2" : graphCategoryColor(n.category);
}

struct Built {
    Agraph_t* g = nullptr;
    std::vector<Agnode_t*> nodes;
    std::vector<Agedge_t*> edges;
    std::vector<Agraph_t*> clusters;
    ~Built() {
        if (g) {
            gvFreeLayout(context(), g);
            agclose(g);
        }
    }
};

// The view as a cgraph graph. `render`: labels, colours and fonts for Graphviz's own renderers;
// else only what placement needs.
void build(Built& b, const GraphView& v, const LayoutOptions& o, bool render) {
    b.g = agopen(cs("model"), Agdirected, nullptr);
    if (!b.g) throw Error("Graphviz could not create a graph");
    // Graph attributes' defaults (what clusters inherit) first: declaring one on the root also
    // sets the root's own value, which would wipe the title set below.
    agattr(b.g, AGRAPH, cs("label"), cs(""));
    if (render) {
        agattr(b.g, AGRAPH, cs("style"), cs("rounded"));
        agattr(b.g, AGRAPH, cs("color"), cs("#b0b0b0"));
        agattr(b.g, AGRAPH, cs("fontsize"), cs("9"));
        agattr(b.g, AGRAPH, cs("fontname"), cs("Helvetica"));
    }
    set(b.g, "rankdir", o.horizontal ? "LR" : "TB");
    set(b.g, "nodesep", "0.25");
    set(b.g, "ranksep", "0.35");
    // Large graphs: dot's x-coordinate pass (network simplex) is what grows fastest, 13 s of 15 on
    // 5,000 nodes with its default iteration limit; a tenth of it keeps the layout tidy
    // (tests/bench/README.md has the measurements). Past 8,000 boxes crossing minimisation
    // dominates; fewer passes of it.
    if (v.nodes.size() > 1500) {
        set(b.g, "nslimit", "0.1");
        set(b.g, "nslimit1", "0.1");
    }
    if (v.nodes.size() > 8000) set(b.g, "mclimit", "0.3");
    agattr(b.g, AGNODE, cs("shape"), cs("box"));
    agattr(b.g, AGNODE, cs("fixedsize"), cs("true"));
    agattr(b.g, AGNODE, cs("label"), cs(""));
    agattr(b.g, AGNODE, cs("width"), cs("0.75"));
    agattr(b.g, AGNODE, cs("height"), cs("0.5"));
    if (render) {
        set(b.g, "fontname", "Helvetica");
        set(b.g, "fontsize", "10");
        set(b.g, "bgcolor", "white");
        set(b.g, "pad", "0.2");
        if (!o.title.empty()) {
            set(b.g, "label", o.title);
            set(b.g, "labelloc", "t");
        }
        agattr(b.g, AGNODE, cs("style"), cs("rounded,filled"));
        agattr(b.g, AGNODE, cs("fillcolor"), cs("#e0e0e0"));
        agattr(b.g, AGNODE, cs("fontname"), cs("Helvetica"));
        agattr(b.g, AGNODE, cs("fontsize"), cs("10"));
        agattr(b.g, AGNODE, cs("penwidth"), cs("0.8"));
        agattr(b.g, AGEDGE, cs("arrowsize"), cs("0.6"));
        agattr(b.g, AGEDGE, cs("color"), cs("#707070"));
    }
    // Clusters (parents before children: buildGraphView creates them in that order).
    b.clusters.resize(v.clusters.size(), nullptr);
    for (size_t i = 0; i < v.clusters.size(); ++i) {
        const auto& c = v.clusters[i];
        Agraph_t* parent = c.parent >= 0 ? b.clusters[static_cast<size_t>(c.parent)] : b.g;
        const std::string name = "cluster_" + std::to_string(i);
        b.clusters[i] = agsubg(parent, cs(name.c_str()), 1);
        // A label reserves room at the cluster's top for the workbench to write the scope in.
        set(b.clusters[i], "label", c.label);
        set(b.clusters[i], "fontsize", "9");
        set(b.clusters[i], "margin", "6");
    }
    b.nodes.resize(v.nodes.size(), nullptr);
    for (size_t i = 0; i < v.nodes.size(); ++i) {
        const auto& n = v.nodes[i];
        Agraph_t* home = n.cluster >= 0 ? b.clusters[static_cast<size_t>(n.cluster)] : b.g;
        const std::string name = "n" + std::to_string(i);
        Agnode_t* node = agnode(home, cs(name.c_str()), 1);
        b.nodes[i] = node;
        const auto [w, h] = viewNodeSize(n);
        set(node, "width", inches(w));
        set(node, "height", inches(h));
        if (render) {
            // An HTML-like label: bold op, the shape under it.
            std::string label = "<b>" + htmlEscape(n.label) + "</b>";
            if (!n.detail.empty()) label += "<br/><font point-size=\"8\">" + htmlEscape(n.detail) + "</font>";
            agsafeset(node, cs("label"), agstrdup_html(b.g, cs(label.c_str())), cs(""));
            const std::string fill = i < o.fill.size() && !o.fill[i].empty() ? o.fill[i] : fillOf(n);
            set(node, "fillcolor", fill);
            set(node, "tooltip", n.scope.empty() ? n.label : n.scope);
            if (n.category == "module") set(node, "style", "rounded,filled,dashed");
        }
    }
    b.edges.resize(v.edges.size(), nullptr);
    for (size_t i = 0; i < v.edges.size(); ++i) {
        const auto& e = v.edges[i];
        b.edges[i] =
            agedge(b.g, b.nodes[static_cast<size_t>(e.from)], b.nodes[static_cast<size_t>(e.to)], nullptr, 1);
        if (render && !o.horizontal && !e.label.empty() && v.nodes.size() <= 400) {
            set(b.edges[i], "xlabel", e.label);
            set(b.edges[i], "fontsize", "7");
            set(b.edges[i], "fontname", "Helvetica");
            set(b.edges[i], "fontcolor", "#606060");
        }
    }
}

void runDot(Built& b) {
    graphvizErrors().clear();
    if (gvLayout(context(), b.g, "dot") != 0) {
        std::string why = graphvizErrors();
        throw Error("Graphviz could not lay the graph out" + (why.empty() ? std::string() : ": " + why));
    }
}

}  // namespace

GraphLayout layoutGraphView(const GraphView& v, const LayoutOptions& o) {
    const auto start = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(graphvizMutex());
    GraphLayout out;
    if (v.nodes.empty()) return out;
    Built b;
    build(b, v, o, false);
    runDot(b);
    const boxf bb = GD_bb(b.g);
    out.width = bb.UR.x - bb.LL.x;
    out.height = bb.UR.y - bb.LL.y;
    auto flip = [&](pointf p) { return std::pair<double, double>{p.x - bb.LL.x, bb.UR.y - p.y}; };
    out.nodes.reserve(b.nodes.size());
    for (Agnode_t* n : b.nodes) {
        NodeBox box;
        const auto c = flip(ND_coord(n));
        box.x = c.first;
        box.y = c.second;
        box.w = ND_width(n) * 72.0;
        box.h = ND_height(n) * 72.0;
        out.nodes.push_back(box);
    }
    out.edges.reserve(b.edges.size());
    for (Agedge_t* e : b.edges) {
        EdgePath path;
        const splines* spl = ED_spl(e);
        if (spl && spl->size > 0) {
            const bezier& bz = spl->list[0];
            path.points.reserve(bz.size);
            for (size_t k = 0; k < bz.size; ++k) path.points.push_back(flip(bz.list[k]));
            if (bz.eflag) {
                path.tip = flip(bz.ep);
                path.hasTip = true;
            }
        }
        out.edges.push_back(std::move(path));
    }
    out.clusters.reserve(b.clusters.size());
    for (Agraph_t* c : b.clusters) {
        const boxf cb = GD_bb(c);
        const auto a = flip(cb.LL), z = flip(cb.UR);
        out.clusters.push_back({a.first, z.second, z.first, a.second});
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
}

std::string renderGraphView(const GraphView& v, const std::string& format, const LayoutOptions& o) {
    if (format != "svg" && format != "png" && format != "dot")
        throw Error("cannot render a graph as " + format + ": one of svg, png, dot");
    std::lock_guard<std::mutex> lock(graphvizMutex());
    Built b;
    build(b, v, o, true);
    runDot(b);
    char* data = nullptr;
    unsigned int length = 0;
    graphvizErrors().clear();
    if (gvRenderData(context(), b.g, format == "dot" ? "dot" : format.c_str(), &data, &length) != 0 ||
        !data) {
        std::string why = graphvizErrors();
        if (data) gvFreeRenderData(data);
        throw Error("Graphviz could not render " + format +
                    (why.empty() ? std::string(" (is the libgvc6 plugin for it installed?)") : ": " + why));
    }
    std::string out(data, length);
    gvFreeRenderData(data);
    return out;
}

}  // namespace lathe::core
